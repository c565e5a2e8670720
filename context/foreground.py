"""Foreground work pauses background work: while a model generates for a user, indexing waits.

Indexing already runs niced, but on two cores nice is not enough: the index writer shares the
server's GIL with the generation loop, and the parse workers and the embedding process share the
cores and caches with torch's threads. So every generation a user waits on (an inline completion,
an agent turn) is wrapped in `foreground()`, and background loops call `pause_for_foreground()`
between units of work (a file, a batch of chunks). Worker processes get the gate's `idle` event
(a multiprocessing event from the spawn context) through their initializer.

A pause is bounded (`MAX_PAUSE_S`): during a long agent episode the index still advances, one unit
of work per pause, and a gate left busy by a bug can only slow indexing, never stop it.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "MAX_PAUSE_S",
    "foreground",
    "foreground_busy",
    "idle_event",
    "pause_for_foreground",
    "set_worker_idle_event",
]

# The longest a background unit of work waits for foreground work to end.
MAX_PAUSE_S = 2.0

_lock = threading.Lock()
_busy = 0
_idle = None  # multiprocessing Event, set while no foreground work runs; created on first use


def idle_event():
    """The process-wide idle event (set: no foreground work), to hand to worker processes."""
    global _idle
    with _lock:
        if _idle is None:
            _idle = multiprocessing.get_context("spawn").Event()
            if _busy == 0:
                _idle.set()
        return _idle


def set_worker_idle_event(event) -> None:
    """In a worker process: pause on the parent's gate (its `idle_event()`, passed at spawn)."""
    global _idle
    with _lock:
        _idle = event


@contextmanager
def foreground() -> Iterator[None]:
    """Mark foreground work for the duration of the block (nested and concurrent blocks count)."""
    global _busy
    event = idle_event()
    with _lock:
        _busy += 1
        event.clear()
    try:
        yield
    finally:
        with _lock:
            _busy -= 1
            if _busy == 0:
                event.set()


def foreground_busy() -> bool:
    event = _idle
    return event is not None and not event.is_set()


def pause_for_foreground(timeout: float = MAX_PAUSE_S) -> bool:
    """Wait (at most `timeout`) while foreground work runs; True when none is running now."""
    event = _idle
    if event is None or event.is_set():
        return True
    return event.wait(timeout)
