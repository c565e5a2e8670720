"""Semantic ranking over the index: chunk vectors computed in the background, searched by cosine.

- `embed_pending(store, embedder)` embeds the chunks that have no vector yet, in small committed
  batches: a chunk whose embedded text (its head) is already known by its content key gets that
  vector back without running the model, so after an edit only the changed chunks are embedded.
- `EmbeddingProcess` runs `embed_pending` in a separate, niced (19), single-threaded process: torch's
  thread count is per process, and the server's completions must keep all theirs. It waits to be
  woken (after the first pass, after each watcher batch) and stops with its parent.
- `SemanticRanker` embeds the query (in the calling process) and scores every embedded chunk with
  one matrix product against a float32 matrix kept per store until its vectors change.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SquidcodeError
from .embeddings import (
    ChunkEmbedder,
    EmbedderConfig,
    blob_to_vectors,
    embedding_text,
    embeddings_available,
    vector_key,
    vector_to_blob,
)
from .store import IndexStore
from .types import SearchHit

__all__ = [
    "EMBED_NICE",
    "EmbedReport",
    "EmbeddingProcess",
    "SemanticRanker",
    "default_ranker",
    "embed_pending",
]

log = logging.getLogger(__name__)

EMBED_NICE = 19
# Chunks read, embedded and committed together: small enough that a stop request or a killed
# process loses little, large enough for the model's batches.
_STEP_CHUNKS = 128
_WORKER_POLL_S = 0.5


@dataclass
class EmbedReport:
    embedded: int = 0  # chunks that ran through the model
    reused: int = 0  # chunks whose vector was already stored under their content key
    pruned: int = 0  # vectors dropped because no chunk points at them any more
    seconds: float = 0.0
    stopped: bool = False
    rates: list[float] = field(default_factory=list)  # chunks/s of each model step

    @property
    def chunks_per_s(self) -> float:
        return self.embedded / self.seconds if self.seconds else 0.0


def embed_pending(store: IndexStore, embedder: ChunkEmbedder, should_stop: Callable[[], bool] | None = None,
                  step: int = _STEP_CHUNKS) -> EmbedReport:
    """Give every chunk without a vector one; returns what was done. Stops early when asked to."""
    started = time.monotonic()
    report = EmbedReport()
    stop = should_stop or (lambda: False)
    if store.vector_model() != embedder.model_id:
        store.reset_vectors(embedder.model_id)
    after = 0
    while not stop():
        rows = store.chunks_without_vectors(step, after)
        if not rows:
            break
        after = rows[-1][0]
        keyed = [(chunk_id, text, vector_key(embedder.model_id, text))
                 for chunk_id, text in ((r[0], embedding_text(r[1], r[2], r[3])) for r in rows)]
        known = store.existing_vector_keys(key for _, _, key in keyed)
        todo = {key: text for _, text, key in keyed if key not in known}
        new: dict[str, bytes] = {}
        if todo:
            t0 = time.monotonic()
            vectors = embedder.embed(list(todo.values()))
            report.rates.append(len(todo) / max(time.monotonic() - t0, 1e-9))
            new = {key: vector_to_blob(v) for key, v in zip(todo, vectors, strict=True)}
        store.set_chunk_vectors([(chunk_id, key) for chunk_id, _, key in keyed], new)
        report.embedded += len(todo)
        report.reused += len(keyed) - len(todo)
    report.stopped = stop()
    if not report.stopped:
        report.pruned = store.prune_vectors()
    report.seconds = time.monotonic() - started
    return report


# --- the background process ---------------------------------------------------------------------


def _worker_main(db_path: str, config: EmbedderConfig, wake, stop, parent_pid: int) -> None:
    """The embedding process: nice, one torch thread, embed whenever woken, leave with the parent."""
    try:
        os.nice(EMBED_NICE)
    except OSError as exc:
        log.debug("could not lower the embedding process's priority: %s", exc)
    import torch

    torch.set_num_threads(max(1, config.threads))
    embedder = ChunkEmbedder(config)
    store = IndexStore(Path(db_path))

    def should_stop() -> bool:
        return stop.is_set() or os.getppid() != parent_pid

    try:
        while not should_stop():
            if not wake.wait(_WORKER_POLL_S):
                continue
            wake.clear()
            report = embed_pending(store, embedder, should_stop)
            if report.embedded or report.pruned:
                log.info("embedded %d chunks (%d reused) in %.1fs", report.embedded, report.reused,
                         report.seconds)
    except (SquidcodeError, OSError) as exc:
        log.error("embedding stopped: %s", exc)
    finally:
        store.close()


class EmbeddingProcess:
    """A background process that keeps a store's chunk vectors current (see `_worker_main`)."""

    def __init__(self, db_path: Path, config: EmbedderConfig | None = None) -> None:
        self.db_path = Path(db_path)
        self.config = config or EmbedderConfig()
        context = multiprocessing.get_context("spawn")
        self._wake = context.Event()
        self._stop = context.Event()
        self._process = context.Process(
            target=_worker_main, name="squid-embed", daemon=True,
            args=(str(self.db_path), self.config, self._wake, self._stop, os.getpid()),
        )

    def start(self) -> None:
        self._process.start()

    def wake(self) -> None:
        """There are (or may be) chunks without vectors: embed them."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._process.pid is None:
            return
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout)


# --- ranking --------------------------------------------------------------------------------------


class SemanticRanker:
    """Cosine search over a store's chunk vectors. Thread-safe; the query model loads on first use."""

    def __init__(self, embedder: ChunkEmbedder | None = None) -> None:
        self.embedder = embedder or ChunkEmbedder()
        self._lock = threading.Lock()
        # db path -> (vector generation, chunk ids [n], matrix [n, dim])
        self._matrices: dict[str, tuple[tuple, np.ndarray, np.ndarray]] = {}

    def _matrix(self, store: IndexStore) -> tuple[np.ndarray, np.ndarray]:
        key, generation = str(store.path), store.vector_generation()
        with self._lock:
            cached = self._matrices.get(key)
            if cached is not None and cached[0] == generation:
                return cached[1], cached[2]
        if store.vector_model() != self.embedder.model_id:
            ids, matrix = np.zeros(0, dtype=np.int64), blob_to_vectors([])
        else:
            rows = list(store.vector_rows())
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            matrix = blob_to_vectors([r[1] for r in rows])  # [n, dim]
        with self._lock:
            self._matrices[key] = (generation, ids, matrix)
        return ids, matrix

    def has_vectors(self, store: IndexStore) -> bool:
        return store.vector_model() == self.embedder.model_id and store.vector_counts()[0] > 0

    def hits(self, store: IndexStore, query: str, limit: int) -> list[SearchHit]:
        """The `limit` chunks closest to the query, best first; [] when nothing is embedded."""
        ids, matrix = self._matrix(store)
        if not len(ids) or limit <= 0 or not query.strip():
            return []
        scores = matrix @ self.embedder.embed_query(query)  # [n]
        top = np.argpartition(-scores, min(limit, len(ids)) - 1)[:limit]
        top = top[np.argsort(-scores[top], kind="stable")]
        rows = store.chunks_by_id(int(ids[i]) for i in top)
        hits = []
        for i in top:
            row = rows.get(int(ids[i]))
            if row is not None:
                hits.append(SearchHit(path=row.path, rel=row.rel, start_line=row.start_line,
                                      end_line=row.end_line, symbol=row.symbol, score=float(scores[i]),
                                      text=row.text))
        return hits


_DEFAULT: SemanticRanker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_ranker() -> SemanticRanker | None:
    """The process-wide ranker with the default settings, or None without the `embeddings` extra."""
    global _DEFAULT
    if not embeddings_available():
        return None
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SemanticRanker()
        return _DEFAULT
