"""Semantic ranking over the index: chunk vectors computed in the background, searched by cosine.

- `embed_pending(store, embedder)` embeds the chunks that have no vector yet, in small committed
  batches: a chunk whose embedded text (its head) is already known by its content key gets that
  vector back without running the model, so after an edit only the changed chunks are embedded.
- `VectorCache` is a second, shared store of vectors by content key (one SQLite file per model
  setting in the user's cache): a rebuilt index, another checkout of the same code, or a test run
  over the same tree gets its vectors from there.
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
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import default_cache_dir
from ..errors import IndexStoreError, SquidcodeError
from ..foreground import idle_event, pause_for_foreground, set_worker_idle_event
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
    "VectorCache",
    "default_vector_cache_path",
    "EmbedReport",
    "EmbeddingProcess",
    "SemanticRanker",
    "default_ranker",
    "embed_pending",
    "store_searcher",
]

log = logging.getLogger(__name__)

EMBED_NICE = 19
# Chunks read, embedded and committed together: small enough that a stop request or a killed
# process loses little, large enough for the model's batches.
_STEP_CHUNKS = 128
_WORKER_POLL_S = 0.5
_QUERY_CACHE_SIZE = 256


def default_vector_cache_path(model_id: str) -> Path:
    slug = "".join(c if c.isalnum() or c in "-." else "_" for c in model_id)
    return default_cache_dir() / "embeddings" / f"{slug}.sqlite3"


class VectorCache:
    """Vectors by content key, shared by every index on the machine; a lost or damaged cache file
    only costs recomputation (it is recreated, never fatal)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self._conn = self._open()
            except sqlite3.DatabaseError as exc:
                # Only a cache: a damaged file is replaced by an empty one.
                log.warning("the vector cache %s is unusable (%s); starting it afresh", self.path, exc)
                for path in (self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))):
                    path.unlink(missing_ok=True)
                self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IndexStoreError(f"cannot create the vector cache folder {self.path.parent}: {exc}") from exc
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS vectors(key TEXT PRIMARY KEY, vec BLOB NOT NULL) "
                         "WITHOUT ROWID")
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def get(self, keys: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        with self._lock:
            try:
                conn = self._connection()
                for start in range(0, len(keys), 500):
                    part = keys[start:start + 500]
                    marks = ",".join("?" * len(part))
                    found.update(conn.execute(f"SELECT key, vec FROM vectors WHERE key IN ({marks})", part))
            except (sqlite3.Error, IndexStoreError) as exc:
                log.warning("the vector cache %s cannot be read (%s); recomputing", self.path, exc)
        return found

    def put(self, vectors: dict[str, bytes]) -> None:
        if not vectors:
            return
        with self._lock:
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR IGNORE INTO vectors(key, vec) VALUES (?, ?)", vectors.items())
                conn.execute("COMMIT")
            except (sqlite3.Error, IndexStoreError) as exc:
                if self._conn is not None and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                log.warning("the vector cache %s cannot be written: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


@dataclass
class EmbedReport:
    embedded: int = 0  # chunks that ran through the model
    reused: int = 0  # chunks whose vector was already stored under their content key
    cached: int = 0  # of those, found in the shared VectorCache rather than the index
    pruned: int = 0  # vectors dropped because no chunk points at them any more
    seconds: float = 0.0
    stopped: bool = False
    rates: list[float] = field(default_factory=list)  # chunks/s of each model step

    @property
    def chunks_per_s(self) -> float:
        return self.embedded / self.seconds if self.seconds else 0.0


def embed_pending(store: IndexStore, embedder: ChunkEmbedder, should_stop: Callable[[], bool] | None = None,
                  step: int = _STEP_CHUNKS, cache: VectorCache | None = None,
                  progress: Callable[[int], None] | None = None) -> EmbedReport:
    """Give every chunk without a vector one (from the index, the shared `cache`, or the model);
    returns what was done. Stops early when asked to. `progress` hears how many chunks have been
    given one so far."""
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
        new = cache.get(list(todo)) if cache is not None and todo else {}
        report.cached += len(new)
        todo = {key: text for key, text in todo.items() if key not in new}
        if todo:
            t0 = time.monotonic()
            vectors = embedder.embed(list(todo.values()))
            report.rates.append(len(todo) / max(time.monotonic() - t0, 1e-9))
            computed = {key: vector_to_blob(v) for key, v in zip(todo, vectors, strict=True)}
            if cache is not None:
                cache.put(computed)
            new.update(computed)
        store.set_chunk_vectors([(chunk_id, key) for chunk_id, _, key in keyed], new)
        report.embedded += len(todo)
        report.reused += len(keyed) - len(todo)
        if progress is not None:
            progress(report.embedded + report.reused)
    report.stopped = stop()
    if not report.stopped:
        report.pruned = store.prune_vectors()
    report.seconds = time.monotonic() - started
    return report


# --- the background process ---------------------------------------------------------------------


def _worker_main(db_path: str, config: EmbedderConfig, wake, stop, parent_pid: int,
                 cache_path: str | None, idle_event=None) -> None:
    """The embedding process: nice, one torch thread, embed whenever woken, leave with the parent,
    and wait out the parent's foreground work (`context.foreground`) between batches."""
    set_worker_idle_event(idle_event)
    try:
        os.nice(EMBED_NICE)
    except OSError as exc:
        log.debug("could not lower the embedding process's priority: %s", exc)
    import torch

    torch.set_num_threads(max(1, config.threads))
    embedder = ChunkEmbedder(config)
    store = IndexStore(Path(db_path))
    cache = VectorCache(Path(cache_path)) if cache_path else None

    def should_stop() -> bool:  # asked before each batch: the place to give way, too
        pause_for_foreground()
        return stop.is_set() or os.getppid() != parent_pid

    try:
        while not should_stop():
            if not wake.wait(_WORKER_POLL_S):
                continue
            wake.clear()
            report = embed_pending(store, embedder, should_stop, cache=cache)
            if report.embedded or report.pruned:
                log.info("embedded %d chunks (%d reused) in %.1fs", report.embedded, report.reused,
                         report.seconds)
    except (SquidcodeError, OSError) as exc:
        log.error("embedding stopped: %s", exc)
    finally:
        store.close()
        if cache is not None:
            cache.close()


class EmbeddingProcess:
    """A background process that keeps a store's chunk vectors current (see `_worker_main`)."""

    def __init__(self, db_path: Path, config: EmbedderConfig | None = None,
                 cache_path: Path | None = None) -> None:
        """`cache_path`: the shared `VectorCache` file (None: no shared cache)."""
        self.db_path = Path(db_path)
        self.config = config or EmbedderConfig()
        context = multiprocessing.get_context("spawn")
        self._wake = context.Event()
        self._stop = context.Event()
        self._process = context.Process(
            target=_worker_main, name="squid-embed", daemon=True,
            args=(str(self.db_path), self.config, self._wake, self._stop, os.getpid(),
                  str(cache_path) if cache_path else None, idle_event()),
        )

    def start(self) -> None:
        self._process.start()

    def wake(self) -> None:
        """There are (or may be) chunks without vectors: embed them."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the process to stop; terminate it if it does not within `timeout` (it may be loading
        the model). Killing it loses at most the batch in flight: each one commits on its own."""
        self._stop.set()
        if self._process.pid is None:
            return
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10.0)


# --- ranking --------------------------------------------------------------------------------------


class SemanticRanker:
    """Cosine search over a store's chunk vectors. Thread-safe; the query model loads on first use."""

    def __init__(self, embedder: ChunkEmbedder | None = None) -> None:
        self.embedder = embedder or ChunkEmbedder()
        self._lock = threading.Lock()
        # db path -> (vector generation, chunk ids [n], matrix [n, dim])
        self._matrices: dict[str, tuple[tuple, np.ndarray, np.ndarray]] = {}
        # Recent query vectors: an editor asks the same question again (retries, other modes, k).
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()

    def query_vector(self, query: str) -> np.ndarray:
        with self._lock:
            cached = self._queries.get(query)
            if cached is not None:
                self._queries.move_to_end(query)
                return cached
        vector = self.embedder.embed_query(query)
        with self._lock:
            self._queries[query] = vector
            while len(self._queries) > _QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector

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
        scores = matrix @ self.query_vector(query)  # [n]
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


def store_searcher(store: IndexStore) -> Callable[[str, int], list[SearchHit]]:
    """Search of `store` for a command that runs without a server (`squidcode search`, `squidcode
    agent`): fused with the default semantic ranker where the index holds its vectors (a server or
    `python -m context.index.semantic PATH` embedded them), lexical otherwise."""
    from .retrieval import search

    ranker = default_ranker()
    semantic = ranker if ranker is not None and ranker.has_vectors(store) else None
    return lambda query, k: search(store, query, k, semantic=semantic)


def main(argv: list[str] | None = None) -> int:
    """`python -m context.index.semantic PATH`: embed the chunks of PATH's index now (niced, one
    thread), indexing PATH first if needed."""
    import argparse

    from .indexer import Indexer, default_index_path

    parser = argparse.ArgumentParser(prog="python -m context.index.semantic", description=main.__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--db", type=Path, help="the index database (default: PATH's in the user cache)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-cache", action="store_true", help="do not use the shared vector cache")
    args = parser.parse_args(argv)
    root = args.path.resolve()
    try:
        os.nice(EMBED_NICE)
    except OSError:
        pass
    import torch

    torch.set_num_threads(max(1, args.threads))
    with IndexStore(args.db or default_index_path([root])) as store:
        if store.stats(references=False)["files"] == 0:
            Indexer([root], store).index_all()
        config = EmbedderConfig(threads=args.threads)
        cache = None if args.no_cache else VectorCache(default_vector_cache_path(config.model_id))
        report = embed_pending(store, ChunkEmbedder(config), cache=cache)
        done, total = store.vector_counts()
    print(f"embedded {report.embedded} chunks ({report.reused} reused, {report.cached} of them from the "
          f"shared cache; {report.pruned} pruned) in "
          f"{report.seconds:.1f}s, model load included ({report.chunks_per_s:.1f}/s); "
          f"{done}/{total} chunks have vectors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
