"""Threads that run torch end when their work does.

A thread that has run a parallel torch operation (or the fused CPU step) keeps an OpenMP team for
as long as it lives. libgomp counts the threads of every team; once they outnumber the cores, it
stops spin-waiting at barriers and puts every team's threads to sleep at each one, so the model
thread's decoding pays a futex wake-up at every barrier of every layer. Measured on 2 cores: one
idle thread that had run a matrix product slowed the model thread's decoding from 176 to 121
tokens/s (`bench/bench_thread_teams.py`). So work that runs torch now and then, off the model
thread (the Squid pre-encoder, agent episodes), runs on threads that end when it is done.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future

__all__ = ["SerialThreadExecutor"]


class SerialThreadExecutor(Executor):
    """One task at a time, in the order submitted, on a thread that ends when none is left
    (a `ThreadPoolExecutor(max_workers=1)` keeps its idle thread, and with it an OpenMP team)."""

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._tasks: deque[tuple[Future, Callable, tuple, dict]] = deque()
        self._thread: threading.Thread | None = None
        self._shut = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._tasks.append((future, fn, args, kwargs))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return future

    def _next(self):
        with self._lock:
            if not self._tasks:
                self._thread = None
                return None
            return self._tasks.popleft()

    def _run(self) -> None:
        while (task := self._next()) is not None:
            future, fn, args, kwargs = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the future's owner
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while self._tasks:
                    self._tasks.popleft()[0].cancel()
            thread = self._thread
        if wait and thread is not None:
            thread.join()
