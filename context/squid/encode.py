"""Encode a document once, on its own, after a shared system prefix: one "tentacle" per document.

A document's entry holds its per-layer keys and values as the model computed them with the prefix
before it (positions P..P+L-1 for a prefix of P tokens), stacked as [layers, kv_heads, seq, head_dim].
Keys are stored after RoPE, as transformers caches them; `compose` re-rotates them to wherever the
document lands in a request.

Encoding runs in chunks with explicit `position_ids`; `should_pause` is polled between chunks, so a
background encode gives the model back to a request within one chunk, and `DocumentEncoding` goes on
from that chunk later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import GenerationCancelled
from .keys import FORMAT_VERSION, CacheKey, content_hash, model_identity, token_hash

__all__ = [
    "DEFAULT_PREFIX",
    "ENCODE_CHUNK",
    "DocumentEncoding",
    "DocumentKV",
    "PrefixKV",
    "build_cache",
    "cache_tensors",
    "document_key",
    "encode_document",
    "encode_prefix",
]

# The shared system prefix every document is encoded after. Its tokens also give each document
# the attention sink (the first positions) that full prefill would have given it.
DEFAULT_PREFIX = "# Files from this repository, for reference.\n\n"
ENCODE_CHUNK = 128

ShouldPause = Callable[[], bool]


@dataclass(frozen=True)
class PrefixKV:
    """The shared prefix's tokens and cache; its hash is part of every document key."""

    token_ids: tuple[int, ...]
    keys: torch.Tensor  # [layers, kv_heads, prefix_len, head_dim]
    values: torch.Tensor
    model: str
    adapter: str | None

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def hash(self) -> str:
        return token_hash(self.token_ids)


@dataclass(frozen=True)
class DocumentKV:
    """One document's cache, encoded at positions `start`.. after the prefix."""

    key: CacheKey
    token_ids: tuple[int, ...]
    start: int
    keys: torch.Tensor  # [layers, kv_heads, seq, head_dim], after RoPE at positions start..
    values: torch.Tensor  # [layers, kv_heads, seq, head_dim]
    source: str | None = None  # the file it came from, for invalidation
    encode_s: float = 0.0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + 8 * len(self.token_ids)

    def to(self, device: str) -> DocumentKV:
        if self.keys.device.type == torch.device(device).type:
            return self
        from dataclasses import replace

        return replace(self, keys=self.keys.to(device), values=self.values.to(device))


def cache_tensors(cache, start: int = 0, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack a transformers cache's layers into [layers, kv_heads, seq, head_dim] (batch 0)."""
    keys = torch.stack([layer.keys[0, :, start:end] for layer in cache.layers])
    values = torch.stack([layer.values[0, :, start:end] for layer in cache.layers])
    return keys, values


def build_cache(config, keys: torch.Tensor, values: torch.Tensor):
    """A fresh transformers DynamicCache holding `keys`/`values` [layers, kv_heads, seq, head_dim].

    DynamicCache concatenates into new tensors on its first update, so later generation never
    writes into `keys` or `values`.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer in range(keys.shape[0]):
        cache.update(keys[layer : layer + 1], values[layer : layer + 1], layer)
    return cache


def _forward_chunk(runtime, ids: list[int], cache, start: int):
    """Run `ids` at positions start.. through the model, extending `cache` (no logits kept but the
    last position's: a document's encode only wants its keys and values)."""
    input_ids = torch.tensor([ids], device=runtime.device)
    positions = torch.arange(start, start + len(ids), device=runtime.device)
    return runtime.model(input_ids=input_ids, position_ids=positions[None], cache=cache, use_cache=True,
                         logits_to_keep=1).cache


def encode_prefix(runtime, text: str = DEFAULT_PREFIX) -> PrefixKV:
    """Encode the shared system prefix at positions 0..P-1."""
    from transformers import DynamicCache

    ids = runtime.encode(text) or [runtime.tokenizer.bos_token_id or 0]
    with torch.inference_mode():
        cache = DynamicCache(config=runtime.model.config)
        for offset in range(0, len(ids), ENCODE_CHUNK):
            cache = _forward_chunk(runtime, ids[offset : offset + ENCODE_CHUNK], cache, offset)
        keys, values = cache_tensors(cache)
    return PrefixKV(tuple(ids), keys, values, model_identity(runtime), runtime.adapter_id)


def document_key(runtime, prefix: PrefixKV, text: str) -> CacheKey:
    return CacheKey(model_identity(runtime), runtime.adapter_id, prefix.hash, content_hash(text),
                    FORMAT_VERSION)


class DocumentEncoding:
    """One document's encode after `prefix`, at positions P..P+L-1, run in chunks.

    `run` raises GenerationCancelled when `should_pause` turns true between two chunks, and keeps
    what it encoded: run again, it goes on from there. A background encode that requests keep
    interrupting (a user typing in bursts) still finishes, where starting over would lose every
    pause's work and never finish a document longer than the typist's pauses.
    """

    def __init__(self, runtime, prefix: PrefixKV, token_ids: list[int], key: CacheKey, *,
                 source: str | None = None):
        if not token_ids:
            raise ValueError("cannot encode an empty document")
        self.runtime, self.prefix, self.key, self.source = runtime, prefix, key, source
        self.token_ids = tuple(token_ids)
        self._check_model()
        self.done = 0  # tokens encoded so far
        self.encode_s = 0.0  # time spent running, over every run
        self._cache = None

    def current(self) -> bool:
        """The prefix (and what was encoded after it) is the runtime's model and adapter's now."""
        now = (model_identity(self.runtime), self.runtime.adapter_id)
        return (self.prefix.model, self.prefix.adapter) == now

    def _check_model(self) -> None:
        if not self.current():
            raise ValueError("the prefix was encoded by another model or adapter")

    def run(self, should_pause: ShouldPause | None = None, chunk_tokens: int = ENCODE_CHUNK) -> DocumentKV:
        self._check_model()  # an adapter applied while paused: what was encoded is another model's
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                if self._cache is None:
                    self._cache = build_cache(self.runtime.model.config, self.prefix.keys, self.prefix.values)
                while self.done < len(self.token_ids):
                    if should_pause is not None and should_pause():
                        raise GenerationCancelled("encoding paused for a request")
                    chunk = list(self.token_ids[self.done : self.done + chunk_tokens])
                    start = self.prefix.length + self.done
                    self._cache = _forward_chunk(self.runtime, chunk, self._cache, start)
                    self.done += len(chunk)
                keys, values = cache_tensors(self._cache, self.prefix.length)
        finally:
            self.encode_s += time.perf_counter() - started
        self._cache = None
        return DocumentKV(
            key=self.key, token_ids=self.token_ids, start=self.prefix.length, keys=keys.contiguous(),
            values=values.contiguous(), source=self.source, encode_s=self.encode_s,
        )


def encode_document(
    runtime,
    prefix: PrefixKV,
    token_ids: list[int],
    key: CacheKey,
    *,
    source: str | None = None,
    should_pause: ShouldPause | None = None,
    chunk_tokens: int = ENCODE_CHUNK,
) -> DocumentKV:
    """Encode `token_ids` after `prefix`, at positions P..P+L-1; only the document's part is kept.

    Raises GenerationCancelled when `should_pause` turns true between chunks (what was encoded is
    lost: `DocumentEncoding` keeps it).
    """
    return DocumentEncoding(runtime, prefix, token_ids, key, source=source).run(should_pause, chunk_tokens)
