"""A completion's Squid reference documents, composed for training as the server composed them.

The server answered a completion from a composed cache (`context.squid`): the shared prefix, then each
reference document encoded on its own after it, re-positioned and concatenated, with the configured
quality recovery; the prompt window followed at the next position. The trainer prompts with the same
thing, through the same code (`SquidService.context_for`): the recorded documents' texts (kept in
the feedback store by content hash) are tokenized and encoded again, in the served order, with the
served recovery, composed fresh (`fresh=True`: from the documents alone, never copied from the
composition of another example). The window's ids then run at the positions after it.

Whose weights encode the documents: the server encodes a document with the model it generates with
(the promoted adapter merged in; its cache key names the adapter) and keeps that cache until another
adapter is promoted. The trainer's steps do the same (`train.reference_weights = "round"`, the
default; `round_start`): the adapter's documents are encoded by the adapter's weights as the round
began (the adapter in use, which served the round's newest episodes), however far the optimizer has
moved it since, once a round, kept on disk in the training run's folder. With `"step"` they are
encoded again after every optimizer step by the weights each step samples with: the documents as
the trained weights would read them, at the cost of encoding them every step (about as long as
sampling, on a CPU). Outside the steps (the gate, a benchmark's evaluation) the weights active at
each compose encode them, as the server would once they were promoted; the base model encodes the
KL reference's (adapter disabled). Document caches are kept in a small memory store, the base
model's and the round start's also on disk; an optimizer step (`weights_changed`) drops those the
live adapter encoded, and the memory store is emptied before each loss (`release_memory`): the loss
reads compositions already made, and the store's room is then the backward pass's. The composed
prefix is a constant to the loss (no gradient flows into the documents' caches), as a served cache
is encoded once and then only read.

A composition is `exact` when it holds the served tokens: every document's text still tokenizes to
the ids its hash names, and the shared prefix is the served one. A document whose text redaction
changed (a secret replaced by a placeholder) no longer does: it is composed from the redacted text,
which the model then reads in place of the secret, and the composition is approximate.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import weakref
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from context.config import SquidCacheConfig
from context.prompt_record import ServedPrompt, TokenizerCodec
from context.squid.compose import ComposedContext, Recovery
from context.squid.service import ReferenceDocument, SquidService, recovery_from_config

from .logprobs import unwrap_causal_lm

__all__ = ["ReferenceComposer", "ReferencePrefix", "composer_for", "release_memory", "round_start",
           "weights_changed"]

log = logging.getLogger(__name__)

# Memory for the document caches of the weights in use (fp32, 4 documents of 512 tokens of the
# embedded model: ~95 MiB an example); least recently used ones are dropped beyond it. On disk, those
# kept for the round (the base model's, and per round the adapter's), up to DISK_MB.
CACHE_MB = 256
DISK_MB = 4096
_RECOVERY_FIELDS = {f.name for f in fields(Recovery)}


def _active_weights(model) -> str | None:
    """The adapters a forward pass of `model` applies now, None for the base model alone."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            return None if module.disable_adapters else ",".join(module.active_adapters)
    return None


class _TrainedRuntime:
    """The model under training as `context.squid` reads a `ModelRuntime`: its causal LM (LoRA layers
    injected), tokenizer, device, and an adapter id naming the weights active now."""

    def __init__(self, model, tokenizer):
        self.model = unwrap_causal_lm(model)
        self.tokenizer = tokenizer
        self._codec = TokenizerCodec(tokenizer)
        self.device = next(self.model.parameters()).device.type
        self.source = str(getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__)
        self.version = 0  # bumped by each optimizer step
        self.label: str | None = None  # the round start's weights encode the adapter's documents

    @property
    def adapter_id(self) -> str | None:
        active = _active_weights(self.model)
        return None if active is None else f"{active}@{self.label or self.version}"

    def encode(self, text: str) -> list[int]:
        return self._codec.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._codec.decode(ids)


@dataclass(frozen=True)
class ReferencePrefix:
    """One example's reference documents composed by the weights that were active (`adapter`)."""

    composed: ComposedContext
    exact: bool  # the served tokens, document for document (see the module docstring)
    adapter: str | None
    served: ServedPrompt
    composer: ReferenceComposer

    @property
    def length(self) -> int:
        """Positions it takes: the window's first token comes at this one."""
        return self.composed.offset

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.composed.token_ids

    def current(self) -> ReferencePrefix:
        """This prefix, or the same documents composed again when other weights are active now."""
        if self.composer.runtime.adapter_id == self.adapter:
            return self
        return self.composer.compose(self.served) or self

    def cache(self, rows: int):
        """A fresh transformers cache of the prefix for `rows` sequences. Its layers are views of the
        composed tensors (ordinary tensors: see `ReferenceComposer.compose`), not copies: a cache
        grows by new tensors, so the composition is never written, and a loss that only reads the
        prefix holds no second copy of it."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.composed.config)
        keys, values = self.composed.keys, self.composed.values  # [layers, kv_heads, offset, head_dim]
        assert len(cache.layers) == keys.shape[0], (len(cache.layers), keys.shape)
        for index, layer in enumerate(cache.layers):
            layer.lazy_initialization(keys[index : index + 1], values[index : index + 1])
            layer.keys, layer.values = keys[index : index + 1], values[index : index + 1]
        if rows > 1:
            cache.batch_repeat_interleave(rows)  # [rows, kv_heads, offset, head_dim] per layer
        return cache


class ReferenceComposer:
    """Composes recorded reference documents with one model's weights (see the module docstring)."""

    def __init__(self, model, tokenizer, disk_dir: Path | None = None, cache_mb: int = CACHE_MB,
                 per_round: bool = True):
        """`per_round`: inside `round_start()` the adapter's documents are encoded by its weights as
        they are now (the round's start: see the module docstring); elsewhere, and always when
        false, by the weights active at each compose."""
        self.runtime = _TrainedRuntime(model, tokenizer)
        self.disk_dir = disk_dir
        self.per_round = per_round
        # The documents were cut when they were served: no limit but the largest allowed here.
        config = SquidCacheConfig(document_tokens=4096, preencode=False, device_mb=cache_mb, cpu_mb=0,
                                  disk_mb=DISK_MB if disk_dir is not None else 0)
        self.service = SquidService(self.runtime, config, disk_dir, start_thread=False)
        self._adapter_keys: set = set()  # stored caches the adapter's live weights encoded
        self._start_keys: set = set()  # and those its weights at the round's start encoded
        self._start: dict[str, torch.Tensor] = {}
        self._start_label = ""
        self._take_start_weights()

    def _take_start_weights(self) -> None:
        """Keep a copy of the adapter's weights as they are now: the round's start. Its caches are
        named by a digest of those weights: a process that resumes the round later (from another
        checkpoint) never reads the disk caches of another start."""
        for key in self._start_keys:
            self.service.store.invalidate(key)
        self._start_keys.clear()
        self._start = ({name: p.detach().clone() for name, p in self.runtime.model.named_parameters()
                        if p.requires_grad} if self.per_round else {})
        digest = hashlib.blake2b(digest_size=8)
        for name, value in sorted(self._start.items()):
            digest.update(name.encode())
            digest.update(value.cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
        self._start_label = f"start-{digest.hexdigest()}"

    @contextlib.contextmanager
    def round_start(self):
        """Within: the adapter's documents as its weights at the round's start encode them (per
        round; the trainer's steps run in here)."""
        if not self.per_round or self.runtime.label is not None:
            yield
            return
        self.runtime.label = self._start_label
        try:
            yield
        finally:
            self.runtime.label = None

    @contextlib.contextmanager
    def _start_weights(self):
        """The adapter's weights of the round's start in place while documents are encoded; the live
        ones come back after, in place (the optimizer's tensors stay the same objects)."""
        params = dict(self.runtime.model.named_parameters())
        live = {name: params[name].detach().clone() for name in self._start}
        with torch.no_grad():
            for name, value in self._start.items():
                params[name].copy_(value)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in live.items():
                    params[name].copy_(value)

    def _drop_adapter_caches(self) -> None:
        for key in self._adapter_keys:
            self.service.store.invalidate(key)
        self._adapter_keys.clear()

    def weights_changed(self, *, restart: bool = False) -> None:
        """The adapter's weights changed (an optimizer step): the caches its live weights encoded are
        stale; the round start's stay. `restart`: these weights are a new start (a round resumed from
        a checkpoint): the round's documents are encoded by them from now on."""
        self._drop_adapter_caches()
        self.runtime.version += 1
        if restart:
            self._take_start_weights()

    def release_memory(self) -> int:
        """Let go of the document caches held in memory (the trainer does before the loss, whose
        compositions are made): those on disk come back when next needed, the live adapter's are
        about to be stale (the weights stay what they are: a composition of them still holds).
        Returns the bytes let go."""
        self._drop_adapter_caches()
        return self.service.store.release_memory()

    def compose(self, served: ServedPrompt) -> ReferencePrefix | None:
        """`served`'s reference documents composed by the weights active now (the adapter's as the
        round began, per round); None when it names none whose text is known."""
        documents = [ReferenceDocument(ref.text) for ref in served.references if ref.text]
        if not documents:
            return None
        adapter = self.runtime.adapter_id
        started = adapter is not None and self.runtime.label is not None
        with torch.no_grad(), self._start_weights() if started else contextlib.nullcontext():
            composed = self.service.context_for(documents, wait=True, recovery=_recovery(served), fresh=True,
                                                persist=adapter is None or started)
        if composed is None:
            return None
        # Composed in inference mode, which autograd may not save: one copy outside it, held here,
        # so that every cache of it reads it in place (the inference tensors go).
        composed = replace(composed, keys=composed.keys.clone(), values=composed.values.clone())
        if adapter is not None:
            (self._start_keys if started else self._adapter_keys).update(composed.document_keys)
        exact = _exact(composed, served)
        if not exact:
            log.debug("reference documents composed from %d of %d texts, some redacted or missing: the "
                      "prompt approximates the one served", len(documents), len(served.references))
        return ReferencePrefix(composed, exact, adapter, served, self)


def _recovery(served: ServedPrompt) -> Recovery:
    recorded = {k: v for k, v in served.reference_recovery if k in _RECOVERY_FIELDS}
    # Recorded before the recovery was: the product's default.
    return replace(Recovery(), **recorded) if recorded else recovery_from_config(SquidCacheConfig())


def _exact(composed: ComposedContext, served: ServedPrompt) -> bool:
    hashes = tuple(key.content for key in composed.document_keys)
    prefix_ok = not served.reference_prefix or served.reference_prefix == composed.prefix_hash
    return prefix_ok and hashes == tuple(ref.hash for ref in served.references)


_COMPOSERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def composer_for(model, tokenizer, disk_dir: Path | None = None,
                 per_round: bool | None = None) -> ReferenceComposer:
    """The composer of `model` (one per model object: its caches outlive a call); `disk_dir`: where
    the document caches kept for the round go (the trainer names its run folder; None: the composer
    in use, or one without a disk tier); `per_round` as `ReferenceComposer` (None: the composer in
    use, or per round). A trainer asks at its start, so the adapter's weights then are the round's."""
    composer = _COMPOSERS.get(model)
    if (composer is None or composer.runtime.tokenizer is not tokenizer
            or (disk_dir is not None and composer.disk_dir != disk_dir)
            or (per_round is not None and composer.per_round != per_round)):
        composer = _COMPOSERS[model] = ReferenceComposer(
            model, tokenizer, disk_dir, per_round=True if per_round is None else per_round)
    return composer


def round_start(model):
    """`ReferenceComposer.round_start` of `model`'s composer (nothing without one)."""
    composer = _COMPOSERS.get(model)
    return composer.round_start() if composer is not None else contextlib.nullcontext()


def release_memory(model) -> int:
    """Let go of `model`'s document caches in memory (`ReferenceComposer.release_memory`)."""
    composer = _COMPOSERS.get(model)
    return composer.release_memory() if composer is not None else 0


def weights_changed(model, *, restart: bool = False) -> None:
    """Say that `model`'s adapter weights changed (after an optimizer step; `restart`: loaded from a
    checkpoint, see `ReferenceComposer.weights_changed`)."""
    composer = _COMPOSERS.get(model)
    if composer is not None:
        composer.weights_changed(restart=restart)
