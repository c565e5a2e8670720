"""The workspace's Squid reader distilled by the background scheduler (`train.reader_sets`): with the
real model on real files, gated on held-out files, distilled again only when a quarter of the files
changed, stopped between tasks with nothing saved, and picked up by the server's reader lookup."""

from __future__ import annotations

import shutil
import sysconfig
import threading
from pathlib import Path

import pytest

from context.config import SquidCacheConfig, SquidConfig, TrainConfig
from context.squid.reader import READER_FILE, reader_info
from feedback.train import reader_round
from feedback.train.reader_round import (
    ReaderRound,
    reader_due,
    run_reader_round,
    split_documents,
    workspace_reader,
)
from feedback.train.scheduler import IdleDetector, run_scheduler
from feedback.train.service import indexed_python
from feedback.train.squid_reader import ReaderSettings
from feedback.train.status import read_status, train_paths

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "colorsys.py", "glob.py", "calendar.py",
         "csv.py", "difflib.py", "enum.py", "fractions.py", "heapq.py")
SMALL = ReaderSettings(docs=3, doc_tokens=32, query_tokens=12, continuation=6, queries_per_set=2, sets=2,
                       epochs=1, learning_rate=2e-3, rank=4, alpha=8)


@pytest.fixture
def workspace(tmp_path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    for name in FILES:
        shutil.copy(STDLIB / name, folder / name)
    return folder


def _config(tmp_path, sets: int = 2, reader: str | None = None) -> SquidConfig:
    return SquidConfig(train=TrainConfig(dir=str(tmp_path / "train"), nice=0, reader_sets=sets),
                       squid=SquidCacheConfig(reader=reader))


def test_about_a_quarter_of_the_files_held_out_by_name_whatever_else_changes():
    docs = [(f"/ws/m{i}.py", [i]) for i in range(40)]
    train, held = split_documents(docs)
    assert 3 <= len(held) <= 20 and len(train) + len(held) == 40
    assert not {d[0] for d in held} & {d[0] for d in train}
    more = docs + [(f"/ws/new{i}.py", [i]) for i in range(20)]
    _, held_after = split_documents(more)
    assert {d[0] for d in held} <= {d[0] for d in held_after}  # a held-out file stays held out
    train, held = split_documents(docs[:6])
    assert len(held) == 3 and len(train) == 3
    assert split_documents(docs[:5]) == (docs[:5], [])  # too few to hold any out


def test_due_when_nothing_was_distilled_the_settings_changed_or_a_quarter_of_the_files(tmp_path):
    config, paths = _config(tmp_path), train_paths(_config(tmp_path))
    files = {f"/ws/m{i}.py": f"h{i}" for i in range(8)}
    assert reader_due(config, paths, files)
    reader_round._record(paths, reader_round._inputs(config, files))
    assert not reader_due(config, paths, files)
    assert not reader_due(config, paths, {**files, "/ws/m0.py": "changed"})  # 1 of 8
    assert not reader_due(config, paths, {**files, "/ws/m0.py": "x", "/ws/new.py": "y"})  # 2 of 9
    assert reader_due(config, paths, {**files, "/ws/m0.py": "x", "/ws/m1.py": "x", "/ws/m2.py": "x"})
    assert reader_due(_config(tmp_path, sets=5), paths, files)  # other settings


def test_the_workspace_reader_is_distilled_gated_kept_and_not_redone(runtime, workspace, tmp_path,
                                                                    monkeypatch, one_torch_thread):
    config = _config(tmp_path)
    paths = train_paths(config)
    assert workspace_reader(config) is None
    monkeypatch.setattr(reader_round, "MIN_GAIN", -10.0)  # kept unless it reads far worse
    result = run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[workspace],
                              runtime=runtime, settings=SMALL)
    assert result.state == "promoted", result.message
    assert result.held_out_kl > 0 and result.held_out_kl_reader > 0
    folder = workspace_reader(config)
    assert folder == paths.root / "reader" and reader_info(folder)["kind"] == "squid-reader"
    sources = reader_info(folder)["report"]["sources"]
    held = {name for name in FILES if str(workspace.resolve() / name) not in sources}
    assert all(Path(s).parent == workspace.resolve() for s in sources)
    # Two of these names hash into the lowest quarter: the three lowest are held out.
    assert held == set(sorted(FILES, key=lambda name: reader_round._rank(name, ()))[:3])
    assert runtime.adapter_id is None and not hasattr(runtime.model, "peft_config")
    status = read_status(paths.status)
    assert status["state"] == "promoted" and "held-out KL" in status["message"]
    written = (folder / READER_FILE).stat().st_mtime_ns

    # Nothing changed: nothing to do.
    assert run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[workspace],
                            runtime=runtime, settings=SMALL) is None
    # A quarter of the files changed: distilled again; this one is refused, the kept one stays.
    for name in FILES[:3]:
        (workspace / name).write_text((workspace / name).read_text() + "\n\nCHANGED = True\n")
    monkeypatch.setattr(reader_round, "MIN_GAIN", 1.0)  # no reader reads with a KL of 0
    result = run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[workspace],
                              runtime=runtime, settings=SMALL)
    assert result.state == "rejected" and result.held_out_kl_reader > 0
    assert (folder / READER_FILE).stat().st_mtime_ns == written
    assert not (paths.root / "reader.next").exists()
    # `squid.reader` names the reader the server reads through, whatever the scheduler made.
    assert workspace_reader(_config(tmp_path, reader=str(tmp_path / "mine"))) == tmp_path / "mine"
    assert workspace_reader(_config(tmp_path, sets=0)) is None


def test_a_stopped_distillation_saves_nothing_and_is_due_again(runtime, workspace, tmp_path,
                                                               one_torch_thread):
    config = _config(tmp_path)
    paths = train_paths(config)
    asked = []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > 3  # stops while the documents are encoded

    result = run_reader_round(config, paths=paths, should_stop=should_stop, roots=[workspace],
                              runtime=runtime, settings=SMALL)
    assert result.state == "stopped" and "next idle period" in result.message
    assert workspace_reader(config) is None and not (paths.root / "reader.next").exists()
    assert read_status(paths.status)["state"] == "stopped"
    assert runtime.adapter_id is None and not hasattr(runtime.model, "peft_config")
    assert reader_due(config, paths, indexed_python([workspace]))


def test_too_few_long_files_is_said_and_not_tried_again(runtime, tmp_path):
    folder = tmp_path / "ws"
    folder.mkdir()
    for name in FILES[:5]:
        shutil.copy(STDLIB / name, folder / name)
    config = _config(tmp_path)
    paths = train_paths(config)
    result = run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[folder], runtime=runtime,
                              settings=SMALL)
    assert result.state == "skipped" and "at least 6" in result.message
    assert read_status(paths.status)["state"] == "idle"
    assert run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[folder], runtime=runtime,
                            settings=SMALL) is None


def test_the_scheduler_distils_a_reader_only_when_it_has_nothing_new_to_train_on(tmp_path):
    config = _config(tmp_path)
    idle = IdleDetector(0.5, loadavg=lambda: (0.0, 0, 0), cores=2)
    rounds, readers = [], []

    class Round:
        def __call__(self, config, *, steps, paths, should_stop):
            rounds.append(steps)
            return type("R", (), {"state": "promoted"})()

    def reader_fn(config, *, paths, should_stop):
        readers.append(should_stop())
        return ReaderRound("promoted", "kept") if len(readers) == 1 else None

    done = run_scheduler(config, stop=threading.Event(), rounds=2, poll_s=0.01, idle=idle, round_fn=Round(),
                         inputs_fn=lambda c: "same", reader_fn=reader_fn)
    # The first pass trains (new inputs); the second has nothing new and distils; then none is due.
    assert done == 2 and rounds == [None] and readers == [False]


def test_a_failed_distillation_is_reported_and_the_trainer_goes_on(runtime, workspace, tmp_path, monkeypatch):
    from feedback.train import squid_reader

    def broken(*args, **kwargs):
        (tmp_path / "train" / "reader.next").mkdir(parents=True)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(squid_reader, "distil_reader", broken)
    config = _config(tmp_path)
    paths = train_paths(config)
    result = run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[workspace],
                              runtime=runtime, settings=SMALL)
    assert result.state == "failed" and "out of memory" in result.message
    status = read_status(paths.status)
    assert status["state"] == "error" and "out of memory" in status["message"]
    assert workspace_reader(config) is None and not (paths.root / "reader.next").exists()
    # Not tried again on the same files.
    assert run_reader_round(config, paths=paths, should_stop=lambda: False, roots=[workspace],
                            runtime=runtime, settings=SMALL) is None
