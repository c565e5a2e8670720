"""Numeric kernels, each with a plain-torch reference beside its fast path."""

from .logprob import (
    selective_logprob,
    selective_logprob_from_logits,
    selective_logprob_from_logits_reference,
    selective_logprob_reference,
)
from .rope import ROPE_LAYOUTS, rope_shift, rope_shift_naive, rope_shift_reference, rope_shift_triton
from .sparse_attention import (
    BlockSummaries,
    GatheredBlocks,
    SparsePlan,
    build_block_summaries,
    dense_decode_attention,
    extend_block_summaries,
    gather_planned,
    plan_sparse_attention,
    select_blocks,
    sparse_decode_attention,
    sparse_decode_attention_reference,
)

__all__ = [
    "BlockSummaries",
    "GatheredBlocks",
    "SparsePlan",
    "build_block_summaries",
    "dense_decode_attention",
    "extend_block_summaries",
    "gather_planned",
    "plan_sparse_attention",
    "select_blocks",
    "sparse_decode_attention",
    "sparse_decode_attention_reference",
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
