"""Numeric kernels, each with a plain-torch reference beside its fast path."""

from .logprob import (
    selective_logprob,
    selective_logprob_from_logits,
    selective_logprob_from_logits_reference,
    selective_logprob_reference,
)
from .rope import ROPE_LAYOUTS, rope_shift, rope_shift_naive, rope_shift_reference, rope_shift_triton

__all__ = [
    "ROPE_LAYOUTS",
    "rope_shift",
    "rope_shift_naive",
    "rope_shift_reference",
    "rope_shift_triton",
    "selective_logprob",
    "selective_logprob_from_logits",
    "selective_logprob_from_logits_reference",
    "selective_logprob_reference",
]
