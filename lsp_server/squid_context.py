"""Squid for the server: one `SquidService` per loaded model, the references of a completion
request (a snapshot of the open documents plus index retrieval), and background pre-encoding of the
likely documents (the open files, the top of the repo map) without delaying requests."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from pygls.uris import to_fs_path

from context.errors import SquidcodeError
from context.squid.references import CompletionReferences, file_document
from context.squid.service import SquidService

__all__ = ["completion_references", "stop_squid"]

log = logging.getLogger(__name__)

# Repo-map files pre-encoded once the index is ready.
_REPO_MAP_FILES = 4


def _service(ls, runtime) -> SquidService:
    service = getattr(ls, "squid_service", None)
    if service is not None and service.runtime is runtime and service.config == ls.config.squid:
        return service
    stop_squid(ls)
    config = ls.config.squid
    disk = (Path(config.cache_dir).expanduser() if config.cache_dir
            else ls.config.resolved_cache_dir() / "squid")
    service = SquidService(runtime, config, disk)
    ls.squid_service = service
    ls.squid_index_seen = None
    return service


def _watch_index(ls, service: SquidService) -> None:
    """Once per index service: drop caches of changed files, pre-encode the top of the repo map.

    Ranking the repo map builds the reference graph (seconds on a large repository): it runs on a
    niced background thread, never on the request that first sees the index ready.
    """
    index = ls.index_service
    if index is None or getattr(ls, "squid_index_seen", None) is index or index.state != "ready":
        return
    ls.squid_index_seen = index
    index.add_path_listener(lambda paths: _current(ls, service) and service.invalidate_paths(paths))
    thread = threading.Thread(target=_preencode_repo_map, args=(ls, service, index), name="squid-repo-map",
                              daemon=True)
    ls.background_threads.append(thread)
    thread.start()


def _preencode_repo_map(ls, service: SquidService, index) -> None:
    from context.foreground import pause_for_foreground
    from context.index.indexer import lower_thread_priority
    from context.index.repomap import rank_files

    def pause() -> None:
        if ls.stopping.is_set():
            raise _Stopping
        pause_for_foreground()

    lower_thread_priority()
    try:
        top = [path for path, _ in rank_files(index.store, pause=pause)[:_REPO_MAP_FILES]]
        epoch = service.epoch()  # a file that changes after this point is not stored from old text
        docs = []
        for path in top:
            try:
                docs.append(file_document(path, Path(path).read_text(encoding="utf-8", errors="replace"),
                                          service.config.document_tokens, index.roots))
            except OSError:
                continue
        if _current(ls, service):
            service.schedule(docs, epoch=epoch)
    except _Stopping:
        return
    except (SquidcodeError, OSError, sqlite3.Error) as exc:
        log.info("squid: no repo map to pre-encode from (%s)", exc)


class _Stopping(Exception):
    """The server stopped while the repo map was being ranked."""


def _current(ls, service: SquidService) -> bool:
    return getattr(ls, "squid_service", None) is service


def completion_references(ls, uri: str, runtime) -> CompletionReferences | None:
    """The references for a completion in `uri`, or None when Squid is off (`squid.enabled`)."""
    config = ls.config.squid
    if not config.enabled or config.max_documents == 0:
        return None
    service = _service(ls, runtime)
    _watch_index(ls, service)
    current = to_fs_path(uri)
    open_documents = {}
    for document in reversed(list(ls.workspace.text_documents.values())):  # most recently opened first
        path = to_fs_path(document.uri)
        if path:
            open_documents[path] = document.source
    index = ls.index_service
    search = index.search if index is not None and index.state == "ready" else None
    references = CompletionReferences(service, current_path=current, open_documents=open_documents,
                                      search=search, roots=ls.workspace_roots)
    if config.preencode:
        others = {p: t for p, t in open_documents.items() if p != current}
        service.schedule([file_document(p, t, config.document_tokens, ls.workspace_roots)
                          for p, t in list(others.items())[: config.max_documents]])
    return references


def stop_squid(ls) -> None:
    service = getattr(ls, "squid_service", None)
    if service is not None:
        ls.squid_service = None
        service.stop()
