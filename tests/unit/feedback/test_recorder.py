"""The recorder: episodes, acceptance and dismissal, outcomes on a test clock, privacy, faults."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from context.config import FeedbackConfig
from feedback import recorder as recorder_module
from feedback.recorder import FeedbackRecorder
from feedback.store import FeedbackStore
from feedback.tracking import TextChange

URI = "file:///w/calc.py"
SECRET = "ghp_" + "Zq8Xw2Lm4Nv6Bp1Cr3Ds5Et7Fu9Gh0Ji2Kk4"
PROMPT = f'TOKEN = "{SECRET}"\ndef add(a, b):\n    '
BEFORE = "TOKEN = 1\ndef add(a, b):\n    \n"
OUTPUT = "return a + b"
AFTER = "TOKEN = 1\ndef add(a, b):\n    return a + b\n"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(tmp_path: Path, clock: Clock, **config) -> FeedbackRecorder:
    settings = {"checkpoints_s": (30.0, 120.0), "dismiss_after_s": 10.0, **config}
    return FeedbackRecorder(FeedbackConfig(**settings), db_path=tmp_path / "f.db", monotonic=clock)


def show(recorder: FeedbackRecorder, output: str = OUTPUT, uri: str = URI) -> str:
    return recorder.record_completion_episode(
        uri=uri, position=(2, 4), output=output, prompt_text=PROMPT, model_id="m1", language="python"
    )


def episodes(path: Path):
    store = FeedbackStore(path)
    try:
        return list(store.episodes_with_outcomes())
    finally:
        store.close()


def test_accepted_completion_gets_an_outcome_at_each_checkpoint(tmp_path, clock):
    recorder = make(tmp_path, clock)
    episode_id = show(recorder)
    recorder.on_did_change(URI, [TextChange((2, 4), (2, 4), OUTPUT)], AFTER)
    assert recorder.accept_completion(episode_id, None, AFTER)
    clock.now += 31
    recorder.tick()
    edited = AFTER.replace("a + b", "a + c")
    recorder.on_did_change(URI, [TextChange((2, 15), (2, 16), "c")], edited)
    clock.now += 100
    recorder.tick()
    assert recorder.flush()
    (item,) = episodes(recorder.db_path)
    assert [e["kind"] for e in item.events] == ["shown", "accepted"]
    assert [(o["checkpoint_s"], o["status"], o["kept_text"]) for o in item.outcomes] == [
        (30.0, "unchanged", OUTPUT),
        (120.0, "mostly_unchanged", "return a + c"),
    ]
    assert item.episode["prompt_text"].startswith('TOKEN = "[REDACTED:github_token]"')
    assert item.episode["extra"]["position"] == [2, 4]
    recorder.close()


def test_partial_accept_tracks_only_the_accepted_part(tmp_path, clock):
    recorder = make(tmp_path, clock)
    episode_id = show(recorder)
    partial = "TOKEN = 1\ndef add(a, b):\n    return\n"
    recorder.accept_completion(episode_id, "return", partial)
    (region,) = recorder.tracker.tracked(URI)
    assert region.new_text == "return"
    recorder.flush()
    (item,) = episodes(recorder.db_path)
    assert item.events[-1]["kind"] == "partially_accepted"
    recorder.close()


def test_dismissal_by_supersede_and_by_timeout(tmp_path, clock):
    recorder = make(tmp_path, clock)
    first = show(recorder)
    second = show(recorder, "return b + a")
    clock.now += 11
    recorder.tick()
    recorder.flush()
    kinds = {
        item.episode["id"]: [(e["kind"], (e["data"] or {}).get("reason")) for e in item.events]
        for item in episodes(recorder.db_path)
    }
    assert kinds[first] == [("shown", None), ("dismissed", "superseded")]
    assert kinds[second] == [("shown", None), ("dismissed", "timeout")]
    recorder.close()


def test_a_next_edit_is_its_own_episode_beside_a_completion_and_is_followed_as_a_replacement(tmp_path, clock):
    from feedback.train.store_source import episode_as_example_fields

    recorder = make(tmp_path, clock)
    before = "def f(total):\n    return total\n"
    completion = show(recorder)
    offer = dict(uri=URI, position=(1, 11), output="subtotal", model_id="squidcode.next_edit.deterministic",
                 kind="next_edit", replaces="total")
    episode_id = recorder.record_completion_episode(**offer)
    assert recorder.record_completion_episode(**offer) == episode_id  # asked again: the same episode
    assert recorder.episode_uri(completion) == URI  # a next edit does not supersede a completion
    after = before.replace("return total", "return subtotal")
    recorder.on_did_change(URI, [TextChange((1, 11), (1, 16), "subtotal")], after)
    assert recorder.accept_completion(episode_id, None, after)
    clock.now += 31
    recorder.tick()
    assert recorder.flush()
    items = {item.episode["id"]: item for item in episodes(recorder.db_path)}
    edit = items[episode_id]
    assert edit.episode["kind"] == "next_edit" and edit.episode["extra"]["replaces"] == "total"
    assert [e["kind"] for e in edit.events] == ["shown", "accepted"]
    assert [(o["status"], o["kept_text"]) for o in edit.outcomes] == [("unchanged", "subtotal")]
    # The completion beside it was left to time out, never superseded by the next edit.
    assert [(e["kind"], (e["data"] or {}).get("reason")) for e in items[completion].events] == [
        ("shown", None), ("dismissed", "timeout")]
    # The deterministic path's suggestions are not training examples (no model answered them).
    assert episode_as_example_fields(edit) is None
    recorder.close()


def test_a_completion_a_server_answered_is_recorded_but_not_trained_on(tmp_path, clock):
    from feedback.train.store_source import episode_as_example_fields

    recorder = make(tmp_path, clock)
    ids = {}
    for served_by, uri in (("local", URI), ("llama-server:qwen", URI.replace(".py", "_2.py"))):
        ids[served_by] = recorder.record_completion_episode(
            uri=uri, position=(2, 4), output=OUTPUT, prompt_text=PROMPT, model_id="m1", language="python",
            extra={"served_by": served_by})
        recorder.on_did_change(uri, [TextChange((2, 4), (2, 4), OUTPUT)], AFTER)
        assert recorder.accept_completion(ids[served_by], None, AFTER)
    clock.now += 200
    recorder.tick()
    assert recorder.flush()
    items = {item.episode["id"]: item for item in episodes(recorder.db_path)}
    served = items[ids["llama-server:qwen"]]
    assert served.accepted and served.final_outcomes()[-1]["status"] == "unchanged"  # recorded as kept
    assert episode_as_example_fields(served) is None  # the local model did not answer it
    assert episode_as_example_fields(items[ids["local"]])["kept_text"].endswith(OUTPUT)
    recorder.close()


def test_a_model_switch_right_after_an_output_is_recorded(tmp_path, clock):
    recorder = make(tmp_path, clock)
    recorder.note_model("m1")
    episode_id = show(recorder)
    clock.now += 4
    recorder.note_model("m2")
    recorder.note_model("m2")  # no change, no row
    recorder.flush()
    store = FeedbackStore(recorder.db_path)
    (switch,) = store.rows("model_switches")
    assert (switch["from_model"], switch["to_model"], switch["last_episode_id"]) == ("m1", "m2", episode_id)
    assert switch["seconds_after_output"] == pytest.approx(4.0)
    recorder.close()


def test_sessions_know_the_gap_since_the_previous_one(tmp_path, clock):
    wall = [1_000_000.0]
    first = FeedbackRecorder(FeedbackConfig(), db_path=tmp_path / "f.db", clock=lambda: wall[0])
    first.close()
    wall[0] += 2 * 86400
    second = FeedbackRecorder(FeedbackConfig(), db_path=tmp_path / "f.db", clock=lambda: wall[0])
    second.close()
    store = FeedbackStore(tmp_path / "f.db")
    gaps = [s["days_since_previous"] for s in store.rows("sessions")]
    assert gaps == [None, 2.0]


def test_agent_episode_with_candidates_and_an_applied_edit(tmp_path, clock):
    recorder = make(tmp_path, clock)
    candidates = [
        {"diff": "-x\n+y", "verified": False, "checks": {"lint": False}, "logprob": -3.5},
        {"diff": "-x\n+z", "verified": True, "checks": {"lint": True}, "logprob": -2.0},
    ]
    episode_id = recorder.record_agent_episode(
        "rename x",
        "m1",
        "adapter-7",
        [{"uri": URI, "hash": "abc"}],
        candidates,
        1,
        "SYSTEM\nrename x",
        uri=URI,
    )
    before, after = "x = 1\nprint(x)\n", "z = 1\nprint(x)\n"
    assert recorder.track_applied_edit(episode_id, URI, ((0, 0), (0, 1)), "z", "x", document_text=after)
    recorder.on_did_change(URI, [TextChange((0, 0), (0, 1), "x")], before)  # the user undoes it
    clock.now += 200
    recorder.tick()
    recorder.flush()
    (item,) = episodes(recorder.db_path)
    assert item.episode["kind"] == "agent" and item.episode["chosen"] == 1
    assert item.episode["output"] == "-x\n+z" and item.episode["adapter_id"] == "adapter-7"
    assert [c["logprob"] for c in item.episode["candidates"]] == [-3.5, -2.0]
    assert [o["status"] for o in item.outcomes] == ["reverted", "reverted"]
    assert item.reverted
    recorder.close()


@pytest.mark.parametrize("mode", ["full", "hashed", "none"])
def test_an_agent_steps_texts_are_redacted_and_follow_the_storage_mode(tmp_path, clock, mode):
    recorder = make(tmp_path, clock, storage=mode)
    steps = [
        {"tool": "search", "args": {"query": f"token {SECRET}", "limit": 5}, "ok": True},
        {"tool": "edit", "args": {"path": "a.py", "blocks": [f'key = "{SECRET}"', "x = 1"]}, "ok": False,
         "error": f"could not parse {SECRET}", "answer": f"```edit a.py\nkey = '{SECRET}'"},
    ]
    recorder.record_agent_episode("fix it", "m1", None, [], [], None, "SYSTEM", uri=URI, steps=steps)
    recorder.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    assert SECRET.encode() not in raw and b"ghp_" not in raw
    (item,) = episodes(recorder.db_path)
    search, edit = item.episode["extra"]["steps"]
    assert (search["tool"], search["ok"], search["args"]["limit"]) == ("search", True, 5)
    assert (edit["tool"], edit["ok"]) == ("edit", False)
    if mode == "full":  # the code is kept, the secret is not
        assert search["args"]["query"].startswith("token ") and edit["args"]["blocks"][1] == "x = 1"
        assert edit["args"]["path"] == "a.py" and "could not parse" in edit["error"]
    else:  # no code on disk: a hash (hashed) or nothing (none) in its place
        assert "x = 1" not in str(edit) and "could not parse" not in str(edit)
        assert (edit["args"]["path"] is None) == (mode == "none")


@pytest.mark.parametrize("mode", ["hashed", "none"])
def test_storage_modes_keep_no_code_on_disk(tmp_path, clock, mode):
    recorder = make(tmp_path, clock, storage=mode)
    episode_id = show(recorder)
    recorder.accept_completion(episode_id, None, AFTER)
    clock.now += 200
    recorder.tick()
    recorder.close()
    (item,) = episodes(recorder.db_path)
    assert item.episode["prompt_text"] is None and item.episode["output"] is None
    assert all(o["kept_text"] is None for o in item.outcomes)
    assert (item.episode["output_hash"] is not None) == (mode == "hashed")
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    assert b"a + b" not in raw


def test_secrets_never_reach_the_files(tmp_path, clock):
    recorder = make(tmp_path, clock)
    show(recorder, output=f'key = "{SECRET}"')
    recorder.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    assert SECRET.encode() not in raw and b"ghp_" not in raw


def test_recording_off_writes_nothing_and_the_choice_outlives_a_restart(tmp_path, clock):
    recorder = make(tmp_path, clock)
    recorder.set_record(False)
    assert show(recorder) is None
    recorder.close()
    again = make(tmp_path, clock)  # config says record=true; the user's choice wins
    assert again.config.record is False and show(again) is None
    again.close()
    assert all(item.episode is None for item in episodes(tmp_path / "f.db"))  # no episodes at all


class QueryOnlyStore(FeedbackStore):
    """A real store on which SQLite refuses writes (what a read-only file does to a non-root user)."""

    def __init__(self, path, **kwargs):
        super().__init__(path, **kwargs)
        self.db.execute("PRAGMA query_only = ON")


def test_an_unwritable_store_is_logged_and_never_blocks(tmp_path, clock, caplog):
    recorder = FeedbackRecorder(
        FeedbackConfig(), db_path=tmp_path / "f.db", monotonic=clock, store_factory=QueryOnlyStore
    )
    started = time.perf_counter()
    for _ in range(200):
        show(recorder)
    assert time.perf_counter() - started < 0.5
    with caplog.at_level(logging.WARNING):
        assert not recorder.flush(timeout=0.5)
    assert "read-only" in (recorder.status()["error"] or "")
    assert recorder.pending() >= 200
    recorder._stopping.set()


def test_a_full_disk_keeps_rows_in_memory_up_to_a_bound(tmp_path, clock, monkeypatch):
    monkeypatch.setattr(recorder_module, "MAX_PENDING_ROWS", 50)

    class FullDiskStore(FeedbackStore):
        def __init__(self, path, **kwargs):
            super().__init__(path, **kwargs)
            pages = self.db.execute("PRAGMA page_count").fetchone()[0]
            self.db.execute(f"PRAGMA max_page_count = {pages}")

    recorder = FeedbackRecorder(
        FeedbackConfig(), db_path=tmp_path / "f.db", monotonic=clock, store_factory=FullDiskStore
    )
    for i in range(200):
        show(recorder, output="x" * 2000 + str(i))
    deadline = time.monotonic() + 10
    while recorder.pending() > 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "disk is full" in recorder.status()["error"]
    # 400 rows queued (shown episode + event each), the newest 50 kept for when space returns.
    assert recorder.dropped >= 350 and recorder.pending() <= 50
    recorder._stopping.set()


def test_a_locked_store_is_retried_until_it_frees(tmp_path, clock):
    path = tmp_path / "f.db"
    FeedbackStore(path).close()
    locker = sqlite3.connect(path, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")
    recorder = FeedbackRecorder(
        FeedbackConfig(),
        db_path=path,
        monotonic=clock,
        store_factory=lambda p: FeedbackStore(p, timeout_s=0.05),
    )
    episode_id = show(recorder)
    assert not recorder.flush(timeout=0.5)
    threading.Timer(0.1, locker.rollback).start()
    assert recorder.flush(timeout=10)
    assert [item.episode["id"] for item in episodes(path)] == [episode_id]
    recorder.close()
    locker.close()


def test_status_before_the_schema_exists_has_no_counts_and_no_error(tmp_path, clock):
    path = tmp_path / "f.db"
    sqlite3.connect(path).close()  # the file exists, its tables not yet (the writer is starting)
    starting = threading.Event()

    def slow_writer(p):  # the writer thread creates the tables only after the status was read
        starting.wait(10)
        return QueryOnlyStore(p)

    recorder = FeedbackRecorder(FeedbackConfig(), db_path=path, monotonic=clock, store_factory=slow_writer)
    try:
        status = recorder.status()
    finally:
        starting.set()
    assert status["record"] is True and status["episodes"] is None
    recorder._stopping.set()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_store_file_deleted_or_replaced_while_recording_gets_a_new_file(tmp_path, clock, caplog, how):
    path = tmp_path / "f.db"
    recorder = make(tmp_path, clock)
    first = show(recorder)
    assert recorder.flush(timeout=10)
    if how == "deleted":
        for name in ("f.db", "f.db-wal", "f.db-shm"):  # what `rm ~/.local/share/.../feedback.db*` does
            (tmp_path / name).unlink(missing_ok=True)
    else:  # an older copy moved over it (a restore)
        other = tmp_path / "restored.db"
        FeedbackStore(other).close()
        other.replace(path)
    with caplog.at_level(logging.WARNING, logger="feedback.recorder"):
        second = show(recorder)
        assert recorder.flush(timeout=10)
    assert "deleted or replaced" in caplog.text
    # The new row is in the file at the path, not in an unlinked inode; the session goes on there.
    assert [item.episode["id"] for item in episodes(path)] == [second]
    store = FeedbackStore(path)
    try:
        assert [row["id"] for row in store.rows("sessions")] == [recorder.session_id]
    finally:
        store.close()
    assert recorder.status()["episodes"] == 1 and recorder.status()["error"] is None
    recorder.close()
    assert first != second


def test_lone_surrogates_in_any_column_are_stored_and_the_writer_keeps_going(tmp_path, clock):
    recorder = make(tmp_path, clock)
    broken = recorder.record_completion_episode(
        uri="file:///w/a\ud800.py", position=(0, 0), output="x\udcff", prompt_text="y\udcff",
        model_id="m\ud800", language="python",
    )
    assert recorder.flush(timeout=10) and recorder.status()["error"] is None
    after = show(recorder)
    assert recorder.flush(timeout=10)
    stored = {item.episode["id"]: item.episode for item in episodes(tmp_path / "f.db")}
    assert set(stored) == {broken, after}
    assert stored[broken]["uri"] == "file:///w/a\ufffd.py" and stored[broken]["model_id"] == "m\ufffd"
    recorder.close()
