"""Incremental indexing of workspace roots into an `IndexStore`.

A full pass (`index_all`) walks the roots, skips files whose (mtime, size) match what the store
recorded, reads and hashes the rest, parses only those whose content hash changed, writes them in
transactions of a few dozen files, and drops files that disappeared. Each batch is committed on
its own and each file's rows are replaced inside it, so a pass killed at any point leaves a
consistent index and the next pass finishes the work.

Parsing is CPU-bound; large passes (POOL_THRESHOLD files or more) parse in a pool of two niced
worker processes, one batch ahead of the calling thread, which writes (on the stdlib: ~9 s instead of
~15 s inline on two cores). Workers are spawned, not forked (the server has threads), so a program
using the pool must guard its `__main__` as multiprocessing requires; if the pool breaks, the rest is
parsed inline. Small updates (editor saves, watcher events) run inline.

A full pass gives way to foreground work (`context.foreground`): while the server generates for a
user, the workers wait before each file and the writer between transactions.

Unsaved editor buffers are "overlays": while one is set, its text is what gets indexed for that path.
Such rows carry mtime -1, so once the overlay is gone the disk's content is always re-read.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import multiprocessing
import os
import shutil
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import default_cache_dir
from ..foreground import idle_event, pause_for_foreground, set_worker_idle_event
from .parse import language_for, parse_source
from .store import IndexStore, chunk_terms
from .types import IndexReport, ParsedFile, SourceFile
from .walk import classify_file, walk_roots

__all__ = [
    "Indexer",
    "default_index_path",
    "content_hash",
    "lower_thread_priority",
    "OVERLAY_MTIME",
    "merge_reports",
    "prune_stale_indexes",
]

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
ShouldStop = Callable[[], bool]

# The mtime recorded for content that came from an editor buffer rather than the disk.
OVERLAY_MTIME = -1.0
BATCH_FILES = 256
# Below this many files to parse, starting worker processes costs more than it saves.
POOL_THRESHOLD = 200
TASK_FILES = 16
# Files per write transaction of a full pass (it may pause between them).
WRITE_GROUP_FILES = 32
WORKER_NICE = 10


def default_index_path(roots: Iterable[Path]) -> Path:
    """Where the index of these roots lives: one database per set of roots, in the user's cache."""
    key = "\n".join(sorted(str(Path(r).resolve()) for r in roots))
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest()
    return default_cache_dir() / "index" / digest / "index.sqlite3"


# An index that records no file and has not been written for this long is dropped by the prune.
EMPTY_INDEX_MAX_AGE_S = 7 * 24 * 3600


def prune_stale_indexes(index_dir: Path | None = None, keep: Iterable[Path] = (),
                        now: float | None = None) -> list[Path]:
    """Delete the index folders (under the user cache's `index/`) of roots that no longer exist: every
    root their files were indexed under is gone, or they hold no file and are a week old. Folders
    in `keep` (databases in use) and anything that cannot be read are left alone. Returns the
    folders removed."""
    index_dir = Path(index_dir) if index_dir else default_cache_dir() / "index"
    kept = {Path(p).resolve() for p in keep}
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        folders = [f for f in index_dir.iterdir() if f.is_dir() and not f.is_symlink()]
    except OSError:
        return removed
    for folder in folders:
        db = folder / "index.sqlite3"
        if folder.resolve() in kept or db.resolve() in kept or not db.is_file():
            continue
        if _is_stale(db, now):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.info("removed the index of vanished roots at %s", folder)
    return removed


def _is_stale(db: Path, now: float) -> bool:
    try:
        # Before opening: a reader may create the -shm file.
        newest = max(p.stat().st_mtime for p in db.parent.glob(db.name + "*"))
        conn = sqlite3.connect(db.absolute().as_uri() + "?mode=ro", uri=True, timeout=1)
        try:
            roots = [row[0] for row in conn.execute("SELECT DISTINCT root FROM files")]
        finally:
            conn.close()
    except (sqlite3.Error, OSError, ValueError):
        return False  # busy, damaged (the store moves it aside itself) or vanished meanwhile
    if roots:
        return not any(Path(root).exists() for root in roots)
    return now - newest > EMPTY_INDEX_MAX_AGE_S


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def lower_thread_priority(increment: int = WORKER_NICE) -> None:
    """Make the calling thread (Linux: threads have their own nice value) or process yield the CPU."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), increment)
    except (AttributeError, OSError) as exc:
        log.debug("could not lower the indexing priority: %s", exc)


def _init_worker(parent_pid: int, idle_event=None) -> None:
    set_worker_idle_event(idle_event)  # pause while the server generates for a user
    try:
        os.nice(WORKER_NICE)
    except OSError as exc:
        log.debug("could not lower a worker's priority: %s", exc)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="squid-orphan-check",
                     daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    # Every pool worker holds the task queue's write end, so a worker whose indexing process was
    # killed never sees EOF and would wait forever: leave once the parent is gone.
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


@dataclass(frozen=True)
class _Job:
    path: str
    rel: str
    known_hash: str | None
    overlay: str | None


@dataclass(frozen=True)
class _Loaded:
    path: str
    digest: str | None = None
    parsed: ParsedFile | None = None  # None with a digest: content unchanged
    terms: list[str] | None = None  # the chunks' search terms, computed where the parsing ran
    size: int = 0
    error: str | None = None  # why the file could not be read


def _load(job: _Job) -> _Loaded:
    """Read (or take the overlay), hash, and parse if the content changed. Runs in workers too."""
    try:
        data = job.overlay.encode("utf-8") if job.overlay is not None else Path(job.path).read_bytes()
    except OSError as exc:
        return _Loaded(job.path, error=f"{type(exc).__name__}: {exc.strerror or exc}")
    digest = content_hash(data)
    if digest == job.known_hash:
        return _Loaded(job.path, digest, None, None, len(data))
    text = job.overlay if job.overlay is not None else data.decode("utf-8", errors="replace")
    try:
        parsed = parse_source(text, job.rel)
    except (ValueError, RecursionError) as exc:
        return _Loaded(job.path, error=f"cannot parse: {exc}")
    return _Loaded(job.path, digest, parsed, chunk_terms(parsed), len(data))


def _load_many(jobs: list[_Job], pause: bool = False) -> list[_Loaded]:
    """Read and parse `jobs`; with `pause`, each file first waits out foreground work."""
    loaded = []
    for job in jobs:
        if pause:
            pause_for_foreground()
        loaded.append(_load(job))
    return loaded


def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class Indexer:
    """Keeps a store in step with the files under some roots. Thread-safe: one update at a time."""

    def __init__(self, roots: list[Path], store: IndexStore, max_file_bytes: int = 1_000_000,
                 workers: int = 2, batch_files: int = BATCH_FILES) -> None:
        self.roots = [Path(r).absolute() for r in roots]
        self.store = store
        self.max_file_bytes = max_file_bytes
        self.workers = workers
        self.batch_files = batch_files
        self._overlays: dict[str, str] = {}
        self._lock = threading.RLock()
        # Paths an update wrote while a full pass was running: the pass's older reads must not win.
        self._fresh: set[str] | None = None

    # --- full pass ---

    def index_all(self, progress: Progress | None = None,
                  should_stop: ShouldStop | None = None) -> IndexReport:
        """Bring the whole index up to date with the roots; returns what was done."""
        started = time.monotonic()
        walk = walk_roots(self.roots, self.max_file_bytes)
        report = IndexReport(skipped=Counter(walk.skipped))
        known = self.store.file_hashes()
        current = {str(source.path) for source in walk.files}
        with self._lock:
            self._fresh = set()
            gone = [path for path in known if path not in current and path not in self._overlays]
            with self.store.transaction():
                report.removed = sum(self.store.remove_file(path) for path in gone)
        todo = [source for source in walk.files if self._needs_reading(source, known)]
        try:
            self._process(todo, known, report, progress, should_stop, full_pass=True)
        finally:
            with self._lock:
                self._fresh = None
        if report.parsed > 1000:
            self.store.optimize()
        return self._finish(report, started)

    def _needs_reading(self, source: SourceFile, known: dict[str, tuple[str, float, int]]) -> bool:
        path = str(source.path)
        if path in self._overlays:
            return True
        entry = known.get(path)
        return entry is None or (entry[1], entry[2]) != (source.mtime, source.size)

    def _finish(self, report: IndexReport, started: float) -> IndexReport:
        stats = self.store.stats(references=False)
        report.files, report.chunks, report.symbols = stats["files"], stats["chunks"], stats["symbols"]
        report.seconds = time.monotonic() - started
        return report

    # --- reading, parsing and writing batches ---

    def _process(self, sources: list[SourceFile], known: dict[str, tuple[str, float, int]],
                 report: IndexReport, progress: Progress | None, should_stop: ShouldStop | None,
                 full_pass: bool = False) -> None:
        by_path = {str(s.path): s for s in sources}
        jobs = [_Job(str(s.path), s.rel, known.get(str(s.path), (None,))[0], self._overlays.get(str(s.path)))
                for s in sources]
        total, done = len(jobs), 0
        if progress is not None:
            progress(0, total)
        for loaded in self._loaded_batches(jobs, should_stop, pause=full_pass):
            self._write(loaded, by_path, report, full_pass)
            done += len(loaded)
            if progress is not None:
                progress(done, total)

    def _loaded_batches(self, jobs: list[_Job], should_stop: ShouldStop | None,
                        pause: bool = False) -> Iterator[list[_Loaded]]:
        """Batches of loaded files, parsed in worker processes when there are many. With `pause`
        (a full pass), every file waits out foreground work first (`context.foreground`)."""
        stop = should_stop or (lambda: False)
        if self.workers > 0 and len(jobs) >= POOL_THRESHOLD:
            done = yield from self._pool_batches(jobs, stop)
            jobs = jobs[done:]
        for batch in _batches(jobs, self.batch_files):
            if stop():
                return
            yield _load_many(batch, pause)

    def _pool_batches(self, jobs: list[_Job], stop: ShouldStop) -> Iterator[list[_Loaded]]:
        """Parse in a process pool, one batch ahead of the writer; returns how many jobs it finished
        (fewer than all only if the pool broke, so the caller can carry on inline)."""
        context = multiprocessing.get_context("spawn")
        pool = cf.ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                      initargs=(os.getpid(), idle_event()))
        batches = _batches(jobs, self.batch_files)
        pending: deque[list[cf.Future]] = deque()
        finished = 0
        try:
            for _ in range(2):
                self._submit(pool, next(batches, None), pending)
            while pending:
                if stop():
                    return len(jobs)
                futures = pending.popleft()
                loaded = [item for future in futures for item in future.result()]
                self._submit(pool, next(batches, None), pending)
                finished += len(loaded)
                yield loaded
        except BrokenProcessPool as exc:
            log.warning("the indexing worker pool broke (%s); parsing the rest in this process", exc)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return finished

    @staticmethod
    def _submit(pool: cf.ProcessPoolExecutor, batch: list[_Job] | None, pending: deque) -> None:
        if batch is not None:
            pending.append([pool.submit(_load_many, part, True) for part in _batches(batch, TASK_FILES)])

    def _write(self, loaded: list[_Loaded], sources: dict[str, SourceFile], report: IndexReport,
               full_pass: bool) -> None:
        # A full pass writes in groups and waits out foreground work between them, outside the
        # lock: its Python work shares the GIL with generation, and an editor save must not wait.
        for group in _batches(loaded, WRITE_GROUP_FILES if full_pass else len(loaded) or 1):
            if full_pass:
                pause_for_foreground()
            with self._lock, self.store.transaction():
                for item in group:
                    if full_pass and self._fresh is not None and item.path in self._fresh:
                        continue
                    self._write_one(item, sources[item.path], report)

    def _write_one(self, item: _Loaded, source: SourceFile, report: IndexReport) -> None:
        if item.error is not None:
            log.info("not indexing %s: %s", item.path, item.error)
            report.skipped["unreadable"] += 1
            if self.store.remove_file(item.path):
                report.removed += 1
            return
        if item.path in self._overlays:
            source = replace(source, size=item.size, mtime=OVERLAY_MTIME)
        if item.parsed is None:
            self.store.touch_file(item.path, source.size, source.mtime)
            return
        self.store.replace_file(source, item.digest, item.parsed, item.terms)
        report.parsed += 1

    # --- updates for individual paths ---

    def update_paths(self, paths: Iterable[Path]) -> IndexReport:
        """Re-check these paths (files or folders) against the disk: index what should be indexed,
        drop what is gone or now skipped."""
        started = time.monotonic()
        report = IndexReport()
        with self._lock:
            sources: list[SourceFile] = []
            for path in dict.fromkeys(Path(p).absolute() for p in paths):
                sources.extend(self._classify(path, report))
            known = {str(s.path): self._known(s.path) for s in sources}
            self._process(sources, known, report, None, None)
            if self._fresh is not None:
                self._fresh.update(str(s.path) for s in sources)
        return self._finish(report, started)

    def _known(self, path: Path) -> tuple[str, float, int]:
        row = self.store.file(path)
        return (row.content_hash, row.mtime, row.size) if row else (None, 0.0, 0)

    def _classify(self, path: Path, report: IndexReport) -> list[SourceFile]:
        """The files to (re)index for one changed path; drops from the store what must not stay."""
        root = self._root_of(path)
        if root is None:
            return []
        if path.is_dir() and not path.is_symlink():
            return [s for file in _files_under(path) for s in self._classify(file, report)]
        result = classify_file(root, path, self.max_file_bytes, roots=self.roots)
        if isinstance(result, SourceFile):
            return [result]
        overlay = self._overlays.get(str(path))
        if overlay is not None and result == "unreadable" and not path.exists():
            # An editor buffer for a file not saved yet.
            size = len(overlay.encode("utf-8"))
            return [SourceFile(root, path, path.relative_to(root).as_posix(), size, OVERLAY_MTIME)]
        if path.exists():
            report.skipped[result] += 1
        removed = self.store.remove_file(path) or self.store.remove_under(path)
        report.removed += int(removed)
        return []

    def _root_of(self, path: Path) -> Path | None:
        # The innermost root wins when roots nest.
        matches = [root for root in self.roots if path == root or path.is_relative_to(root)]
        return max(matches, key=lambda r: len(r.parts)) if matches else None

    def remove_paths(self, paths: Iterable[Path]) -> IndexReport:
        """Drop these files (or everything under these folders) from the index."""
        started = time.monotonic()
        report = IndexReport()
        with self._lock, self.store.transaction():
            for path in paths:
                path = Path(path).absolute()
                report.removed += int(self.store.remove_file(path)) or self.store.remove_under(path)
        return self._finish(report, started)

    def move_path(self, old: Path, new: Path) -> IndexReport:
        """A file or folder moved: files whose content and language are unchanged keep their rows."""
        started = time.monotonic()
        old, new = Path(old).absolute(), Path(new).absolute()
        with self._lock:
            if new.is_dir() and not new.is_symlink():
                rows = self.store.files_under(old)
                pairs = [(Path(r.path), new / Path(r.path).relative_to(old)) for r in rows]
                renamed = {n for o, n in pairs if self._rename(o, n)}
                todo = [f for f in _files_under(new) if f not in renamed]
            else:
                todo = [] if self._rename(old, new) else [new]
            report = self.remove_paths([old])
            if todo:
                merge_reports(report, self.update_paths(todo))
        return self._finish(report, started)

    def _rename(self, old: Path, new: Path) -> bool:
        row = self.store.file(old)
        root = self._root_of(new)
        if row is None or root is None or old == new or not new.is_file() or new.is_symlink():
            return False
        target = classify_file(root, new, self.max_file_bytes, roots=self.roots)
        if not isinstance(target, SourceFile) or not self._same_content(row.content_hash, target, old):
            return False
        self.store.rename_file(old, target)
        if self._fresh is not None:
            self._fresh.add(str(new))
        return True

    def _same_content(self, digest: str, target: SourceFile, old: Path) -> bool:
        if language_for(target.rel) != language_for(old.name) or str(target.path) in self._overlays:
            return False
        try:
            return content_hash(target.path.read_bytes()) == digest
        except OSError:
            return False

    # --- overlays ---

    def set_overlay(self, path: Path, text: str, update: bool = True) -> IndexReport:
        """Index an editor buffer's text for `path` instead of the disk's, until cleared. This parses
        and writes now (and waits for a running pass's current batch): call it off the event loop,
        or pass `update=False` and let something else (`IndexWatcher.set_overlay`) update later."""
        path = Path(path).absolute()
        self._overlays[str(path)] = text
        return self.update_paths([path]) if update else IndexReport()

    def clear_overlay(self, path: Path, update: bool = True) -> IndexReport:
        """Forget a buffer's text and index the disk's content again."""
        path = Path(path).absolute()
        if self._overlays.pop(str(path), None) is None or not update:
            return IndexReport()
        return self.update_paths([path])

    def overlay_paths(self) -> list[str]:
        return list(self._overlays)


def merge_reports(total: IndexReport, part: IndexReport) -> IndexReport:
    """Add one update's counts to a running report (file/chunk/symbol totals: the latest)."""
    total.files, total.chunks, total.symbols = part.files, part.chunks, part.symbols
    total.skipped.update(part.skipped)
    total.parsed += part.parsed
    total.removed += part.removed
    total.seconds += part.seconds
    return total


def _files_under(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            yield Path(dirpath, name)
