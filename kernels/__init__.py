"""Numeric kernels, each with a plain-torch reference beside its fast path."""

from .rope import ROPE_LAYOUTS, rope_shift

__all__ = ["ROPE_LAYOUTS", "rope_shift"]
