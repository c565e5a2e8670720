"""Squid for a running server: the store, the shared prefix, background pre-encoding, invalidation.

`SquidService.context_for(documents)` is what a request calls: it composes the documents whose
caches are ready (in the order given) and queues the missing ones for the background encoder, so
a request never waits for an encode unless it asks to (`wait=True`, for agent prompts that will
decode for a long time anyway). The background encoder runs on its own low-priority thread in small
chunks and pauses while any request holds `foreground()`, so it gives the model back within one
chunk. That thread ends whenever it pauses or runs out of work, and a new one starts when work
comes and no request holds the model: an idle thread that has run torch slows the model thread's
decoding (`context.threads` says why). A document is keyed by the exact tokens encoded, so an
edited file never reuses an old cache; `invalidate_paths` (called from the index watcher and
editor saves) frees the old entries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..config import SquidCacheConfig
from ..errors import GenerationCancelled
from .compose import ComposedContext, Recovery, compose
from .encode import DocumentEncoding, DocumentKV, PrefixKV, encode_prefix
from .keys import FORMAT_VERSION, CacheKey, model_identity, token_hash
from .store import KVCacheStore

__all__ = ["ReferenceDocument", "SquidService", "recovery_from_config"]

log = logging.getLogger(__name__)

# Background chunks are small: a request waits at most one of them (~0.1 s on two cores).
BACKGROUND_CHUNK = 32
_QUEUE_LIMIT = 64
# Paused encodes kept to go on from (each holds its document's keys and values so far, ~50 KiB a
# token for the embedded model); the oldest is dropped beyond this.
_PARTIAL_LIMIT = 4
_MIB = 1 << 20


def recovery_from_config(config: SquidCacheConfig) -> Recovery:
    following = config.recompute_following
    return Recovery(first_k=config.recompute_first, last_k=config.recompute_last,
                    blend_ratio=config.blend_ratio, following=None if following < 0 else following,
                    window=config.recompute_window,
                    sinks=config.recompute_sinks if config.recompute_window else 0)


@dataclass(frozen=True)
class ReferenceDocument:
    """A piece of reference text (a file's start or a retrieved chunk) and the file it came from."""

    text: str
    source: str | None = None


class SquidService:
    """Per-document caches for one loaded model (`disk_dir`: the disk tier; None = memory only).

    `prefix_text` is what every document follows (its hash is in every key): the default for
    completions, or for the agent the head of its chat prompt, so its documents sit inside the
    first user turn as they would in plain text.
    """

    def __init__(self, runtime, config: SquidCacheConfig, disk_dir: Path | None, *,
                 start_thread: bool = True, prefix_text: str | None = None):
        self.runtime = runtime
        self.config = config
        self.prefix_text = prefix_text
        self.recovery = recovery_from_config(config)
        self.store = KVCacheStore(
            Path(disk_dir) if disk_dir is not None else None, device=runtime.device,
            device_bytes=config.device_mb * _MIB,
            cpu_bytes=config.cpu_mb * _MIB, disk_bytes=config.disk_mb * _MIB,
        )
        self._prefix: PrefixKV | None = None
        self._last: tuple[tuple, ComposedContext] | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: OrderedDict[CacheKey, tuple[list[int], str | None, int]] = OrderedDict()
        # Encodes a request paused, by key: the next encode of the document goes on from them.
        self._partial: OrderedDict[CacheKey, DocumentEncoding] = OrderedDict()
        self.resumed_tokens = 0  # tokens a paused encode did not have to encode again
        # Invalidation epochs: a counter, and the epoch at which each file last changed.
        self._epoch = 0
        self._changed_at: dict[str, int] = {}
        self._store_lock = threading.Lock()  # storing an encode vs dropping its file's entries
        self._foreground = 0
        self._stopping = False
        self.encoded = 0
        self._inflight = threading.Event()
        self._background = start_thread and config.preencode
        self._thread: threading.Thread | None = None  # the encoder thread while it has work

    # -- keys and the prefix ---------------------------------------------------------------------

    def prefix(self) -> PrefixKV:
        """The shared prefix for the current model and adapter (encoded again when either changes)."""
        with self._lock:
            current = (model_identity(self.runtime), self.runtime.adapter_id)
            if self._prefix is None or (self._prefix.model, self._prefix.adapter) != current:
                self._prefix = (encode_prefix(self.runtime) if self.prefix_text is None
                                else encode_prefix(self.runtime, self.prefix_text))
            return self._prefix

    def _tokens_and_key(self, prefix: PrefixKV, doc: ReferenceDocument) -> tuple[list[int], CacheKey]:
        ids = self.runtime.encode(doc.text)[: self.config.document_tokens]
        key = CacheKey(prefix.model, prefix.adapter, prefix.hash, token_hash(ids), FORMAT_VERSION)
        return ids, key

    # -- the request path ----------------------------------------------------------------------

    @contextlib.contextmanager
    def foreground(self):
        """Held by a request: background encoding pauses until it is released."""
        with self._cond:
            self._foreground += 1
        try:
            yield
        finally:
            with self._cond:
                self._foreground -= 1
                self._wake()

    def context_for(self, documents: list[ReferenceDocument], *, wait: bool = False,
                    recovery: Recovery | None = None, persist: bool = False,
                    fresh: bool = False, should_pause=None) -> ComposedContext | None:
        """The composed context of the ready `documents` (missing ones queued, or encoded when
        `wait`, and then also written to the disk tier when `persist`); None when none is ready.

        `should_pause`: polled between the chunks of a `wait` encode; when it turns true the encode
        stops (what it encoded is kept for the next one) and GenerationCancelled is raised.

        `fresh`: composed from the documents alone, as by a service that served nothing before (no
        copy from the last composition, which is kept as it was): the trainer's composition of a
        recorded episode's documents must not depend on the episode trained before it."""
        epoch = self.epoch()
        prefix = self.prefix()
        ready: list[DocumentKV] = []
        for doc in documents:
            ids, key = self._tokens_and_key(prefix, doc)
            if not ids:
                continue
            entry = self.store.get(key)
            if entry is None and wait:
                entry = self._encode(prefix, ids, key, doc.source, should_pause, epoch=epoch, persist=persist)
            if entry is None:
                self._enqueue(key, ids, doc.source, epoch)
                continue
            ready.append(entry)
        if not ready:
            return None
        recovery = recovery or self.recovery
        if fresh:
            return compose(self.runtime, prefix, ready, recovery=recovery)
        # Consecutive requests mostly read the same references: reuse the last composition (its
        # tensors are never written; each request gets its own cache from `new_cache()`).
        signature = (prefix.hash, recovery, tuple(entry.key for entry in ready))
        with self._lock:
            last = self._last
        if last is not None and last[0] == signature:
            return last[1]
        # A changed set mostly shares documents with the last one: those are copied, not re-rotated.
        composed = compose(self.runtime, prefix, ready, recovery=recovery,
                           previous=last[1] if last is not None else None)
        with self._lock:
            self._last = (signature, composed)
        return composed

    def schedule(self, documents: list[ReferenceDocument], *, epoch: int | None = None) -> int:
        """Queue documents for background encoding (those not cached yet); returns how many.

        `epoch`: `self.epoch()` from before the documents' text was read (default: now)."""
        epoch = self.epoch() if epoch is None else epoch
        prefix = self.prefix()
        queued = 0
        for doc in documents:
            ids, key = self._tokens_and_key(prefix, doc)
            if ids and not self.store.contains(key):
                queued += self._enqueue(key, ids, doc.source, epoch)
        return queued

    def epoch(self) -> int:
        """The invalidation epoch: take it before reading a document's text."""
        with self._store_lock:
            return self._epoch

    def invalidate_paths(self, paths) -> int:
        """Drop the caches of documents read from these files (they changed on disk), and the
        queued or running encodes of their old text."""
        sources = {str(Path(p)) for p in paths}
        with self._store_lock:
            self._epoch += 1
            for source in sources:
                self._changed_at[source] = self._epoch
            with self._cond:
                for key in [k for k, job in self._queue.items() if job[1] in sources]:
                    del self._queue[key]
                for key in [k for k, partial in self._partial.items() if partial.source in sources]:
                    del self._partial[key]
            dropped = sum(self.store.invalidate_source(source) for source in sources)
        if dropped:
            log.info("squid: dropped %d cached documents of changed files", dropped)
        return dropped

    def _stale(self, source: str | None, epoch: int) -> bool:
        return source is not None and self._changed_at.get(source, -1) > epoch

    def stats(self) -> dict:
        with self._cond:
            queued = len(self._queue)
            paused = len(self._partial)
        return {"tiers": self.store.stats(), "queued": queued, "encoded": self.encoded, "paused": paused,
                "resumed_tokens": self.resumed_tokens}

    # -- encoding ------------------------------------------------------------------------------

    def _encode(self, prefix, ids, key, source, should_pause=None, chunk=None, *, epoch: int,
                persist: bool = False) -> DocumentKV:
        encoding = self._encoding(prefix, ids, key, source)
        kwargs = {"chunk_tokens": chunk} if chunk else {}
        try:
            entry = encoding.run(should_pause, **kwargs)
        except GenerationCancelled:
            with self._store_lock, self._cond:
                if not self._stale(source, epoch):  # its file changed meanwhile: nothing to go on from
                    self._partial[key] = encoding
                    while len(self._partial) > _PARTIAL_LIMIT:
                        self._partial.popitem(last=False)
            raise
        self.encoded += 1
        with self._store_lock:
            if self._stale(source, epoch):
                log.info("squid: encoded %s, which changed meanwhile: not stored", source)
                return entry
            if source is not None:
                self.store.invalidate_source(source, keep=key)
            self.store.put(entry)
            if persist:
                self.store.persist(key)
        log.info("squid: encoded %s (%d tokens) in %.2fs", source or "a document", len(ids), entry.encode_s)
        return entry

    def _encoding(self, prefix: PrefixKV, ids: list[int], key: CacheKey,
                  source: str | None) -> DocumentEncoding:
        """The paused encode of this document to go on from, or a new one (also when the prefix,
        model or adapter changed since it paused)."""
        with self._cond:
            partial = self._partial.pop(key, None)
        if partial is not None and partial.prefix is prefix and partial.token_ids == tuple(ids) \
                and partial.current():
            if partial.done:
                self.resumed_tokens += partial.done
                log.info("squid: going on with %s from token %d of %d", source or "a document",
                         partial.done, len(ids))
            return partial
        return DocumentEncoding(self.runtime, prefix, ids, key, source=source)

    def _enqueue(self, key: CacheKey, ids: list[int], source: str | None, epoch: int) -> int:
        if not self._background:
            return 0
        with self._cond:
            if key in self._queue:
                return 0
            self._queue[key] = (ids, source, epoch)
            while len(self._queue) > _QUEUE_LIMIT:
                self._queue.popitem(last=False)
            self._wake()
            return 1

    def _paused(self) -> bool:
        return self._foreground > 0 or self._stopping

    def _wake(self) -> None:
        """Under `_cond`: start the encoder thread when there is work, no request holds the model and
        none runs (the last one ended, or is ending: it took its last job)."""
        self._cond.notify_all()
        if self._thread is None and self._queue and not self._paused():
            self._thread = threading.Thread(target=self._run, name="squid-preencode", daemon=True)
            self._thread.start()

    def _next_job(self):
        """The next job, or None: the thread ends (paused, stopping or out of work)."""
        with self._cond:
            if self._paused() or not self._queue:
                self._thread = None
                return None
            self._inflight.set()
            # The newest request's documents first.
            return self._queue.popitem(last=True)

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while (job := self._next_job()) is not None:
            key, (ids, source, epoch) = job
            try:
                self._encode(self.prefix(), ids, key, source, self._paused, BACKGROUND_CHUNK,
                             epoch=epoch, persist=True)
            except GenerationCancelled:
                with self._cond:
                    if not self._stale(source, epoch):
                        self._queue.setdefault(key, (ids, source, epoch))
            except (RuntimeError, ValueError) as exc:
                log.warning("squid: background encode of %s failed: %s", source or key.content, exc)
            finally:
                self._inflight.clear()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until the queue is empty and nothing is being encoded (tests, benchmarks)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if not self._queue and not self._busy_encoding():
                    return True
            time.sleep(0.02)
        return False

    def _busy_encoding(self) -> bool:
        return self._inflight.is_set()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._partial.clear()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10)
