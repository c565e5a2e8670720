"""Editor events that keep the index current: saves, watched-file changes, and unsaved buffers
(an open document's text wins over the file on disk until it is closed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path

from ..server import SquidServer

__all__ = ["register"]

# Re-indexing a buffer on every keystroke would waste the CPU the completions need.
OVERLAY_DELAY_S = 0.5


def _path(uri: str) -> Path | None:
    fs_path = to_fs_path(uri)
    return Path(fs_path) if fs_path else None


def register(server: SquidServer) -> None:
    pending: dict[str, asyncio.TimerHandle] = {}

    def schedule_overlay(ls: SquidServer, uri: str) -> None:
        if (handle := pending.pop(uri, None)) is not None:
            handle.cancel()
        pending[uri] = asyncio.get_running_loop().call_later(OVERLAY_DELAY_S, apply_overlay, ls, uri)

    def apply_overlay(ls: SquidServer, uri: str) -> None:
        pending.pop(uri, None)
        opened, path = ls.open_document_text(uri), _path(uri)
        if ls.index_service is not None and opened is not None and path is not None:
            ls.index_service.set_overlay(path, opened[0])

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: SquidServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.notify_document_listeners(types.TEXT_DOCUMENT_DID_CHANGE, params)
        schedule_overlay(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: SquidServer, params: types.DidSaveTextDocumentParams) -> None:
        path = _path(params.text_document.uri)
        if ls.index_service is not None and path is not None:
            ls.index_service.notify_saved(path)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: SquidServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.notify_document_listeners(types.TEXT_DOCUMENT_DID_CLOSE, params)
        if (handle := pending.pop(params.text_document.uri, None)) is not None:
            handle.cancel()
        path = _path(params.text_document.uri)
        if ls.index_service is not None and path is not None:
            ls.index_service.clear_overlay(path)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: SquidServer, params: types.DidChangeWatchedFilesParams) -> None:
        paths = [p for p in (_path(change.uri) for change in params.changes) if p is not None]
        if ls.index_service is not None and paths:
            ls.index_service.notify_changed(paths)
