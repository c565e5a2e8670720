"""Keep the index current while files change: a watchdog observer on the roots feeding the indexer.

File events (the observer's, and the editor's didSave / didChangeWatchedFiles, all through the
`notify_*` methods) go into one pending set. A worker thread waits until events have been quiet for
the debounce interval (or a cap has passed since the first one), then applies them: moves first, as
renames that keep a file's rows when its content is unchanged, then every other touched path is
re-checked against the disk (indexed, or dropped if gone or now skipped). Events in VCS internals
and cache folders never reach the queue.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import (
    DirModifiedEvent,
    FileClosedNoWriteEvent,
    FileOpenedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from ..errors import SquidcodeError
from .indexer import Indexer, lower_thread_priority, merge_reports
from .types import IndexReport
from .walk import ALWAYS_SKIP_DIRS

__all__ = [
    "IndexWatcher",
    "IGNORED_DIR_NAMES",
    "FULL_PASS_PATHS",
    "PRUNING_TESTED_WATCHDOG",
    "prunes_ignored_folders",
]

log = logging.getLogger(__name__)

BatchCallback = Callable[[IndexReport], None]

# The walk's VCS and cache folders: their churn never changes the index.
IGNORED_DIR_NAMES = ALWAYS_SKIP_DIRS
# Beyond this many changed paths in one batch, a full (incremental) pass is cheaper.
FULL_PASS_PATHS = 500
_IGNORED_EVENTS = (DirModifiedEvent, FileOpenedEvent, FileClosedNoWriteEvent)

# The (major, minor) watchdog releases whose inotify internals the pruned observer (`_observer`) was
# tested with: watchdog has no public way to leave folders out of a recursive watch, so it subclasses
# private hooks (InotifyWatchGroup._add_all_callbacks/_add_callback, InotifyEmitter._inotify and
# _inotify_fd, BaseObserver._emitter_class). Tested with 7.1.0 (tests/unit/index/test_watcher.py).
# Not 7.0: its InotifyWatchGroup._recursive_simulate looks up a watch for every folder below a new
# one and raises KeyError on a pruned one (a new folder holding node_modules); 6.x and older have no
# InotifyWatchGroup. Any other version gets watchdog's plain observer: the same events, with
# inotify watches on the ignored folders too. Add a release here only after the watcher tests pass on it.
PRUNING_TESTED_WATCHDOG = frozenset({(7, 1)})


class _Handler(FileSystemEventHandler):
    """Forwards watchdog's events to the watcher through its public notify_* methods."""

    def __init__(self, watcher: IndexWatcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if isinstance(event, _IGNORED_EVENTS):
            return
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if dest:
            self.watcher.notify_moved(Path(src), Path(dest))
        else:
            self.watcher.notify_changed([Path(src)])


class IndexWatcher:
    """Watches the indexer's roots and applies debounced changes on its own thread."""

    def __init__(self, indexer: Indexer, debounce_s: float = 0.05,
                 on_batch: BatchCallback | None = None, max_delay_s: float = 1.0,
                 observe: bool = True) -> None:
        """`on_batch` runs on the watcher's thread after each committed update; `max_delay_s` caps how
        long a stream of events can postpone one; `observe=False` relies on `notify_*` alone."""
        self.indexer = indexer
        self.observe = observe
        self.debounce_s = debounce_s
        self.max_delay_s = max(max_delay_s, debounce_s)
        self.on_batch = on_batch
        # Called on the watcher's thread with the changed paths of each applied batch (Squid drops
        # the KV caches of changed files); a failing listener is logged and skipped.
        self.path_listeners: list[Callable[[list[Path]], None]] = []
        self.batches = 0
        self._cond = threading.Condition()
        self._paths: dict[Path, None] = {}
        self._moves: list[tuple[Path, Path]] = []
        self._first_at = 0.0
        self._last_at = 0.0
        self._busy = False
        self._stopping = False
        self._observer: Observer | None = None
        self._thread: threading.Thread | None = None
        store = indexer.store.path.absolute()
        self._own_files = {store, *(store.with_name(store.name + s) for s in ("-wal", "-shm", "-journal"))}

    # --- lifecycle ---

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="squid-index-watch", daemon=True)
        self._thread.start()
        if not self.observe:
            return
        observer = _observer(IGNORED_DIR_NAMES)
        handler = _Handler(self)
        try:
            for root in _outermost(self.indexer.roots):
                observer.schedule(handler, str(root), recursive=True)
            observer.start()
        except OSError as exc:
            # Typically the inotify watch limit; editor notifications still keep the index current.
            log.warning("cannot watch %s for changes (%s); only editor saves will update the index",
                        ", ".join(map(str, self.indexer.roots)), exc)
            return
        self._observer = observer

    def stop(self, timeout: float = 10.0) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout)
            self._observer = None
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> IndexWatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- feeding the queue ---

    def notify_saved(self, path: Path) -> None:
        """The editor saved `path` (didSave)."""
        self._add_paths([Path(path)])

    def notify_changed(self, paths: Iterable[Path]) -> None:
        """Files were created, changed or deleted (the observer's events; the editor's
        didChangeWatchedFiles)."""
        self._add_paths([Path(p) for p in paths])

    def notify_moved(self, old: Path, new: Path) -> None:
        """A file or folder moved from `old` to `new`: its rows follow it when the content is unchanged."""
        old, new = Path(old), Path(new)
        old_wanted, new_wanted = self._wanted(old), self._wanted(new)
        if old_wanted and new_wanted:
            with self._cond:
                self._moves.append((old, new))
                self._touch()
        elif old_wanted or new_wanted:
            # Moved into or out of an ignored folder: for the index, a deletion or a creation.
            self._add_paths([old if old_wanted else new])

    def set_overlay(self, path: Path, text: str) -> None:
        """An editor buffer's unsaved text for `path`: recorded now, indexed on the watcher's thread."""
        self.indexer.set_overlay(path, text, update=False)
        self._add_paths([Path(path).absolute()])

    def clear_overlay(self, path: Path) -> None:
        """The buffer was closed: the disk's content is indexed again, on the watcher's thread."""
        self.indexer.clear_overlay(path, update=False)
        self._add_paths([Path(path).absolute()])

    def _wanted(self, path: Path) -> bool:
        if path in self._own_files:
            return False
        # Only the part below a root counts: a root may itself live under, say, a "venv" folder.
        for root in self.indexer.roots:
            if path.is_relative_to(root):
                return IGNORED_DIR_NAMES.isdisjoint(path.relative_to(root).parts)
        return False

    def _add_paths(self, paths: list[Path]) -> None:
        wanted = [p for p in paths if self._wanted(p)]
        if wanted:
            with self._cond:
                self._paths.update(dict.fromkeys(wanted))
                self._touch()

    def _touch(self) -> None:
        now = time.monotonic()
        self._first_at = self._first_at or now
        self._last_at = now
        self._cond.notify_all()

    # --- applying ---

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until nothing is pending or being applied; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._paths or self._moves or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        lower_thread_priority(5)
        while True:
            with self._cond:
                if not self._wait_for_quiet():
                    return
                paths, moves = list(self._paths), self._moves
                self._paths, self._moves, self._first_at = {}, [], 0.0
                self._busy = True
            try:
                self._apply(paths, moves)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _wait_for_quiet(self) -> bool:
        """With the condition held: wait for events, then for the debounce; False when stopping."""
        while not (self._paths or self._moves):
            if self._stopping:
                return False
            self._cond.wait()
        while not self._stopping:
            now = time.monotonic()
            quiet_left = self._last_at + self.debounce_s - now
            cap_left = self._first_at + self.max_delay_s - now
            if quiet_left <= 0 or cap_left <= 0:
                return True
            self._cond.wait(min(quiet_left, cap_left))
        return False

    def _apply(self, paths: list[Path], moves: list[tuple[Path, Path]]) -> None:
        report = IndexReport()
        moved: set[Path] = set()
        replacements = self.indexer.store.replacements
        try:
            for old, new in moves:
                merge_reports(report, self.indexer.move_path(old, new))
                moved.update((old, new))
            rest = [p for p in paths if p not in moved]
            if len(rest) > FULL_PASS_PATHS:
                # A checkout or a build touched many files: one walk beats checking each path.
                merge_reports(report, self.indexer.index_all())
            elif rest:
                merge_reports(report, self.indexer.update_paths(rest))
            if self.indexer.store.replacements != replacements:
                # The database file was deleted or replaced: the new one holds only this batch.
                merge_reports(report, self.indexer.index_all())
        except (SquidcodeError, OSError) as exc:
            log.error("updating the index failed: %s", exc)
            return
        self.batches += 1
        changed = list(paths) + [old for old, _ in moves]
        for listener in list(self.path_listeners):
            try:
                listener(changed)
            except Exception:  # noqa: BLE001 - a listener must never stop the index
                log.exception("a changed-paths listener failed")
        if self.on_batch is not None:
            self.on_batch(report)


def _watchdog_version() -> tuple[int, int] | None:
    """The installed watchdog's (major, minor), or None when its metadata cannot say."""
    try:
        match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("watchdog"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return (int(match[1]), int(match[2])) if match else None


def prunes_ignored_folders() -> bool:
    """Whether the observer leaves ignored folders unwatched here: Linux's inotify observer, on a
    watchdog release listed in PRUNING_TESTED_WATCHDOG."""
    # Other platforms' observers watch a tree through one handle, and Linux without inotify support
    # gets watchdog's polling observer: nothing to prune there.
    inotify = sys.platform.startswith("linux") and Observer.__module__ == "watchdog.observers.inotify"
    return inotify and _watchdog_version() in PRUNING_TESTED_WATCHDOG


def _observer(ignored_dir_names: frozenset[str]):
    """A watchdog observer that, where `prunes_ignored_folders()`, puts no inotify watch on ignored
    folders at all; elsewhere watchdog's own observer.

    watchdog's recursive inotify watch adds one kernel watch per directory, `.git/objects` and
    `node_modules` included: tens of thousands in a JavaScript project, past the default
    `max_user_watches`, for events the handler drops anyway. The watch group here prunes those
    folders from its walk and from directories created later.
    """
    if prunes_ignored_folders():
        return _pruned_inotify_observer(frozenset(os.fsencode(name) for name in ignored_dir_names))
    if Observer.__module__ == "watchdog.observers.inotify":
        log.info("watchdog %s is not a release the watcher's folder pruning was tested with (%s); "
                 "ignored folders such as .git and node_modules get inotify watches too",
                 ".".join(map(str, _watchdog_version() or ("unknown",))),
                 ", ".join(f"{major}.{minor}" for major, minor in sorted(PRUNING_TESTED_WATCHDOG)))
    return Observer()


def _pruned_inotify_observer(ignored: frozenset[bytes]):
    """watchdog's inotify observer with a watch group that never watches an `ignored` folder, in its
    first walk or when one appears later. Private watchdog API throughout: see PRUNING_TESTED_WATCHDOG."""
    from watchdog.observers import inotify

    class PrunedWatchGroup(inotify.InotifyWatchGroup):
        def _add_all_callbacks(self, path: bytes) -> None:
            parts = [] if path == self.path else os.path.relpath(path, self.path).split(os.fsencode(os.sep))
            if ignored.intersection(parts):  # e.g. a .git or node_modules created later
                return
            self._add_callback(path)
            if not (self.is_recursive and os.path.isdir(path)):
                return
            for parent, dirnames, _ in os.walk(path, followlinks=self.follow_symlink):
                dirnames[:] = [d for d in dirnames if d not in ignored]
                for dirname in dirnames:
                    full = os.path.join(parent, dirname)
                    if self.follow_symlink or not os.path.islink(full):
                        self._add_callback(full)

    class PrunedInotifyEmitter(inotify.InotifyEmitter):
        def on_thread_start(self) -> None:
            self._inotify = PrunedWatchGroup(
                self._inotify_fd,
                os.fsencode(self.watch.path),
                is_recursive=self.watch.is_recursive,
                event_mask=self.get_event_mask_from_filter(),
                follow_symlink=self.watch.follow_symlink,
            )

    observer = inotify.InotifyObserver()
    observer._emitter_class = PrunedInotifyEmitter
    return observer


def _outermost(roots: list[Path]) -> list[Path]:
    ordered = sorted(set(roots), key=lambda r: len(r.parts))
    kept: list[Path] = []
    for root in ordered:
        if not any(root.is_relative_to(k) for k in kept):
            kept.append(root)
    return kept
