"""Block-sparse attention for one decode step, in the spirit of NSA and Quest, without training.

A decode query attends to three sets of cached tokens:
- sinks: the first tokens (rounded up to a whole block), which soak up attention mass in every model;
- a sliding window: the most recent tokens (rounded up so it starts on a block boundary, which also
  covers the trailing partial block);
- the top-k blocks in between, chosen by the query against per-block key summaries.

The summaries of a block are channel-wise statistics of its keys: the min and max, and/or the mean.
Scores:
- "minmax": Quest's upper bound on any q.k in the block, sum_d max(q_d min_d, q_d max_d);
- "mean": q.mean;
- "mass": each block's share of the query's attention, estimated from its mean key: a softmax of
  s q.mean over the candidate blocks (s the attention's scale; by Jensen, exp(s q.mean) is a lower
  bound on the block's average exp(s q.k)).
Under grouped-query attention the query heads of a group share their blocks, so each KV head fetches
one set of blocks, as NSA does: for "minmax" and "mean" the group's highest score wins; for "mass"
the heads' shares are summed, so a block counts by the attention the whole group would give it (one
head's sharp need and several heads' moderate ones are weighed on the same scale).
Selection reads only the summaries, [batch, kv_heads, blocks, head_dim] per statistic, so a cache held
in CPU memory needs only its summaries on the device and sends the chosen blocks over.

Formulations:
- `dense_decode_attention`: plain attention over everything (what sparse attention approximates);
- `sparse_decode_attention_reference`: the same token set as a boolean mask over dense scores, the oracle;
- `sparse_decode_attention` with backend "torch": gathers sinks, blocks and window and attends (CPU path);
- backend "triton": one kernel walking the selected tokens with an online softmax, split over the token
  list for parallelism (CUDA, or the interpreter in tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._triton import triton_available, use_triton

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
]

SUMMARY_KINDS = ("minmax", "mean")
SCORES = ("minmax", "mean", "mass")
# The summaries each score reads.
SCORE_KINDS = {"minmax": ("minmax",), "mean": ("mean",), "mass": ("mean",)}


@dataclass(frozen=True)
class BlockSummaries:
    """Per-block key statistics of the full blocks of a cache, float32 [batch, kv_heads, blocks, head_dim]."""

    block_size: int
    mean: torch.Tensor | None = None
    kmin: torch.Tensor | None = None
    kmax: torch.Tensor | None = None

    @property
    def n_blocks(self) -> int:
        present = next(t for t in (self.mean, self.kmin) if t is not None)
        return present.shape[2]

    @property
    def covered(self) -> int:
        """Tokens summarised: the full blocks, from position 0."""
        return self.n_blocks * self.block_size

    def to(self, device) -> BlockSummaries:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return BlockSummaries(self.block_size, move(self.mean), move(self.kmin), move(self.kmax))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, t in (("mean", self.mean), ("minmax", self.kmin)) if t is not None)

    @property
    def kv_heads(self) -> int:
        return next(t for t in (self.mean, self.kmin) if t is not None).shape[1]


def _summarise(keys: torch.Tensor, block_size: int, kinds: tuple[str, ...]) -> dict[str, torch.Tensor]:
    batch, heads, seq, dim = keys.shape
    blocks = keys[:, :, : seq // block_size * block_size].float()
    blocks = blocks.reshape(batch, heads, seq // block_size, block_size, dim)  # [b, h, blocks, bs, d]
    out = {}
    if "mean" in kinds:
        out["mean"] = blocks.mean(dim=3)
    if "minmax" in kinds:
        out["kmin"], out["kmax"] = blocks.amin(dim=3), blocks.amax(dim=3)
    return out


def build_block_summaries(
    keys: torch.Tensor, block_size: int, *, kinds: tuple[str, ...] = ("minmax",)
) -> BlockSummaries:
    """Summaries of every full block of `keys` [batch, kv_heads, seq, head_dim]."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if not kinds or any(k not in SUMMARY_KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {SUMMARY_KINDS}, got {kinds}")
    if keys.dim() != 4:
        raise ValueError(f"keys must be [batch, kv_heads, seq, head_dim], got shape {tuple(keys.shape)}")
    return BlockSummaries(block_size, **_summarise(keys, block_size, kinds))


def extend_block_summaries(summaries: BlockSummaries, keys: torch.Tensor) -> BlockSummaries:
    """`summaries` plus the blocks of `keys` (the same cache, grown) completed since they were built.

    Only the new full blocks are read, so keeping summaries current costs O(new tokens) per step.
    """
    done = summaries.covered
    if keys.shape[2] < done:
        raise ValueError(f"keys hold {keys.shape[2]} tokens, fewer than the {done} already summarised")
    full = keys.shape[2] // summaries.block_size * summaries.block_size
    if full == done:
        return summaries
    new = _summarise(keys[:, :, done:full], summaries.block_size, summaries.kinds)
    grown = {name: torch.cat((getattr(summaries, name), t), dim=2) for name, t in new.items()}
    return BlockSummaries(summaries.block_size, **grown)


@dataclass(frozen=True)
class SparsePlan:
    """Which cached tokens one decode step attends to: [0, sink_end), `blocks`, [window_start, seq_len)."""

    seq_len: int
    block_size: int
    sink_end: int
    window_start: int
    blocks: torch.Tensor  # [batch, kv_heads, k] int64 block ids, ascending, all in the middle

    @property
    def n_tokens(self) -> int:
        return self.sink_end + self.blocks.shape[-1] * self.block_size + self.seq_len - self.window_start


def _regions(seq_len: int, block_size: int, sinks: int, window: int) -> tuple[int, int]:
    """Block-aligned (sink_end, window_start), so the middle is a whole number of blocks."""
    sink_end = min(seq_len, math.ceil(sinks / block_size) * block_size)
    window_start = max(sink_end, (seq_len - window) // block_size * block_size)
    return sink_end, window_start


def select_blocks(
    query: torch.Tensor,
    summaries: BlockSummaries,
    seq_len: int,
    *,
    sinks: int,
    window: int,
    top_k: int,
    score: str = "minmax",
    scale: float | None = None,
) -> SparsePlan:
    """Choose the top-k middle blocks for `query` [batch, q_heads, head_dim] from the summaries alone.

    `scale`: the attention's softmax scale (default head_dim ** -0.5), which "mass" needs."""
    bs = summaries.block_size
    sink_end, window_start = _regions(seq_len, bs, sinks, window)
    if window_start > summaries.covered:
        raise ValueError(f"summaries cover {summaries.covered} tokens; this step needs {window_start}")
    first, last = sink_end // bs, window_start // bs  # middle blocks [first, last)
    k = min(top_k, last - first)
    if k <= 0:
        empty = torch.empty(query.shape[0], summaries.kv_heads, 0, dtype=torch.long, device=query.device)
        return SparsePlan(seq_len, bs, sink_end, window_start, empty)
    scores = _block_scores(query, summaries, first, last, score, scale)  # [b, kv_heads, middle blocks]
    chosen = scores.topk(k, dim=-1).indices + first
    return SparsePlan(seq_len, bs, sink_end, window_start, chosen.sort(dim=-1).values)


def _block_scores(
    query, summaries: BlockSummaries, first: int, last: int, score: str, scale: float | None = None
) -> torch.Tensor:
    kv_heads = summaries.kv_heads
    batch, q_heads, dim = query.shape
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group over {kv_heads} kv heads")
    q = query.float().reshape(batch, kv_heads, q_heads // kv_heads, dim)  # [b, kv, group, d]
    if score == "minmax":
        if summaries.kmin is None:
            raise ValueError("score 'minmax' needs min/max summaries")
        # sum_d max(q_d min_d, q_d max_d): positive channels meet the max, negative ones the min.
        kmax = summaries.kmax[:, :, first:last]
        kmin = summaries.kmin[:, :, first:last]
        s = q.clamp(min=0) @ kmax.transpose(-1, -2) + q.clamp(max=0) @ kmin.transpose(-1, -2)
    elif score == "mean":
        if summaries.mean is None:
            raise ValueError("score 'mean' needs mean summaries")
        s = q @ summaries.mean[:, :, first:last].transpose(-1, -2)
    elif score == "mass":
        if summaries.mean is None:
            raise ValueError("score 'mass' needs mean summaries")
        scale = dim**-0.5 if scale is None else scale
        logits = (q * scale) @ summaries.mean[:, :, first:last].transpose(-1, -2)
        return logits.softmax(dim=-1).sum(dim=2)  # [b, kv, blocks]: the group's share of attention
    else:
        raise ValueError(f"unknown score {score!r}; expected one of {SCORES}")
    return s.amax(dim=2)  # [b, kv, blocks]: the group's best


def plan_sparse_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    *,
    sinks: int,
    window: int,
    top_k: int,
    block_size: int,
    score: str = "minmax",
    summaries: BlockSummaries | None = None,
    scale: float | None = None,
) -> SparsePlan:
    """`select_blocks`, building the summaries from `keys` when none are given."""
    if summaries is None:
        summaries = build_block_summaries(keys, block_size, kinds=SCORE_KINDS.get(score, ("minmax",)))
    seq = keys.shape[2]
    return select_blocks(
        query, summaries, seq, sinks=sinks, window=window, top_k=top_k, score=score, scale=scale
    )


def dense_decode_attention(query, keys, values, *, scale: float | None = None, mask=None) -> torch.Tensor:
    """Attention of `query` [b, q_heads, d] over all of `keys`/`values` [b, kv_heads, s, d] (GQA).

    `mask` [b, kv_heads, s] bool keeps only the marked tokens. Float32 arithmetic, the query's dtype out.
    """
    batch, q_heads, dim = query.shape
    kv_heads = keys.shape[1]
    scale = dim**-0.5 if scale is None else scale
    q = query.float().reshape(batch, kv_heads, q_heads // kv_heads, dim)  # [b, kv, group, d]
    scores = (q @ keys.float().transpose(-1, -2)) * scale  # [b, kv, group, s]
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    out = scores.softmax(dim=-1) @ values.float()  # [b, kv, group, d]
    return out.reshape(batch, q_heads, dim).to(query.dtype)


def _plan_mask(plan: SparsePlan, batch: int, kv_heads: int, device) -> torch.Tensor:
    mask = torch.zeros(batch, kv_heads, plan.seq_len, dtype=torch.bool, device=device)
    mask[:, :, : plan.sink_end] = True
    mask[:, :, plan.window_start :] = True
    bs = plan.block_size
    tokens = (plan.blocks[..., None] * bs + torch.arange(bs, device=device)).flatten(-2)  # [b, kv, k*bs]
    mask.scatter_(2, tokens, True)
    return mask


def sparse_decode_attention_reference(query, keys, values, plan: SparsePlan, *, scale=None) -> torch.Tensor:
    """The oracle: dense attention with every token outside `plan` masked out."""
    mask = _plan_mask(plan, keys.shape[0], keys.shape[1], keys.device)
    return dense_decode_attention(query, keys, values, scale=scale, mask=mask)


def gather_planned(keys: torch.Tensor, plan: SparsePlan) -> torch.Tensor:
    """The planned tokens of `keys` [b, kv, s, d] as [b, kv, n_tokens, d]: sinks, blocks, then window.

    Works on whatever device `keys` lives on (the plan's block ids are moved there), so a cache kept in
    CPU memory sends only these tokens to the device.
    """
    return torch.cat(_planned_parts(keys, plan), dim=2)


def _planned_parts(keys: torch.Tensor, plan: SparsePlan) -> tuple[torch.Tensor, ...]:
    """The planned tokens of `keys` in order, as a few [b, kv, tokens, d] parts: the window is a view of
    the cache, the chosen blocks a copy; the sinks are copied with them when they are whole blocks
    (one part less to attend to), else they are a view too."""
    batch, kv_heads, _, dim = keys.shape
    bs = plan.block_size
    ids = plan.blocks.to(keys.device)
    n_blocks, k = plan.window_start // bs, ids.shape[-1]
    if keys.stride(3) != 1 or keys.stride(2) != dim:
        keys = keys.contiguous()
    window = keys[:, :, plan.window_start :]
    with_sinks = bool(k) and plan.sink_end % bs == 0
    if with_sinks:
        sink_ids = torch.arange(plan.sink_end // bs, device=keys.device).expand(batch, kv_heads, -1)
        ids = torch.cat((sink_ids, ids), dim=-1)
    picked = keys.new_empty(batch, kv_heads, ids.shape[-1] * bs, dim)
    # A block is one contiguous run of bs * d values of a head's keys: index_select whole blocks of
    # each head (a copy at memcpy speed; one advanced index over all heads at once is 2x slower here).
    for b in range(batch):
        for h in range(kv_heads):
            blocks = keys[b, h, : n_blocks * bs].view(n_blocks, bs, dim)
            torch.index_select(blocks, 0, ids[b, h], out=picked[b, h].view(-1, bs, dim))
    if with_sinks:
        return picked, window
    return keys[:, :, : plan.sink_end], picked, window


def _block_rows(keys: torch.Tensor, n_blocks: int, bs: int) -> torch.Tensor:
    """`keys` [b, kv, s, d] (rows contiguous) as [b * kv, n_blocks, bs * d]: block j of head h is one row."""
    batch, kv_heads, _, dim = keys.shape
    stride_b, stride_h, stride_s, _ = keys.stride()
    if batch == 1 or stride_b == kv_heads * stride_h:
        return keys.as_strided((batch * kv_heads, n_blocks, bs * dim), (stride_h, bs * stride_s, 1))
    return keys.reshape(batch * kv_heads, -1, dim)[:, : n_blocks * bs].reshape(batch * kv_heads, n_blocks, -1)


class GatheredBlocks:
    """The chosen blocks of one layer's keys and values, copied once and kept across decode steps.

    Consecutive decode steps choose mostly the same blocks (about three quarters of them stay, on
    SmolLM2 at 8k tokens), and attention does not depend on the order of the tokens it attends to,
    so a slot keeps its block while the block stays chosen and only the blocks that came in are
    copied, into the slots of those that went out. The sinks (whole blocks) sit in the first slots for good.

    Valid only while the cache it was filled from keeps the contents of those blocks (a decode loop
    that appends); whoever holds it must `reset()` it when the cache may be another one.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._slots: list[list[list[int]]] = []  # [batch][kv_head] -> block id per slot
        self._shape: tuple = ()
        self.copied_blocks = 0  # since the last reset, for stats and tests

    def parts(self, keys: torch.Tensor, values: torch.Tensor, plan: SparsePlan) -> tuple[tuple, tuple]:
        """(key parts, value parts) of `plan` over `keys`/`values` [b, kv, s, d], as `_attend_parts`
        takes them: the kept blocks with the sinks, then the window (a view of the cache)."""
        batch, kv_heads, _, dim = keys.shape
        bs = plan.block_size
        if plan.sink_end % bs or not plan.blocks.shape[-1]:
            return _planned_parts(keys, plan), _planned_parts(values, plan)
        sink_blocks, k = plan.sink_end // bs, plan.blocks.shape[-1]
        shape = (batch, kv_heads, dim, bs, sink_blocks, k, keys.dtype, keys.device)
        if keys.stride(3) != 1 or keys.stride(2) != dim:
            keys = keys.contiguous()
        if values.stride(3) != 1 or values.stride(2) != dim:
            values = values.contiguous()
        if shape != self._shape:
            self.reset()
            self._shape = shape
            size = (batch, kv_heads, (sink_blocks + k) * bs, dim)
            self._keys, self._values = keys.new_empty(size), values.new_empty(size)
            self._keys[:, :, : plan.sink_end] = keys[:, :, : plan.sink_end]
            self._values[:, :, : plan.sink_end] = values[:, :, : plan.sink_end]
            self._slots = [[[-1] * k for _ in range(kv_heads)] for _ in range(batch)]
        wanted = plan.blocks.tolist()
        heads, slots, blocks = [], [], []  # one entry per block to copy: (b * kv + h, slot, block id)
        for b in range(batch):
            for h in range(kv_heads):
                held = self._slots[b][h]
                want = set(wanted[b][h])
                free = [i for i, block in enumerate(held) if block not in want]
                if not free:
                    continue
                kept = set(held)
                incoming = [block for block in wanted[b][h] if block not in kept]
                for i, block in zip(free, incoming, strict=True):
                    held[i] = block
                heads += [b * kv_heads + h] * len(free)
                slots += free
                blocks += incoming
        if blocks:
            index = torch.tensor([heads, slots, blocks], device=keys.device)
            for source, buffer in ((keys, self._keys), (values, self._values)):
                source_blocks = _block_rows(source, plan.window_start // bs, bs)  # [b * kv, blocks, bs * d]
                target = buffer[:, :, plan.sink_end :].reshape(batch * kv_heads, k, bs * dim)  # a view
                target[index[0], index[1]] = source_blocks[index[0], index[2]]
            self.copied_blocks += len(blocks)
        window = plan.window_start
        return (self._keys, keys[:, :, window:]), (self._values, values[:, :, window:])


def _attend_parts(query: torch.Tensor, keys: tuple, values: tuple, scale: float | None) -> torch.Tensor:
    """Attention of `query` [b, q_heads, d] over the concatenation of the key/value parts, without
    concatenating them: scores per part, one softmax over all of them, outputs summed per part."""
    batch, q_heads, dim = query.shape
    kv_heads = keys[0].shape[1]
    scale = dim**-0.5 if scale is None else scale
    q = query.float().reshape(batch, kv_heads, q_heads // kv_heads, dim) * scale  # [b, kv, group, d]
    keys = [k for k in keys if k.shape[2]]
    values = [v for v in values if v.shape[2]]
    scores = torch.cat([q @ k.float().transpose(-1, -2) for k in keys], dim=-1)  # [b, kv, group, tokens]
    probs = scores.softmax(dim=-1)
    out, start = None, 0
    for v in values:
        part = probs[..., start : start + v.shape[2]] @ v.float()  # [b, kv, group, d]
        out = part if out is None else out.add_(part)
        start += v.shape[2]
    return out.reshape(batch, q_heads, dim).to(query.dtype)


def sparse_decode_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    plan: SparsePlan,
    *,
    scale: float | None = None,
    backend: str = "auto",
    gathered: GatheredBlocks | None = None,
) -> torch.Tensor:
    """Attention of `query` [b, q_heads, d] over the tokens `plan` picks from `keys`/`values` [b, kv, s, d].

    backend: "auto" (Triton for CUDA tensors when it imports), "torch", or "triton". `gathered`: the
    torch path keeps the chosen blocks there across steps of one decode loop (see GatheredBlocks).
    """
    _check_attention(query, keys, values, plan)
    if backend == "auto":
        backend = "triton" if use_triton(query, keys, values) else "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' but triton does not import on this machine")
        from ._sparse_attention_triton import sparse_decode_triton

        return sparse_decode_triton(query, keys, values, plan, scale=scale)
    if backend != "torch":
        raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'torch' or 'triton'")
    if gathered is not None and keys.device == query.device:
        k_parts, v_parts = gathered.parts(keys, values, plan)
        return _attend_parts(query, k_parts, v_parts, scale)
    k_parts = [t.to(query.device) for t in _planned_parts(keys, plan)]
    v_parts = [t.to(query.device) for t in _planned_parts(values, plan)]
    return _attend_parts(query, k_parts, v_parts, scale)


def _check_attention(query, keys, values, plan: SparsePlan) -> None:
    if query.dim() != 3 or keys.dim() != 4 or values.shape != keys.shape:
        raise ValueError(
            "expected query [batch, q_heads, head_dim] and keys/values [batch, kv_heads, seq, head_dim], got "
            f"{tuple(query.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if query.shape[1] % keys.shape[1] or query.shape[2] != keys.shape[3] or query.shape[0] != keys.shape[0]:
        raise ValueError(f"query {tuple(query.shape)} does not fit keys {tuple(keys.shape)} (GQA groups)")
    if plan.seq_len != keys.shape[2]:
        raise ValueError(f"the plan is for {plan.seq_len} cached tokens, the keys hold {keys.shape[2]}")
