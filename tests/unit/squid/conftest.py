"""Synthetic document caches for the store tests (no model needed: the store only moves tensors)."""

from __future__ import annotations

import pytest
import torch

from context.squid.encode import DocumentKV
from context.squid.keys import CacheKey


def make_entry(name: str, seq: int = 16, source: str | None = None, seed: int = 0) -> DocumentKV:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 3, seq, 8)  # [layers, kv_heads, seq, head_dim]
    return DocumentKV(
        key=CacheKey("model-a", None, "prefix-1", name),
        token_ids=tuple(range(seq)),
        start=5,
        keys=torch.randn(shape, generator=gen),
        values=torch.randn(shape, generator=gen),
        source=source,
    )


@pytest.fixture
def entry_factory():
    return make_entry
