"""The feedback store's table of reference documents (Squid): once per content hash, read back with
the episodes that name them, shared with them once per collector, redacted again when the rules
change, and forgotten with the last episode that names them."""

from __future__ import annotations

import sqlite3

from feedback import store as store_module
from feedback.redact import RULES_VERSION
from feedback.store import REFERENCE_TABLE, SCHEMA_VERSION, SERVED_PROMPT_KEY, FeedbackStore

SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


def episode(i: int, ts: float, *hashes: str) -> dict:
    references = [{"hash": h, "path": f"/w/{h}.py", "tokens": 3} for h in hashes]
    return {"id": f"ep{i}", "kind": "completion", "ts": ts, "model_id": "m", "output": "x",
            "extra": {SERVED_PROMPT_KEY: {"ids": None, "references": references}}}


def document(digest: str, ts: float, text: str | None = None) -> dict:
    return {"hash": digest, "ts": ts, "text": text or f"# {digest}.py\nx = 1\n", "redacted": 0}


def test_each_episode_reads_the_texts_it_names(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    store.write([("episodes", episode(1, 100.0, "a", "b")), ("episodes", episode(2, 200.0, "b", "gone"))])
    store.write([(REFERENCE_TABLE, document("a", 100.0)), (REFERENCE_TABLE, document("b", 100.0))])
    # Once per hash: the second write of a text is ignored.
    store.write([(REFERENCE_TABLE, document("b", 200.0, "other"))])
    first, second = store.episodes_with_outcomes()
    assert first.reference_texts == {"a": "# a.py\nx = 1\n", "b": "# b.py\nx = 1\n"}
    assert second.reference_texts == {"b": "# b.py\nx = 1\n"}  # "gone" was never stored


def test_reference_documents_go_with_shared_episodes_once_per_collector(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    store.write([("episodes", episode(1, 100.0, "a")), (REFERENCE_TABLE, document("a", 100.0))], share=True)
    store.write([("episodes", episode(2, 100.0, "p")), (REFERENCE_TABLE, document("p", 100.0))])  # private
    batch = store.outbox_batch(10, "team-1")
    assert [(item["table"], item["id"]) for item in batch] == [("episodes", "ep1"), (REFERENCE_TABLE, "a")]
    # Sent by its hash, with its redacted text and whether redaction changed it: nothing else.
    assert batch[1]["row"] == {"id": "a", "ts": 100.0, "text": "# a.py\nx = 1\n", "redacted": 0}
    store.outbox_delivered([item["id"] for item in batch], "team-1")
    assert store.outbox_size() == 0
    # A later shared episode naming it: the collector that has the document does not get it again.
    store.write([("episodes", episode(3, 200.0, "a")), (REFERENCE_TABLE, document("a", 200.0))], share=True)
    assert [item["id"] for item in store.outbox_batch(10, "team-1")] == ["ep3"]
    assert store.outbox_size() == 1  # the document's entry is settled, the episode waits for its answer
    # Another collector (a new endpoint or token: another team) has not got it.
    store.write([("episodes", episode(4, 300.0, "a")), (REFERENCE_TABLE, document("a", 300.0))], share=True)
    assert [item["id"] for item in store.outbox_batch(10, "team-2")] == ["ep3", "ep4", "a"]
    # A failed or dropped batch marks nothing delivered.
    store.outbox_remove(["ep3", "ep4", "a"])
    store.write([("episodes", episode(5, 400.0, "a")), (REFERENCE_TABLE, document("a", 400.0))], share=True)
    assert [item["id"] for item in store.outbox_batch(10, "team-2")] == ["ep5", "a"]
    # A document gone while queued (its episodes forgotten) is not sent, and leaves the outbox.
    store.db.execute(f"DELETE FROM {REFERENCE_TABLE}")
    store.db.conn.commit()
    assert [item["id"] for item in store.outbox_batch(10, "team-2")] == ["ep5"]
    assert store.outbox_size() == 1


def test_forgetting_an_episode_forgets_the_documents_only_it_named(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    store.write([("episodes", episode(1, 100.0, "a", "shared")),
                 ("episodes", episode(2, 200.0, "shared", "b")),
                 ("episodes", {**episode(3, 50.0), "extra": None})])
    store.write([(REFERENCE_TABLE, document(h, 100.0)) for h in ("a", "shared", "b", "orphan")])
    deleted = store.forget(since=150.0)
    assert deleted[REFERENCE_TABLE] == 2  # "b" and "orphan": no episode left names them
    remaining = {row["hash"] for row in store.rows(REFERENCE_TABLE)}
    assert remaining == {"a", "shared"}
    store.forget()
    assert store.count(REFERENCE_TABLE) == 0


def test_an_old_store_gets_the_table_and_a_new_rule_redacts_its_texts(tmp_path, monkeypatch):
    path = tmp_path / "f.db"
    connection = sqlite3.connect(path)
    for statement in store_module._MIGRATIONS[0]:
        connection.execute(statement)
    connection.execute("PRAGMA user_version = 1")
    connection.commit()
    connection.close()
    store = FeedbackStore(path)
    assert store.schema_version() == SCHEMA_VERSION == 3 and REFERENCE_TABLE in store.db.table_names()
    # A raw write (a test double for a text a later rule catches) stays until the rules change.
    store.write([(REFERENCE_TABLE, document("a", 1.0, f'KEY = "{SECRET}"\n'))])
    store.close()
    monkeypatch.setattr(store_module, "RULES_VERSION", RULES_VERSION + 1)
    store = FeedbackStore(path)
    ((text, redacted),) = store.db.execute(f"SELECT text, redacted FROM {REFERENCE_TABLE}").fetchall()
    assert SECRET not in text and "[REDACTED" in text and redacted == 1
    store.close()
    assert SECRET.encode() not in path.read_bytes()


def _record(tmp_path, storage: str) -> FeedbackStore:
    from context.config import FeedbackConfig
    from context.prompt_record import ReferenceIdentity, ServedPrompt
    from feedback.recorder import FeedbackRecorder

    references = (ReferenceIdentity("h1", "/w/a.py", 4, "A = 1\n"),
                  ReferenceIdentity("h2", "/w/keys.py", 9, f'KEY = "{SECRET}"\n'))
    served = ServedPrompt(ids=(1, 2), text="x = ", references=references, reference_tokens=20)
    recorder = FeedbackRecorder(FeedbackConfig(storage=storage), db_path=tmp_path / "f.db")
    for _ in range(2):  # the same documents twice: stored once
        recorder.record_completion_episode(uri="file:///w/b.py", position=(0, 4), output="2", served=served,
                                           model_id="m")
    assert recorder.flush()
    recorder.close()
    return FeedbackStore(tmp_path / "f.db")


def test_the_recorder_keeps_reference_texts_redacted_and_only_where_code_is_kept(tmp_path):
    store = _record(tmp_path / "full", "full")
    rows = {row["hash"]: row for row in store.rows(REFERENCE_TABLE)}
    assert set(rows) == {"h1", "h2"} and rows["h1"]["text"] == "A = 1\n" and rows["h1"]["redacted"] == 0
    assert SECRET not in rows["h2"]["text"] and "[REDACTED" in rows["h2"]["text"]
    assert rows["h2"]["redacted"] == 1
    first, second = store.episodes_with_outcomes()
    assert first.reference_texts == second.reference_texts == {h: row["text"] for h, row in rows.items()}
    store.close()
    assert SECRET.encode() not in (tmp_path / "full" / "f.db").read_bytes()

    hashed = _record(tmp_path / "hashed", "hashed")
    assert hashed.count("episodes") == 2 and hashed.count(REFERENCE_TABLE) == 0
