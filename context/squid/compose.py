"""Compose cached documents and a query into one context, without re-encoding the documents.

Layout of a composed request (positions):

    [ prefix 0..P-1 ][ doc 1 P..P+L1-1 ][ doc 2 P+L1.. ] ... [ query offset.. ]

Every document was encoded at P..P+L-1, so document i moves by delta_i = its start - P: its keys
are re-rotated by delta_i (`kernels.rope_shift`, with the model's own `inv_freq`), its values are
copied as they are. The stored entries are never written: the composed tensors are new, and every
cache handed out (`ComposedContext.new_cache`) is a fresh transformers cache over copies, so
`generate()` extending it in place cannot reach them.

`Recovery` chooses how much of the lost cross-document attention to recompute (see `recompute`).

Consecutive requests mostly compose the same documents. Given the `previous` composition, a
document found there at the same positions is copied from it instead of re-rotated, and with
first-k recovery only the documents from the first changed one on are recomputed (a token's
recomputed keys depend only on the positions before it), or with `Recovery.following` only the
changed documents and the few after each. Swapping one reference document then costs its encode,
one re-rotation and the recovery near it, not a composition of all of them.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from kernels import rope_shift

from .encode import DocumentKV, PrefixKV, build_cache
from .recompute import cacheblend_select, recompute_tokens, supports_recompute

__all__ = ["ComposedContext", "Recovery", "compose", "full_prefill", "greedy_continuation", "prefill"]

_IDENTITIES = itertools.count(1)


@dataclass(frozen=True)
class Recovery:
    """How much of the composed context to recompute.

    `first_k`: the first k tokens of every document after the first; `last_k`: the last k tokens
    of the documents (those nearest the query, which it attends to most; never the first document's,
    which follows the prefix exactly); `blend_ratio`: CacheBlend's share of the most-deviating
    document tokens (0 = off). They may be combined.

    `window` (0 = off) narrows what first-k and last-k tokens attend to while they are recomputed:
    the prefix, the first `sinks` tokens of each document before them and the `window` positions
    just before them. Their attention, most of a recompute's cost at a few thousand positions, then
    costs in proportion to the window, not to the whole context.

    `following` applies when a composition copies documents from a previous one: first-k recovery
    recomputes each changed document and the `following` documents after it; documents further on
    keep the recovery they had, made with the old document in front of them (None: every document
    after the first change is recomputed, as in a fresh composition).
    """

    first_k: int = 0
    blend_ratio: float = 0.0
    following: int | None = None
    last_k: int = 0
    window: int = 0
    sinks: int = 0

    @property
    def name(self) -> str:
        parts = [f"first{self.first_k}"] if self.first_k else []
        parts += [f"last{self.last_k}"] if self.last_k else []
        parts += [f"blend{round(self.blend_ratio * 100)}"] if self.blend_ratio else []
        parts += [f"w{self.window}s{self.sinks}"] if self.window else []
        if self.following is not None and (self.first_k or self.last_k):
            parts.append(f"next{self.following}")
        return "squid" + "".join(f"_{p}" for p in parts)


@dataclass
class ComposedContext:
    """A composed context: its tensors, where each document sits, and what it cost.

    `offset` is the position the next token (the query's first) takes. `new_cache()` gives a private
    transformers cache of the context for `ModelRuntime.generate(prompt, past=...)`. When `compose`
    was given a query, `cache` holds context + query and `logits` the next-token logits after it.
    """

    keys: torch.Tensor  # [layers, kv_heads, offset, head_dim]
    values: torch.Tensor
    token_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # each document's [start, end) positions
    config: object
    recomputed_fraction: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    cache: object = None
    logits: torch.Tensor | None = None
    # What the context was made of, so that the next composition can copy what is unchanged.
    document_keys: tuple = ()
    sources: tuple[str | None, ...] = ()  # each document's file (`DocumentKV.source`)
    prefix_hash: str = ""
    recovery: Recovery | None = None
    reused_documents: int = 0
    # No other composition in this process has it: the caches `new_cache` hands out carry it
    # (`squid_identity`), so the runtime recognises a context it already holds without comparing
    # its keys and values (tens of milliseconds per keystroke at a thousand tokens).
    identity: int = field(default_factory=lambda: next(_IDENTITIES))

    @property
    def offset(self) -> int:
        return len(self.token_ids)

    def new_cache(self):
        cache = build_cache(self.config, self.keys, self.values)
        cache.squid_identity = (self.identity, self.offset)
        return cache


def _rotary_layout(model) -> str:
    # Every transformers decoder with `rotary_emb` (Llama, Mistral, Qwen) uses rotate-half.
    return "rotate_half"


def _check(prefix: PrefixKV, documents: list[DocumentKV]) -> None:
    for doc in documents:
        if doc.key.prefix != prefix.hash or doc.start != prefix.length:
            raise ValueError(f"document {doc.source or doc.key.content} was encoded after another prefix")
        if (doc.key.model, doc.key.adapter) != (prefix.model, prefix.adapter):
            raise ValueError(f"document {doc.source or doc.key.content} was encoded by another model")


def _reusable(previous: ComposedContext | None, prefix: PrefixKV, documents: list[DocumentKV],
              spans: list[tuple[int, int]], recovery: Recovery) -> list[bool]:
    """Per document: whether `previous` holds it at the same positions, its tensors reusable.

    CacheBlend picks its tokens over all documents at once, so a change anywhere may change what it
    recomputed anywhere: nothing is reused then.
    """
    if (previous is None or previous.prefix_hash != prefix.hash or previous.recovery != recovery
            or recovery.blend_ratio):
        return [False] * len(documents)
    held = dict(zip(previous.spans, previous.document_keys, strict=True))
    return [held.get(span) == doc.key for span, doc in zip(spans, documents, strict=True)]


def _concatenate(runtime, prefix: PrefixKV, documents: list[DocumentKV], recovery: Recovery,
                 previous: ComposedContext | None):
    """Prefix + re-rotated documents as [layers, kv_heads, S, head_dim] tensors, the spans, and
    which documents were copied from `previous`."""
    device = runtime.device
    spans, cursor = [], prefix.length
    for doc in documents:
        spans.append((cursor, cursor + doc.length))
        cursor += doc.length
    reused = _reusable(previous, prefix, documents, spans, recovery)
    layers, kv_heads, _, head_dim = prefix.keys.shape
    shape = (layers, kv_heads, cursor, head_dim)
    keys = torch.empty(shape, dtype=prefix.keys.dtype, device=device)
    values = torch.empty(shape, dtype=prefix.values.dtype, device=device)
    keys[:, :, : prefix.length] = prefix.keys.to(device)
    values[:, :, : prefix.length] = prefix.values.to(device)
    moved = [i for i, same in enumerate(reused) if not same]
    for i, same in enumerate(reused):
        if same:
            start, end = spans[i]
            keys[:, :, start:end] = previous.keys[:, :, start:end]
            values[:, :, start:end] = previous.values[:, :, start:end]
    inv_freq = runtime.model.model.rotary_emb.inv_freq
    for i in moved:
        # Layers play the batch dimension; each document moves by its own delta, straight into place.
        start, end = spans[i]
        rope_shift(documents[i].keys.to(device), start - documents[i].start, inv_freq,
                   layout=_rotary_layout(runtime.model), out=keys[:, :, start:end])
        values[:, :, start:end] = documents[i].values.to(device)
    token_ids = prefix.token_ids + tuple(t for d in documents for t in d.token_ids)
    return keys, values, token_ids, tuple(spans), reused


def _to_refresh(reused: list[bool], following: int | None) -> list[bool]:
    """Per document: whether first-k recovery recomputes it. Documents copied from the previous
    composition were recovered there; a changed document and those after it (at most `following`
    of them, or all when None) are recomputed. The first document follows the prefix exactly."""
    out, since = [], None  # documents since the last changed one
    for same in reused:
        since = 0 if not same else None if since is None else since + 1
        out.append(since is not None and (following is None or since <= following))
    return [False] + out[1:] if out else out


def _runs(positions: list[int]) -> list[list[int]]:
    """Sorted positions split into runs of consecutive ones."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][-1] == p - 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _visible(spans, start: int, recovery: Recovery, device) -> torch.Tensor:
    """What a run of recomputed tokens from `start` on attends to under `recovery.window`: the
    prefix, each earlier document's first `sinks` tokens and the `window` positions before `start`
    (besides the run itself)."""
    cols = set(range(spans[0][0]))
    cols.update(p for s, e in spans if s < start for p in range(s, min(e, s + recovery.sinks, start)))
    cols.update(range(max(0, start - recovery.window), start))
    return torch.tensor(sorted(cols), dtype=torch.long, device=device)


def _recover(runtime, keys, values, token_ids, spans, recovery: Recovery,
             reused: list[bool] | None = None) -> float:
    """Recompute per `recovery`, in place; returns the fraction of document token-layers recomputed.

    `reused`: which documents were copied, already recovered, from a previous composition (see
    `_to_refresh` for which of them first-k recovery computes again).
    """
    total = sum(end - start for start, end in spans)
    if not total or not (recovery.first_k or recovery.last_k or recovery.blend_ratio) or len(spans) < 2:
        return 0.0
    if not supports_recompute(runtime.model):
        return 0.0
    model, device = runtime.model, runtime.device
    ids = torch.tensor(token_ids, device=device)
    n_layers = len(model.model.layers)
    work = 0
    if recovery.first_k or recovery.last_k:
        refresh = _to_refresh(reused if reused is not None else [False] * len(spans), recovery.following)
        # The last tokens belong to the documents they fall in, and are refreshed with them.
        tail = spans[-1][1] - recovery.last_k if recovery.last_k else spans[-1][1]
        chosen = [p for (start, end), again in zip(spans, refresh, strict=True) if again
                  for p in range(start, end) if p < start + recovery.first_k or p >= tail]
        if chosen:
            groups = None
            if recovery.window:
                groups = [(len(run), _visible(spans, run[0], recovery, device)) for run in _runs(chosen)]
            recompute_tokens(model, keys, values, ids, torch.tensor(chosen, device=device), groups=groups)
        work += len(chosen) * n_layers
    if recovery.blend_ratio:
        candidates = torch.tensor([p for start, end in spans[1:] for p in range(start, end)], device=device)
        selected, hidden = cacheblend_select(model, keys, values, ids, candidates, recovery.blend_ratio)
        if len(selected):
            recompute_tokens(model, keys, values, ids, selected, first_layer=1, hidden=hidden)
        work += len(candidates) + len(selected) * (n_layers - 1)
    return work / (total * n_layers)


def prefill(runtime, cache, query_ids: list[int], start: int, chunk: int = 256):
    """Run `query_ids` at positions start.. on `cache` (extended in place); returns the last logits."""
    logits = None
    for offset in range(0, len(query_ids), chunk):
        part = query_ids[offset : offset + chunk]
        positions = torch.arange(start + offset, start + offset + len(part), device=runtime.device)
        out = runtime.model(input_ids=torch.tensor([part], device=runtime.device),
                            position_ids=positions[None], cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1, :]
    return logits


def full_prefill(runtime, ids: list[int]):
    """(a fresh cache of `ids` prefilled from position 0 in one pass, the last logits): the reference
    Squid's compositions are measured and distilled against."""
    from transformers import DynamicCache

    cache = DynamicCache(config=runtime.model.config)
    return cache, prefill(runtime, cache, ids, 0, chunk=1 << 16)


def greedy_continuation(runtime, keys: torch.Tensor, values: torch.Tensor, query: list[int], start: int,
                        tokens: int) -> list[int]:
    """The `tokens` greedy tokens after `query` at positions start.. on a copy of keys/values."""
    cache = build_cache(runtime.model.config, keys, values)
    logits, ids = prefill(runtime, cache, query, start), []
    for _ in range(tokens):
        ids.append(int(logits.argmax()))
        logits = prefill(runtime, cache, ids[-1:], start + len(query) + len(ids) - 1)
    return ids


def compose(
    runtime,
    prefix: PrefixKV,
    documents: list[DocumentKV],
    query_ids: list[int] | None = None,
    *,
    recovery: Recovery = Recovery(),
    previous: ComposedContext | None = None,
) -> ComposedContext:
    """Compose `documents` (in this order) after `prefix`; prefill `query_ids` when given.

    `previous`: an earlier composition to copy unchanged documents from (it is only read). The
    result is the caller's own: nothing in it shares storage with the stored entries or `previous`.
    """
    _check(prefix, documents)
    timings: dict[str, float] = {}
    with torch.inference_mode():
        started = time.perf_counter()
        keys, values, token_ids, spans, reused = _concatenate(runtime, prefix, documents, recovery, previous)
        timings["shift_s"] = time.perf_counter() - started
        started = time.perf_counter()
        fraction = _recover(runtime, keys, values, token_ids, spans, recovery, reused)
        timings["recompute_s"] = time.perf_counter() - started
        ctx = ComposedContext(keys, values, token_ids, spans, runtime.model.config, fraction, timings,
                              document_keys=tuple(d.key for d in documents), prefix_hash=prefix.hash,
                              sources=tuple(d.source for d in documents),
                              recovery=recovery, reused_documents=sum(reused))
        if query_ids:
            started = time.perf_counter()
            ctx.cache = ctx.new_cache()
            ctx.logits = prefill(runtime, ctx.cache, list(query_ids), ctx.offset)
            timings["query_s"] = time.perf_counter() - started
    return ctx
