"""Forward Python log records to the client as `window/logMessage`, from any thread."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

__all__ = ["LspLogHandler", "LOGGED_PACKAGES"]

LOGGED_PACKAGES = ("lsp_server", "agent", "context", "feedback", "kernels")

_LEVELS = {
    logging.ERROR: types.MessageType.Error,
    logging.WARNING: types.MessageType.Warning,
    logging.INFO: types.MessageType.Info,
    logging.DEBUG: types.MessageType.Log,
}


class LspLogHandler(logging.Handler):
    """Sends records to the editor's log; records from worker threads hop onto the event loop."""

    def __init__(self, server, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._server = server
        self._loop = loop
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        kind = next((v for k, v in _LEVELS.items() if record.levelno >= k), types.MessageType.Log)
        params = types.LogMessageParams(type=kind, message=self.format(record))
        if self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._server.window_log_message, params)
        except RuntimeError:
            # The loop shut down between the check and the call: the client is gone anyway.
            return
