"""Squid for the server: one `SquidService` per loaded model, the references of a completion
request (the definitions of the names around the cursor, found through the index's symbols, or in
the open files while the index is not ready: `context.squid.references`), the watcher's changed
files dropping their caches, and background pre-encoding of the likely documents (the definitions
the current file imports) without delaying requests.

Whole files are not pre-encoded: completions compose definitions, never whole files.

The next-edit model path reads the same definitions, as blocks of its own chat prompt: their caches
follow that prompt's head, so they live in a second service (`next_edit_references`)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import weakref
from pathlib import Path

from pygls.uris import to_fs_path

from context.errors import SquidcodeError
from context.next_edit_model import reference_block
from context.squid.references import (
    CompletionReferences,
    imported_definitions,
    imported_from,
    no_symbols,
)
from context.squid.service import ReferenceDocument, SquidService

__all__ = ["completion_references", "next_edit_references", "open_documents_of", "stop_squid"]

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


class NextEditReferences:
    """Related code for the next-edit model path (`context.next_edit_model.ComposeReferences`): the
    definitions a completion at the cursor would read, each a `reference_block` composed from a cache
    that follows the model path's prompt head; the ready ones, the rest encoded in the background
    for the next request. `foreground()` holds both services' background encoders off."""

    def __init__(self, ls, runtime, completion: CompletionReferences):
        self.ls, self.runtime, self.completion = ls, runtime, completion

    def __call__(self, head: str, prefix_text: str):
        service = _next_edit_service(self.ls, self.runtime, head)
        documents = [ReferenceDocument(reference_block(doc.text), doc.source)
                     for doc in self.completion.documents(prefix_text)]
        context = service.context_for(documents) if documents else None
        if context is None:
            return None
        decode = self.runtime.decode
        text = "".join(decode(list(context.token_ids[start:end])) for start, end in context.spans)
        return context, text

    @contextlib.contextmanager
    def foreground(self):
        service = getattr(self.ls, "next_edit_squid", None)
        with self.completion.foreground(), (service.foreground() if service else contextlib.nullcontext()):
            yield


def next_edit_references(ls, uri: str, runtime) -> NextEditReferences | None:
    """Related code for a next edit in `uri` by the model path, or None when Squid is off."""
    completion = completion_references(ls, uri, runtime)
    return NextEditReferences(ls, runtime, completion) if completion is not None else None


def _next_edit_service(ls, runtime, head: str) -> SquidService:
    service = getattr(ls, "next_edit_squid", None)
    if (service is not None and service.runtime is runtime and service.config == ls.config.squid
            and service.prefix_text == head):
        return service
    if service is not None:
        service.stop()
    config = ls.config.squid
    disk = (Path(config.cache_dir).expanduser() if config.cache_dir
            else ls.config.resolved_cache_dir() / "squid")
    service = ls.next_edit_squid = SquidService(runtime, config, disk, prefix_text=head)
    return service


def stop_squid(ls) -> None:
    for name in ("squid_service", "next_edit_squid"):
        service = getattr(ls, name, None)
        if service is not None:
            setattr(ls, name, None)
            service.stop()
