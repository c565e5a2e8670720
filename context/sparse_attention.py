"""Block-sparse decode attention in the local runtime, used above a context-length threshold.

`install_sparse_attention(model, config)` registers an attention function with transformers'
`AttentionInterface` and switches the model to it. Prefill and short contexts go through the
model's usual SDPA path unchanged; a decode step (one query token) over at least
`config.sparse_min_context` cached tokens attends only to the sinks, the window and the top-k blocks
that `kernels.sparse_attention` selects from per-block key summaries.

Each attention layer keeps the summaries of the cache it saw last and extends them by the blocks
completed since (O(new tokens) per step). A different cache (another request) is recognised by its
first and last summarised key rows and gets fresh summaries; a stale summary could only change which
blocks are chosen, never what the chosen tokens contribute.

Each layer also keeps its chosen blocks copied out of the cache (`kernels.sparse_attention.
GatheredBlocks`), so a step copies only the blocks it did not choose the step before. Those copies
are values, so they are dropped whenever the cache may be another one: when the summaries are rebuilt,
and at every step of the first layer, whose keys depend only on each token and its position (two
caches that differ in the middle can share their first and last rows there; from the second layer on
every key depends on all the tokens before it, so the last row tells them apart).

Settings are the `sparse_*` fields of `ModelConfig` (the `[model]` section); off by default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kernels.sparse_attention import (
    SCORE_KINDS,
    BlockSummaries,
    GatheredBlocks,
    build_block_summaries,
    extend_block_summaries,
    select_blocks,
    sparse_decode_attention,
)

from .config import ModelConfig

__all__ = [
    "ATTENTION_NAME",
    "SparseAttentionSettings",
    "SparseAttentionStats",
    "install_sparse_attention",
    "sparse_attention_forward",
    "uninstall_sparse_attention",
]

log = logging.getLogger(__name__)

ATTENTION_NAME = "squid_sparse"
# The implementations the sparse path may stand in for: both take the same arguments as ours.
_REPLACEABLE = ("sdpa", "eager")


@dataclass(frozen=True)
class SparseAttentionSettings:
    """What one decode step attends to once the cache holds at least `min_context` tokens."""

    min_context: int = 8192
    sinks: int = 64
    window: int = 1024
    top_k: int = 10
    block_size: int = 64
    score: str = "mass"

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> SparseAttentionSettings:
        return cls(
            min_context=config.sparse_min_context, sinks=config.sparse_sinks, window=config.sparse_window,
            top_k=config.sparse_top_k, block_size=config.sparse_block_size, score=config.sparse_score,
        )


@dataclass
class SparseAttentionStats:
    """How many attention calls took each path since installation (shared by all layers of a model)."""

    sparse_calls: int = 0
    dense_calls: int = 0
    attended_tokens: int = 0  # summed over sparse calls
    cached_tokens: int = 0  # summed over sparse calls
    previous: str = field(default="sdpa", repr=False)


def _visible_everywhere(mask: torch.Tensor | None) -> bool:
    """True when a decode step's mask hides nothing (no padding), so the sparse path may ignore it."""
    if mask is None:
        return True
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return bool((mask == 0).all())


def _current_summaries(
    module, keys: torch.Tensor, settings: SparseAttentionSettings
) -> tuple[BlockSummaries, bool]:
    """The layer's summaries of `keys` [b, kv, s, d], extended or rebuilt as the cache demands, and
    whether they were rebuilt (the cache may be another one)."""
    state = getattr(module, "_squid_sparse_summaries", None)
    if state is not None:
        summaries, first, last = state
        done = summaries.covered
        same_cache = (
            summaries.kinds == SCORE_KINDS[settings.score]
            and summaries.kv_heads == keys.shape[1]
            and keys.shape[2] >= done > 0
            and torch.equal(keys[:, :, 0], first)
            and torch.equal(keys[:, :, done - 1], last)
        )
        if same_cache:
            grown = extend_block_summaries(summaries, keys)
            if grown is summaries:  # no block completed since: the state stands as it is
                return summaries, False
            summaries = grown
        else:
            state = None
    rebuilt = state is None
    if rebuilt:
        summaries = build_block_summaries(keys, settings.block_size, kinds=SCORE_KINDS[settings.score])
    done = summaries.covered
    if done:
        module._squid_sparse_summaries = (summaries, keys[:, :, 0].clone(), keys[:, :, done - 1].clone())
    return summaries, rebuilt


def _gathered(module, rebuilt: bool) -> GatheredBlocks:
    gathered = getattr(module, "_squid_sparse_gathered", None)
    if gathered is None:
        gathered = module._squid_sparse_gathered = GatheredBlocks()
    if rebuilt or module.layer_idx == 0:
        gathered.reset()
    return gathered


def sparse_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: sparse for long decode steps, SDPA for everything else.

    query [b, q_heads, q_len, d], key/value [b, kv_heads, kv_len, d] (the whole cache, after RoPE);
    returns ([b, q_len, q_heads, d], None) like every transformers attention function.
    """
    settings: SparseAttentionSettings | None = getattr(module, "_squid_sparse_settings", None)
    stats: SparseAttentionStats | None = getattr(module, "_squid_sparse_stats", None)
    long_decode = (
        settings is not None
        and query.shape[2] == 1
        and key.shape[2] >= settings.min_context
        and not (dropout and module.training)
        and _visible_everywhere(attention_mask)
    )
    if not long_decode:
        if stats is not None:
            stats.dense_calls += 1
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    summaries, rebuilt = _current_summaries(module, key, settings)
    q = query[:, :, 0]  # [b, q_heads, d]
    plan = select_blocks(
        q, summaries, key.shape[2], sinks=settings.sinks, window=settings.window, top_k=settings.top_k,
        score=settings.score, scale=scaling,
    )
    gathered = _gathered(module, rebuilt)
    out = sparse_decode_attention(q, key, value, plan, scale=scaling, gathered=gathered)  # [b, q_heads, d]
    if stats is not None:
        stats.sparse_calls += 1
        stats.attended_tokens += plan.n_tokens
        stats.cached_tokens += key.shape[2]
    return out.unsqueeze(1), None  # [b, 1, q_heads, d]


def _attention_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "num_key_value_groups") and hasattr(m, "layer_idx")]


def install_sparse_attention(
    model, config: ModelConfig | SparseAttentionSettings
) -> SparseAttentionStats | None:
    """Switch `model` to sparse decode attention above the threshold; None when off or not applicable.

    `config` is the runtime's ModelConfig (off unless `sparse_attention = true`) or explicit settings.
    Models whose attention is not SDPA or eager (flash attention, say) are left alone, with a log line.
    """
    if isinstance(config, ModelConfig):
        if not config.sparse_attention:
            return None
        config = SparseAttentionSettings.from_model_config(config)
    current = getattr(model.config, "_attn_implementation", None)
    modules = _attention_modules(model)
    if current not in _REPLACEABLE + (ATTENTION_NAME,) or not modules:
        log.info("sparse attention not installed: the model uses %s attention", current)
        return None
    AttentionInterface.register(ATTENTION_NAME, sparse_attention_forward)
    stats = SparseAttentionStats(previous=current if current != ATTENTION_NAME else "sdpa")
    try:
        model.set_attn_implementation(ATTENTION_NAME)
    except (ValueError, KeyError, NotImplementedError) as exc:
        # An option must never stop the model from loading: say why and stay dense.
        log.warning("sparse attention not installed: the model refuses custom attention (%s)", exc)
        return None
    for module in modules:
        module._squid_sparse_settings = config
        module._squid_sparse_stats = stats
        module._squid_sparse_summaries = None
        module._squid_sparse_gathered = None
    log.info("sparse decode attention above %d cached tokens: %s", config.min_context, config)
    return stats


def uninstall_sparse_attention(model) -> None:
    """Back to the attention the model used before `install_sparse_attention`."""
    modules = _attention_modules(model)
    previous = "sdpa"
    for module in modules:
        stats = getattr(module, "_squid_sparse_stats", None)
        previous = stats.previous if stats is not None else previous
        for name in ("_squid_sparse_settings", "_squid_sparse_stats", "_squid_sparse_summaries",
                     "_squid_sparse_gathered"):
            if hasattr(module, name):
                delattr(module, name)
    if getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME:
        model.set_attn_implementation(previous)
