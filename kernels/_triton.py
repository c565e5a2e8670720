"""Whether the Triton fast paths can run: Triton imports and the tensors live on a CUDA device.

Under `TRITON_INTERPRET=1` Triton also runs kernels on CPU tensors (slowly, in numpy), which is how
the tests check each kernel against its reference on a machine without a GPU; the automatic dispatch
still sends CPU tensors to the torch reference, and tests call the `*_triton` functions directly.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["interpreting", "triton_available", "use_triton"]


@functools.cache
def triton_available() -> bool:
    """True when `import triton` works (it is an optional dependency, Linux x86-64 only)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(*tensors: torch.Tensor) -> bool:
    """The automatic choice: Triton for CUDA tensors when it imports, the torch reference otherwise."""
    return triton_available() and all(t.is_cuda for t in tensors)
