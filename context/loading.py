"""Serialising model loads: one lock per process, and one file lock per converted model on disk.

transformers builds a model under context managers that patch torch for the whole process (meta
device initialisation, skipped weight init), and its lazy imports are not thread-safe. Two loads in
different threads (the language model and the embedding ranker, an adapter swap) interleave those
patches, and one of them ends with parameters left on the meta device ("Cannot copy out of meta
tensor"). Every transformers or peft load in squidcode runs inside `model_loading()`.

Separate processes (an editor's server, the CLI, a trainer) may convert the same GGUF file into the
same cache directory at once; `file_lock` makes the second one wait and then use the first's copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["file_lock", "model_loading"]

_LOAD_LOCK = threading.RLock()


@contextmanager
def model_loading() -> Iterator[None]:
    """Hold the process-wide model loading lock (re-entrant: a load may call another)."""
    with _LOAD_LOCK:
        yield


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing), held across processes.

    The lock goes with the process: one killed while holding it releases it. Where the platform has
    no flock, only the in-process lock applies.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
