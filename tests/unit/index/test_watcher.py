"""The watcher on real files and a real watchdog observer: creations, edits, deletions and moves
reach the index, VCS and cache churn does not, bursts are coalesced, editor notifications feed the
same queue, and a save is searchable quickly (the measured p50/p95 are printed)."""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from context.index.indexer import Indexer
from context.index.store import IndexStore
from context.index.types import IndexReport
from context.index.watcher import IndexWatcher, prunes_ignored_folders

BASE = {
    "pkg/__init__.py": "",
    "pkg/urls.py": "def url_split(address):\n    return address.partition('://')\n",
    "pkg/maths.py": "def add_numbers(a, b):\n    return a + b\n",
    ".gitignore": "skipme/\n",
}


class Batches:
    """Collects the watcher's batch reports and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.reports: list[IndexReport] = []
        self.event = threading.Event()

    def __call__(self, report: IndexReport) -> None:
        self.reports.append(report)
        self.event.set()


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def symbol_names(store: IndexStore) -> set[str]:
    return {s.qualname for s in store.all_symbols()}


def rels(store: IndexStore) -> set[str]:
    return {f.rel for f in store.all_files()}


@pytest.fixture
def ws(tmp_path) -> Path:
    root = tmp_path / "ws"
    for rel, text in BASE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def setup(ws, tmp_path):
    store = IndexStore(tmp_path / "db" / "index.sqlite3")
    indexer = Indexer([ws], store)
    indexer.index_all()
    batches = Batches()
    watcher = IndexWatcher(indexer, debounce_s=0.05, on_batch=batches)
    watcher.start()
    yield ws, store, watcher, batches
    watcher.stop()
    store.close()


def test_create_modify_delete_reach_the_index(setup):
    ws, store, watcher, batches = setup
    (ws / "pkg/fresh.py").write_text("def freshly_created():\n    pass\n", encoding="utf-8")
    assert wait_for(lambda: "freshly_created" in symbol_names(store))
    (ws / "pkg/maths.py").write_text("def multiply(a, b):\n    return a * b\n", encoding="utf-8")
    assert wait_for(lambda: "multiply" in symbol_names(store))
    assert "add_numbers" not in symbol_names(store)
    (ws / "pkg/fresh.py").unlink()
    assert wait_for(lambda: "pkg/fresh.py" not in rels(store))
    assert watcher.wait_idle(10)
    assert sum(r.parsed for r in batches.reports) >= 2 and sum(r.removed for r in batches.reports) >= 1
    assert store.integrity_problems() == []


def test_move_keeps_rows_and_folder_moves_and_deletes(setup):
    ws, store, watcher, batches = setup
    (ws / "pkg/urls.py").rename(ws / "pkg/addresses.py")
    assert wait_for(lambda: rels(store) >= {"pkg/addresses.py"} and "pkg/urls.py" not in rels(store))
    assert watcher.wait_idle(10)
    assert sum(r.parsed for r in batches.reports) == 0  # renamed, not re-parsed
    (ws / "pkg").rename(ws / "lib")
    assert wait_for(lambda: {"lib/addresses.py", "lib/maths.py"} <= rels(store)
                    and not any(r.startswith("pkg/") for r in rels(store)))
    assert [s.rel for s in store.symbols_named(["url_split"], 5)] == ["lib/addresses.py"]
    shutil.rmtree(ws / "lib")
    assert wait_for(lambda: rels(store) == {".gitignore"})
    assert store.integrity_problems() == []


def test_vcs_and_cache_churn_never_reaches_the_indexer(setup):
    ws, store, watcher, batches = setup
    for folder in (".git/objects/ab", "pkg/__pycache__", "node_modules/x"):
        (ws / folder).mkdir(parents=True)
        (ws / folder / "churn.py").write_text("def churn():\n    pass\n", encoding="utf-8")
    time.sleep(0.3)
    assert watcher.wait_idle(10)
    assert batches.reports == [] and "churn" not in symbol_names(store)
    # A .gitignore'd file does reach the indexer, which classifies it and leaves it out.
    (ws / "skipme").mkdir()
    (ws / "skipme/hidden.py").write_text("def hidden():\n    pass\n", encoding="utf-8")
    assert wait_for(lambda: batches.reports != [])
    assert watcher.wait_idle(10)
    assert "hidden" not in symbol_names(store)


def inotify_watches() -> int:
    """Kernel inotify watches held by this process, counted from /proc (Linux)."""
    count = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            count += Path(f"/proc/self/fdinfo/{fd}").read_text().count("inotify wd:")
        except OSError:
            continue
    return count


@pytest.mark.skipif(not prunes_ignored_folders(),
                    reason="pruning needs Linux's inotify and a watchdog in PRUNING_TESTED_WATCHDOG")
def test_ignored_folders_get_no_inotify_watch(tmp_path):
    """`.git` and `node_modules` hold most of a project's directories; none of them is watched."""
    root = tmp_path / "ws"
    for i in range(200):
        (root / ".git" / "objects" / f"{i:02x}").mkdir(parents=True)
        (root / "node_modules" / f"dep{i}" / "lib").mkdir(parents=True)
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "sub" / "mod.py").write_text("def existing():\n    pass\n", encoding="utf-8")
    with IndexStore(tmp_path / "db.sqlite3") as store:
        indexer = Indexer([root], store)
        indexer.index_all()
        before = inotify_watches()
        with IndexWatcher(indexer, debounce_s=0.01):
            assert wait_for(lambda: inotify_watches() - before == 3)  # ws, pkg, pkg/sub
            time.sleep(0.2)
            assert inotify_watches() - before == 3
            # Folders created later: a plain one is watched (and its files indexed), one below
            # a new node_modules is not.
            (root / "pkg" / "fresh").mkdir()
            (root / "vendor" / "node_modules" / "left-pad").mkdir(parents=True)
            (root / "pkg" / "fresh" / "new.py").write_text("def created_later():\n    pass\n")
            assert wait_for(lambda: "created_later" in symbol_names(store))
            assert wait_for(lambda: inotify_watches() - before == 5)  # + pkg/fresh, vendor
            time.sleep(0.2)
            assert inotify_watches() - before == 5
        assert wait_for(lambda: inotify_watches() == before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify watches are a Linux resource")
def test_an_untested_watchdog_release_gets_the_plain_observer(tmp_path, monkeypatch, caplog):
    """Outside the releases the pruning was tested with, watchdog's own observer watches everything
    (ignored folders included) and changes still reach the index."""
    monkeypatch.setattr("context.index.watcher.PRUNING_TESTED_WATCHDOG", frozenset())
    assert not prunes_ignored_folders()
    root = tmp_path / "ws"
    for i in range(5):
        (root / "node_modules" / f"dep{i}").mkdir(parents=True)
    (root / "pkg").mkdir()
    with IndexStore(tmp_path / "db.sqlite3") as store:
        indexer = Indexer([root], store)
        indexer.index_all()
        before = inotify_watches()
        with caplog.at_level(logging.INFO, logger="context.index.watcher"), \
                IndexWatcher(indexer, debounce_s=0.01):
            assert wait_for(lambda: inotify_watches() - before == 8)  # ws, pkg, node_modules + 5 deps
            (root / "pkg" / "mod.py").write_text("def seen_unpruned():\n    pass\n", encoding="utf-8")
            assert wait_for(lambda: "seen_unpruned" in symbol_names(store))
        assert "not a release the watcher's folder pruning was tested with" in caplog.text


def test_a_root_below_a_folder_named_like_a_skipped_one(tmp_path):
    root = tmp_path / "venv" / "project"
    root.mkdir(parents=True)
    with IndexStore(tmp_path / "db.sqlite3") as store:
        indexer = Indexer([root], store)
        indexer.index_all()
        with IndexWatcher(indexer, debounce_s=0.01):
            (root / "mod.py").write_text("def inside_venv_named_root():\n    pass\n", encoding="utf-8")
            assert wait_for(lambda: "inside_venv_named_root" in symbol_names(store))


def test_many_paths_in_one_batch_take_a_full_pass(setup, monkeypatch):
    ws, store, watcher, batches = setup
    monkeypatch.setattr("context.index.watcher.FULL_PASS_PATHS", 5)
    calls = []
    real = watcher.indexer.index_all
    monkeypatch.setattr(watcher.indexer, "index_all", lambda: calls.append(1) or real())
    watcher.debounce_s = 0.3  # all ten writes land in one batch even on a busy machine
    for i in range(10):
        (ws / f"pkg/many_{i}.py").write_text(f"def many_{i}():\n    pass\n", encoding="utf-8")
    assert wait_for(lambda: {f"many_{i}" for i in range(10)} <= symbol_names(store))
    assert watcher.wait_idle(10) and calls


def test_a_burst_of_saves_is_coalesced(setup):
    ws, store, watcher, batches = setup
    for i in range(20):
        (ws / f"pkg/burst_{i}.py").write_text(f"def burst_{i}():\n    pass\n", encoding="utf-8")
    assert wait_for(lambda: {f"burst_{i}" for i in range(20)} <= symbol_names(store))
    assert watcher.wait_idle(10)
    assert sum(r.parsed for r in batches.reports) == 20
    assert len(batches.reports) <= 5


def test_editor_notifications_without_an_observer(ws, tmp_path):
    with IndexStore(tmp_path / "db.sqlite3") as store:
        indexer = Indexer([ws], store)
        indexer.index_all()
        batches = Batches()
        with IndexWatcher(indexer, debounce_s=0.01, on_batch=batches, observe=False) as watcher:
            (ws / "pkg/saved.py").write_text("def saved_in_editor():\n    pass\n", encoding="utf-8")
            time.sleep(0.2)
            assert "saved_in_editor" not in symbol_names(store)  # nobody watches the disk
            watcher.notify_saved(ws / "pkg/saved.py")
            assert wait_for(lambda: "saved_in_editor" in symbol_names(store))
            (ws / "pkg/maths.py").unlink()
            (ws / "pkg/other.py").write_text("def other():\n    pass\n", encoding="utf-8")
            watcher.notify_changed([ws / "pkg/maths.py", ws / "pkg/other.py"])
            assert wait_for(lambda: "other" in symbol_names(store) and "pkg/maths.py" not in rels(store))
            assert watcher.wait_idle(10)
            parsed = sum(r.parsed for r in batches.reports)
            # An editor rename (workspace/didRenameFiles) keeps the file's rows: nothing is re-parsed.
            (ws / "pkg/urls.py").rename(ws / "pkg/addresses.py")
            watcher.notify_moved(ws / "pkg/urls.py", ws / "pkg/addresses.py")
            assert wait_for(lambda: "pkg/addresses.py" in rels(store) and "pkg/urls.py" not in rels(store))
            assert watcher.wait_idle(10)
            assert sum(r.parsed for r in batches.reports) == parsed
        assert batches.reports[-1].files == store.stats()["files"]


def test_overlays_through_the_watcher_do_not_block_the_caller(setup):
    ws, store, watcher, batches = setup
    target = ws / "pkg/maths.py"
    watcher.debounce_s = 0.5  # so the check right after the call surely runs before the update
    watcher.set_overlay(target, "def typed_not_saved():\n    pass\n")
    assert "typed_not_saved" not in symbol_names(store)  # applied later, on the watcher's thread
    assert wait_for(lambda: "typed_not_saved" in symbol_names(store))
    assert "add_numbers" not in symbol_names(store)
    watcher.clear_overlay(target)
    assert wait_for(lambda: "add_numbers" in symbol_names(store))
    assert "typed_not_saved" not in symbol_names(store)


def test_stop_is_prompt_and_final(setup):
    ws, store, watcher, batches = setup
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 5
    (ws / "pkg/late.py").write_text("def too_late():\n    pass\n", encoding="utf-8")
    time.sleep(0.3)
    assert "too_late" not in symbol_names(store)


def searchable(store: IndexStore, token: str) -> bool:
    return any(token in hit.text for hit in store.fts_chunks(token, 3))


def test_a_saved_change_is_searchable_quickly(setup):
    ws, store, watcher, batches = setup
    target = ws / "pkg/maths.py"
    latencies = []
    for i in range(20):
        token = f"latencyprobe{i}x"
        batches.event.clear()
        started = time.monotonic()
        target.write_text(f"def {token}(a, b):\n    return a + b\n", encoding="utf-8")
        deadline = started + 10
        while not searchable(store, token) and time.monotonic() < deadline:
            batches.event.wait(max(deadline - time.monotonic(), 0))
            batches.event.clear()
        latencies.append(time.monotonic() - started)
        assert searchable(store, token), f"save {i} never became searchable"
        # Let the save's trailing events (close after write) settle so each save is measured alone.
        time.sleep(0.1)
        assert watcher.wait_idle(10)
    latencies.sort()
    p50 = statistics.median(latencies)
    p95 = latencies[int(round(0.95 * (len(latencies) - 1)))]
    print(f"\nsave -> searchable over {len(latencies)} saves: p50 {p50 * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
    assert p95 < 1.0


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_an_index_file_deleted_or_replaced_while_open_is_rebuilt_at_its_path(ws, tmp_path, caplog, how):
    path = tmp_path / "db" / "index.sqlite3"
    with IndexStore(path) as store:
        indexer = Indexer([ws], store)
        indexer.index_all()
        before = rels(store)
        with IndexWatcher(indexer, debounce_s=0.01, observe=False) as watcher:
            if how == "deleted":  # `rm -r ~/.cache/squidcode/index/...` while the server runs
                for name in (path.name, path.name + "-wal", path.name + "-shm"):
                    (path.parent / name).unlink(missing_ok=True)
            else:  # another, empty index moved over it
                IndexStore(tmp_path / "other.sqlite3").close()
                (tmp_path / "other.sqlite3").replace(path)
            assert rels(store) == before  # reads go on from the file still open
            (ws / "pkg/saved.py").write_text("def saved_after_deletion():\n    pass\n", encoding="utf-8")
            with caplog.at_level(logging.WARNING, logger="context.index.store"):
                watcher.notify_saved(ws / "pkg/saved.py")
                assert wait_for(lambda: "saved_after_deletion" in symbol_names(store))
                assert watcher.wait_idle(10)
        assert "deleted or replaced" in caplog.text and store.replacements == 1
        assert rels(store) == before | {"pkg/saved.py"}  # the new file got a full pass, not one file
    # What was written is in the file at the path, where the next start finds it.
    with IndexStore(path) as reopened:
        assert rels(reopened) == before | {"pkg/saved.py"} and reopened.integrity_problems() == []
