"""The index of a workspace kept current in the background: what an editor session runs.

One `IndexService` owns the store, the indexer and the watcher for a set of roots. The first full
pass runs on its own low-priority thread (the editor's requests never wait for it), then the watcher
keeps the index current; editor events (saves, watched-file changes, unsaved buffers) feed the same
indexer.

With the `embeddings` extra installed, a separate niced embedding process (`EmbeddingProcess`) gives
new and changed chunks their vectors after the first pass and after each watcher batch, and search
fuses in the semantic ranker once its query model is loaded (never waiting for it).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from ..config import IndexConfig
from ..errors import SquidcodeError
from .embeddings import embeddings_available
from .indexer import Indexer, default_index_path, prune_stale_indexes
from .retrieval import search
from .semantic import EmbeddingProcess, SemanticRanker, default_ranker, default_vector_cache_path
from .store import IndexStore, SymbolRow
from .types import IndexReport, SearchHit
from .watcher import IndexWatcher

__all__ = ["IndexService"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
DoneCallback = Callable[[IndexReport | None, str | None], None]

# The embedding process starts this long after the first pass: short sessions (and tests) never pay
# for loading the model, and the editor's first requests after indexing get the CPU.
EMBED_START_DELAY_S = 3.0


def _lower_this_threads_priority() -> None:
    # On Linux a thread is a task with its own nice value: only the indexing thread yields the CPU.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError) as exc:
        log.debug("could not lower the indexing thread's priority: %s", exc)


class IndexService:
    """Background indexing, watching and querying for one workspace."""

    def __init__(self, roots: Iterable[Path], config: IndexConfig, db_path: Path | None = None,
                 embeddings: bool | None = None):
        """`embeddings`: run the semantic ranker (default: the config's `embeddings` setting where
        it has one, else on whenever the extra is installed)."""
        self.roots = [Path(r).resolve() for r in roots]
        self.config = config
        self.db_path = db_path or default_index_path(self.roots)
        self.store = IndexStore(self.db_path)
        self.indexer = Indexer(self.roots, self.store, max_file_bytes=config.max_file_bytes)
        self.watcher: IndexWatcher | None = None
        self.state = "idle"  # idle | indexing | ready | error | stopped
        self.last_report: IndexReport | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        # Held while the first pass's thread starts the watcher and while `stop` stops it: a stop that
        # lands as the pass ends either finds the watcher started, or keeps it from starting.
        self._watcher_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if embeddings is None:
            embeddings = bool(getattr(config, "embeddings", True))
        wanted = embeddings and embeddings_available()
        self.ranker: SemanticRanker | None = default_ranker() if wanted else None
        self.embedding: EmbeddingProcess | None = None
        self._ranker_ready = threading.Event()
        self._first_pass = threading.Event()  # set when the first pass ended (done, failed or stopped)
        self._path_listeners: list[Callable[[list[Path]], None]] = []

    def start(self, on_progress: ProgressCallback | None = None, on_done: DoneCallback | None = None,
              on_update: Callable[[], None] | None = None) -> None:
        """Index in the background, then watch. Callbacks run on the indexing or watcher thread:
        `on_done` after the first pass, `on_update` after each later committed change."""
        self.state = "indexing"
        self._thread = threading.Thread(
            target=self._run, args=(on_progress, on_done, on_update), name="squid-index", daemon=True
        )
        self._thread.start()

    def _run(self, on_progress: ProgressCallback | None, on_done: DoneCallback | None,
             on_update: Callable[[], None] | None) -> None:
        _lower_this_threads_priority()
        try:
            report = self.indexer.index_all(progress=on_progress, should_stop=self._stop.is_set)
        except (SquidcodeError, OSError) as exc:
            self.state, self.error = "error", str(exc)
            log.error("indexing failed: %s", exc)
            self._first_pass.set()
            if on_done:
                on_done(None, self.error)
            return
        with self._watcher_lock:
            if self._stop.is_set():
                self._first_pass.set()
                return
            self.last_report = report
            self.state = "ready"
            log.info("index ready: %d files, %d chunks, %d symbols in %.1fs",
                     report.files, report.chunks, report.symbols, report.seconds)
            # Without `watch` the watcher still runs, fed by the editor's own events only.
            watcher = IndexWatcher(
                self.indexer, debounce_s=self.config.debounce_ms / 1000, observe=self.config.watch,
                on_batch=lambda *_: self._after_batch(on_update),
            )
            watcher.path_listeners = self._path_listeners
            watcher.start()
            self.watcher = watcher
        # Buffers opened during the first pass may have been read before their overlay was set.
        self.watcher.notify_changed(Path(p) for p in self.indexer.overlay_paths())
        self._first_pass.set()
        if on_done:
            on_done(report, None)
        if self.db_path == default_index_path(self.roots):
            # Indexes of folders that are gone (temporary checkouts, deleted projects) pile up otherwise.
            prune_stale_indexes(self.db_path.parent.parent, keep=[self.db_path.parent])
        if self.ranker is not None and not self._stop.wait(EMBED_START_DELAY_S):
            self._start_semantic()

    def _after_batch(self, on_update: Callable[[], None] | None) -> None:
        if self.embedding is not None:
            self.embedding.wake()
        if on_update:
            on_update()

    def _start_semantic(self) -> None:
        """Start the embedding process, then load the query model here (on this niced thread)."""
        config = self.ranker.embedder.config
        self.embedding = EmbeddingProcess(self.db_path, config, default_vector_cache_path(config.model_id))
        try:
            self.embedding.start()
            self.embedding.wake()
            self.ranker.embedder.load()
        except (SquidcodeError, OSError) as exc:
            log.warning("semantic search unavailable: %s", exc)
            return
        finally:
            if self._stop.is_set():
                self.embedding.stop()  # stop() ran while this was starting
        self._ranker_ready.set()

    def add_path_listener(self, listener: Callable[[list[Path]], None]) -> None:
        """Call `listener(paths)` on the watcher's thread after each batch of changed files."""
        self._path_listeners.append(listener)

    def wait_until_indexed(self, timeout: float | None = None) -> bool:
        """Block until the first pass has ended; True if the index is ready."""
        if self._thread is not None:
            self._first_pass.wait(timeout)
        return self.state == "ready"

    def stop(self) -> None:
        with self._watcher_lock:
            self._stop.set()
            watcher = self.watcher
        if watcher is not None:
            watcher.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.embedding is not None:
            self.embedding.stop()
        self.store.close()
        self.state = "stopped"

    # -- editor events -----------------------------------------------------------------------

    def notify_saved(self, path: Path) -> None:
        if self.watcher is not None:
            self.watcher.notify_saved(path)

    def notify_changed(self, paths: Iterable[Path]) -> None:
        if self.watcher is not None:
            self.watcher.notify_changed(list(paths))

    def set_overlay(self, path: Path, text: str) -> None:
        """Record an unsaved buffer; it is indexed off the caller's thread (the editor's loop)."""
        if not self._inside_roots(path):
            return
        if self.watcher is not None:
            self.watcher.set_overlay(path, text)
        else:
            # The first pass is still running and reads overlays when it reaches the file.
            self.indexer.set_overlay(path, text, update=False)

    def clear_overlay(self, path: Path) -> None:
        if not self._inside_roots(path):
            return
        if self.watcher is not None:
            self.watcher.clear_overlay(path)
        else:
            self.indexer.clear_overlay(path, update=False)

    def _inside_roots(self, path: Path) -> bool:
        return any(path.is_relative_to(root) for root in self.roots)

    # -- queries ------------------------------------------------------------------------------

    def symbols(self, query: str, limit: int = 200) -> list[SymbolRow]:
        return self.store.symbols_prefix(query, limit)

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        """Fused search; the semantic ranker joins once its model is loaded (never waited for)."""
        ranker = self.ranker if self._ranker_ready.is_set() else None
        return search(self.store, query, k, semantic=ranker)

    def wait_until_semantic(self, timeout: float | None = None) -> bool:
        """Block until semantic search is ready (the query model loaded); False without it."""
        return self.ranker is not None and self._ranker_ready.wait(timeout)

    def status(self) -> dict:
        stats = self.store.stats() if self.state != "stopped" else {}
        if self.ranker is not None and stats:
            stats["embedded"] = self.store.vector_counts()[0]
        report = self.last_report
        return {
            "state": self.state,
            "roots": [str(r) for r in self.roots],
            **stats,
            "skipped": dict(report.skipped) if report else {},
            "seconds": round(report.seconds, 3) if report else None,
            "error": self.error,
        }
