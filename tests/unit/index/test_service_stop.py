"""`IndexService.stop` landing as the first pass ends (the server stopping right after opening a
workspace): it raises nothing, and no watcher or file observer is left running after it."""

from __future__ import annotations

import threading
import time

import pytest

from context.config import IndexConfig
from context.index import service as service_module
from context.index.service import IndexService
from context.index.watcher import IndexWatcher
from tests.unit.index.test_indexer import write_tree

FILES = {"pkg/__init__.py": "", "pkg/maths.py": "def add_numbers(a, b):\n    return a + b\n"}


@pytest.fixture
def root(tmp_path):
    return write_tree(tmp_path / "ws", FILES)


def _watch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "squid-index-watch" and t.is_alive()]


def test_stop_called_while_the_watcher_starts_leaves_no_watcher_running(root, tmp_path, monkeypatch):
    """The pass's thread is starting the watcher when `stop` comes: `stop` waits for the start and
    stops what it started (before, it found no watcher yet, and the watcher ran on after `stop`)."""
    before = _watch_threads()
    service = IndexService([root], IndexConfig(watch=True, debounce_ms=0, embeddings=False),
                           db_path=tmp_path / "index.sqlite3", embeddings=False)
    starting = threading.Event()
    real_start = IndexWatcher.start

    def slow_start(watcher):
        starting.set()
        service._stop.wait(0.5)  # gives `stop` the moment to run, if nothing holds it back
        real_start(watcher)

    monkeypatch.setattr(service_module.IndexWatcher, "start", slow_start)
    service.start()
    assert starting.wait(30), "the first pass did not reach the watcher"
    service.stop()
    assert service.state == "stopped"
    assert service.watcher is not None and service.watcher._observer is None
    deadline = time.monotonic() + 5
    while _watch_threads() != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _watch_threads() == before


def test_stop_before_the_first_pass_ends_starts_no_watcher(root, tmp_path, monkeypatch):
    service = IndexService([root], IndexConfig(watch=True, debounce_ms=0, embeddings=False),
                           db_path=tmp_path / "index.sqlite3", embeddings=False)
    real_index_all = service.indexer.index_all

    def index_all_until_stopped(**kwargs):
        report = real_index_all(**kwargs)
        service._stop.wait(30)  # the pass ends only after `stop` was called
        return report

    monkeypatch.setattr(service.indexer, "index_all", index_all_until_stopped)
    service.start()
    service.stop()
    assert service.watcher is None
    assert service.wait_until_indexed(5) is False


def test_stop_right_after_start_raises_nothing_and_leaves_nothing_running(root, tmp_path):
    """`stop` at many moments of a real first pass (no hooks): never an exception, never a watcher
    left running."""
    before = _watch_threads()
    for i in range(20):
        service = IndexService([root], IndexConfig(watch=True, debounce_ms=0, embeddings=False),
                               db_path=tmp_path / f"index-{i}.sqlite3", embeddings=False)
        service.start()
        time.sleep(0.002 * i)
        service.stop()
        assert service.state == "stopped"
    assert _watch_threads() == before
