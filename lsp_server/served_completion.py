"""Completions from a completion server (`completion.backend` = "llama-server" or "openai") for
the language server: one client per configuration, the references sent with each request, and the
fallback to the local model while the server is down, slow or refuses the key.

A failure is said once (a warning message and the status's `completion.error`), not on every
keystroke; keystrokes then go straight to the local model for `RETRY_S`, so a server that is down
costs the editor nothing, after which the server is asked again. Its first answer after that
clears the error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from lsprotocol import types
from pygls.uris import to_fs_path

from agent.completion import Completion, CompletionRequest, complete_served
from agent.completion_server import CompletionServer
from agent.errors import BackendError
from context.config import CompletionConfig
from context.squid.references import no_symbols, select_definitions

from .squid_context import open_documents_of

__all__ = ["RETRY_S", "ServedCompletions", "reference_chunks", "show_warning"]

log = logging.getLogger(__name__)

RETRY_S = 15.0  # after a failure, the local model answers this long before the server is asked again


def reference_chunks(ls, uri: str, prefix_text: str) -> tuple[tuple[str, str], ...]:
    """(path, text) of the references a completion at the end of `prefix_text` in `uri` gets:
    the definitions of the names around the cursor, as the local runtime composes them through
    Squid (`context.squid.references`). Empty with Squid off."""
    config = ls.config.squid
    if not config.enabled or config.max_documents == 0:
        return ()
    current = to_fs_path(uri)
    open_documents = open_documents_of(ls)
    index = ls.index_service
    symbols = index.store.symbols_named if index is not None and index.state == "ready" else no_symbols
    documents = select_definitions(current_path=current, prefix_text=prefix_text,
                                   current_text=open_documents.get(current), open_documents=open_documents,
                                   symbols=symbols, max_documents=config.max_documents,
                                   roots=ls.workspace_roots)
    return tuple((doc.source or "", doc.text) for doc in documents)


class ServedCompletions:
    """The completion server the configuration names, and whether it is answering."""

    def __init__(self, notify: Callable[[str], None], changed: Callable[[], None]):
        self._notify = notify  # tells the user once (window/showMessage)
        self._changed = changed  # the status changed
        self._client: CompletionServer | None = None
        self.error: str | None = None
        self._retry_at = 0.0
        self.answered = 0  # completions the server answered
        self.fell_back = 0  # completions the local model answered in its place

    def status(self, config: CompletionConfig) -> dict:
        """The status's `completion` section."""
        if config.backend == "local":
            return {"backend": "local", "server": None, "serving": "local", "error": None}
        serving = "local" if self.error else "server"
        return {"backend": config.backend, "server": config.server_url, "model": config.server_model or None,
                "serving": serving, "error": self.error}

    def _server(self, config: CompletionConfig) -> CompletionServer:
        if self._client is None or self._client.config != config:
            if self._client is not None:
                asyncio.ensure_future(self._client.aclose())
            self._client = CompletionServer(config)
            self.error, self._retry_at = None, 0.0
        return self._client

    async def complete(self, ls, uri: str, request: CompletionRequest,
                       cancelled: Callable[[], bool]) -> tuple[bool, Completion | None]:
        """(answered, completion): answered is False when the local model must answer instead."""
        config = ls.config.completion
        if time.monotonic() < self._retry_at:
            self.fell_back += 1
            return False, None
        server = self._server(config)
        try:
            references = reference_chunks(ls, uri, request.text[: request.offset])
        except (OSError, ValueError) as exc:
            log.info("completion server: no references (%s)", exc)
            references = ()
        try:
            completion = await complete_served(server, request, config, cancelled, references)
        except BackendError as exc:
            self._failed(str(exc))
            self.fell_back += 1
            return False, None
        self.answered += 1
        if self.error is not None:
            log.info("completion server %s answers again", server.url)
            self.error = None
            self._changed()
        return True, completion

    def _failed(self, why: str) -> None:
        self._retry_at = time.monotonic() + RETRY_S
        first = self.error is None
        self.error = why
        log.warning("%s; the local model answers completions for now", why)
        if first:
            self._notify(f"squidcode: {why}. The local model answers completions until it is back.")
            self._changed()

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def show_warning(ls) -> Callable[[str], None]:
    """A `notify` for `ServedCompletions` that shows the message in the editor."""
    def notify(message: str) -> None:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))
    return notify
