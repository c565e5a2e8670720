"""Foreground work pauses background work: the gate itself, a full index pass (inline and in
worker processes), and the repo map's graph build."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import time

import pytest

from context import foreground as gate
from context.index import indexer as indexer_module
from context.index.indexer import Indexer
from context.index.repomap import rank_files
from context.index.store import IndexStore


def test_nested_and_concurrent_blocks_keep_the_gate_busy_until_the_last_ends():
    assert not gate.foreground_busy()
    assert gate.pause_for_foreground(0.01) is True
    with gate.foreground():
        with gate.foreground():
            assert gate.foreground_busy()
        assert gate.foreground_busy()
        started = time.monotonic()
        assert gate.pause_for_foreground(0.2) is False  # bounded: gives up after its timeout
        assert 0.15 <= time.monotonic() - started < 2
    assert not gate.foreground_busy()


def test_a_pause_ends_when_the_foreground_work_ends():
    ended = threading.Event()

    def work() -> None:
        with gate.foreground():
            time.sleep(0.3)
        ended.set()

    with gate.foreground():  # busy before the worker thread even starts
        thread = threading.Thread(target=work)
        thread.start()
    started = time.monotonic()
    assert gate.pause_for_foreground(5) is True
    waited = time.monotonic() - started
    assert ended.is_set() and 0.2 < waited < 4
    thread.join()


def _files(root, count: int) -> None:
    for i in range(count):
        (root / f"mod{i}.py").write_text(f"def function_{i}(x):\n    return x + {i}\n", encoding="utf-8")


def test_a_full_pass_waits_while_foreground_work_runs(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    _files(root, 40)
    progress: list[int] = []
    with IndexStore(tmp_path / "index.db") as store:
        indexer = Indexer([root], store, workers=0, batch_files=8)
        with gate.foreground():
            def record(done: int, total: int) -> None:
                progress.append(done)

            thread = threading.Thread(target=indexer.index_all, args=(record,))
            thread.start()
            time.sleep(1.0)
            assert [p for p in progress if p] == [] and store.stats(references=False)["files"] == 0
        thread.join(30)
        assert progress[-1] == 40 and store.stats(references=False)["files"] == 40


def _warm() -> int:
    return os.getpid()


def _timed_pause() -> float:
    started = time.monotonic()
    gate.pause_for_foreground()
    return time.monotonic() - started


def test_index_worker_processes_wait_on_the_servers_gate():
    """The pool's initializer hands the workers the parent's idle event."""
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=context, initializer=indexer_module._init_worker,
                                initargs=(os.getpid(), gate.idle_event())) as pool:
        assert pool.submit(_warm).result(60) != os.getpid()  # the worker is up
        assert pool.submit(_timed_pause).result(10) < 0.5  # idle: no wait
        with gate.foreground():
            future = pool.submit(_timed_pause)
            time.sleep(1.0)
        assert 0.7 < future.result(10) < gate.MAX_PAUSE_S + 1


def test_a_background_repo_map_build_offers_to_pause(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(60):  # enough references for several pause points
        body = "\n".join(f"    function_{j}(x)" for j in range(60))
        (root / f"use{i}.py").write_text(f"def function_{i}(x):\n{body}\n", encoding="utf-8")
    calls = []
    with IndexStore(tmp_path / "index.db") as store:
        Indexer([root], store, workers=0).index_all()
        references = sum(1 for _ in store.all_references())
        ranked = rank_files(store, pause=lambda: calls.append(1))
    assert len(ranked) == 60
    assert len(calls) >= references // 2048 + 2, (len(calls), references)


@pytest.fixture(autouse=True)
def _gate_left_idle():
    yield
    assert not gate.foreground_busy(), "a test left the foreground gate busy"
