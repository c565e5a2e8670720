"""Freed memory given back to the system between and during the trainer's phases.

glibc keeps freed heap memory for reuse, and during sampling most of it is the key/value caches
of earlier tokens: a transformers cache grows by a fresh, larger copy for every generated token,
so freed blocks are always a little too small for the next one, and the heap grows by them. Its
threshold for giving a block its own mapping rises with the largest block freed (up to 32 MiB), so
past the first step those blocks come from the heap too. `malloc_trim(0)` returns the free pages
inside the heap; calling it every few tokens holds the resident set near what is live, at the cost
of faulting those pages in again when they are reused. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["TrimHeap", "release_freed_heap"]


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_heap() -> bool:
    """Give the free pages of the heap back to the system; False where there is no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class TrimHeap:
    """A logits processor for `generate` that releases freed heap every `every` tokens and changes
    no score."""

    def __init__(self, every: int = 4):
        self.every, self.calls = every, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls % self.every == 0:
            release_freed_heap()
        return scores
