"""Kernel tests run each Triton kernel on CPU tensors under Triton's interpreter.

`@triton.jit` reads TRITON_INTERPRET when a kernel module is imported, so it is set here, before any
test imports one; the kernel modules are imported lazily, only by a Triton path. Nothing else in the
project uses Triton, so the setting does not change other tests.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")


def _triton_imports() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


requires_triton = pytest.mark.skipif(
    not _triton_imports() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton (the `test` extra, Linux x86-64) and TRITON_INTERPRET=1",
)


def poisoned(*shape, dtype=torch.float32) -> torch.Tensor:
    """An output buffer full of NaN, so an element a kernel forgets to write fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype)


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (NaN anywhere, a poisoned element left unwritten, gives inf)."""
    if got.shape != want.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        return float("inf")
    got, want = got.detach(), want.detach()
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))
