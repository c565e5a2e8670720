"""Freed heap given back to the system (glibc's malloc_trim), on this process's real heap."""

from __future__ import annotations

import platform

import pytest
import torch

from feedback.train.heap import TrimHeap, release_freed_heap


def resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_blocks_leave_the_resident_set():
    # 64 KiB blocks come from the heap (below any mmap threshold); one block allocated after them
    # keeps the heap's top in use, so freeing them leaves free pages inside the heap, which glibc
    # keeps resident until trimmed.
    blocks = [bytearray(b"x" * 65536) for _ in range(3000)]
    tail = bytearray(b"y" * 65536)
    del blocks
    held = resident_mib()
    assert release_freed_heap() is True
    assert held - resident_mib() > 100, (held, resident_mib())
    assert tail[0] == ord("y")


def test_trim_processor_changes_no_score_and_trims_every_few_tokens(monkeypatch):
    import feedback.train.heap as heap

    calls = []
    monkeypatch.setattr(heap, "release_freed_heap", lambda: calls.append(1) or True)
    processor = TrimHeap(every=3)
    scores = torch.randn(4, 10)
    for _ in range(7):
        assert processor(torch.zeros(4, 5, dtype=torch.long), scores) is scores
    assert len(calls) == 2
