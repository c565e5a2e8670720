"""Squid for the server: one `SquidService` per loaded model, the references of a completion
request (the definitions of the names around the cursor, found through the index's symbols, or in
the open files while the index is not ready: `context.squid.references`), the watcher's changed
files dropping their caches, and background pre-encoding of the likely documents (the definitions
the current file imports) without delaying requests.

Whole files are not pre-encoded: completions compose definitions, never whole files."""

from __future__ import annotations

import logging
import sqlite3
import weakref
from pathlib import Path

from pygls.uris import to_fs_path

from context.errors import SquidcodeError
from context.squid.references import (
    CompletionReferences,
    imported_definitions,
    imported_from,
    no_symbols,
)
from context.squid.service import SquidService

__all__ = ["completion_references", "open_documents_of", "stop_squid"]

log = logging.getLogger(__name__)


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
    """Once per index service: the watcher's changed files drop their caches."""
    index = ls.index_service
    if index is None or getattr(ls, "squid_index_seen", None) is index or index.state != "ready":
        return
    ls.squid_index_seen = index
    index.add_path_listener(lambda paths: _current(ls, service) and service.invalidate_paths(paths))


# Per service and current file: the imports whose definitions were queued already.
_PREENCODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PREENCODE_LIMIT = 16


def _preencode_imports(service: SquidService, current: str | None, open_documents: dict[str, str],
                       symbols, roots) -> None:
    """Queue the definitions the current file imports, once per set of imports (and index)."""
    text = open_documents.get(current) if current else None
    if not text:
        return
    seen = _PREENCODED.setdefault(service, {})
    key = (symbols is no_symbols, tuple(sorted(imported_from(text).items())))
    if seen.get(current) == key:
        return
    seen[current] = key
    try:
        documents = imported_definitions(current_path=current, current_text=text,
                                         open_documents=open_documents, symbols=symbols, roots=roots,
                                         limit=_PREENCODE_LIMIT)
    except (SquidcodeError, OSError, sqlite3.Error) as exc:
        log.info("squid: no imported definitions to pre-encode (%s)", exc)
        return
    service.schedule(documents)


def _current(ls, service: SquidService) -> bool:
    return getattr(ls, "squid_service", None) is service


def open_documents_of(ls) -> dict[str, str]:
    """The editor's open documents, path -> text, most recently opened first."""
    documents = {}
    for document in reversed(list(ls.workspace.text_documents.values())):
        path = to_fs_path(document.uri)
        if path:
            documents[path] = document.source
    return documents


def completion_references(ls, uri: str, runtime) -> CompletionReferences | None:
    """The references for a completion in `uri`, or None when Squid is off (`squid.enabled`)."""
    config = ls.config.squid
    if not config.enabled or config.max_documents == 0:
        return None
    service = _service(ls, runtime)
    _watch_index(ls, service)
    current = to_fs_path(uri)
    open_documents = open_documents_of(ls)
    index = ls.index_service
    ready = index is not None and index.state == "ready"
    symbols = index.store.symbols_named if ready else no_symbols
    references = CompletionReferences(service, current_path=current, open_documents=open_documents,
                                      search=None, roots=ls.workspace_roots, symbols=symbols)
    if config.preencode:
        _preencode_imports(service, current, open_documents, symbols, ls.workspace_roots)
    return references


def stop_squid(ls) -> None:
    service = getattr(ls, "squid_service", None)
    if service is not None:
        ls.squid_service = None
        service.stop()
