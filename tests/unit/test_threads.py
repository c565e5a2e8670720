"""`context.threads.SerialThreadExecutor`: tasks in order, one at a time, on a thread that ends with
the last of them (an idle thread that ran torch would keep its OpenMP team)."""

from __future__ import annotations

import threading
import time

import pytest

from context.threads import SerialThreadExecutor


def _alive(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


def _ends(name: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(name) and time.monotonic() < deadline:
        time.sleep(0.005)
    return not _alive(name)


def test_tasks_run_in_order_one_at_a_time_and_the_thread_ends():
    executor = SerialThreadExecutor("serial-under-test")
    running, most, order = [0], [0], []
    lock = threading.Lock()

    def task(number):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        order.append(number)
        with lock:
            running[0] -= 1
        return number * 10

    futures = [executor.submit(task, n) for n in range(5)]
    assert [f.result(10) for f in futures] == [0, 10, 20, 30, 40]
    assert order == [0, 1, 2, 3, 4] and most[0] == 1
    assert _ends("serial-under-test"), "out of tasks, the thread ends"
    # A later task starts a new thread, and it ends too.
    assert executor.submit(lambda: threading.current_thread().name).result(10) == "serial-under-test"
    assert _ends("serial-under-test")
    executor.shutdown()


def test_an_exception_reaches_the_caller_and_later_tasks_still_run():
    executor = SerialThreadExecutor("serial-errors")

    def fails():
        raise ValueError("the task's own error")

    bad, good = executor.submit(fails), executor.submit(lambda: "after")
    with pytest.raises(ValueError, match="the task's own error"):
        bad.result(10)
    assert good.result(10) == "after"
    executor.shutdown()


def test_shutdown_cancels_what_waits_waits_for_what_runs_and_refuses_more():
    executor = SerialThreadExecutor("serial-shutdown")
    release = threading.Event()
    started = threading.Event()

    def blocks():
        started.set()
        release.wait(10)
        return "ran"

    running = executor.submit(blocks)
    waiting = executor.submit(lambda: "never")
    assert started.wait(10)
    threading.Timer(0.1, release.set).start()
    executor.shutdown(wait=True, cancel_futures=True)
    assert running.result(0) == "ran" and waiting.cancelled()
    assert _ends("serial-shutdown")
    with pytest.raises(RuntimeError):
        executor.submit(lambda: None)
