"""JSON-RPC 2.0 over a language server's stdio, with LSP's Content-Length framing.

One reader thread parses the server's messages and dispatches them: responses complete the pending
request with the same id, notifications go to their handlers, and requests from the server
(`workspace/configuration`, `client/registerCapability`, ...) are answered at once by a handler or
with an empty result. A second thread drains stderr (a full pipe would stall the server) and keeps
its last lines for error messages. Threads rather than asyncio: the agent's tools are synchronous.
"""

from __future__ import annotations

import collections
import json
import logging
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Any

from ..errors import LanguageServerError, LanguageServerTimeout

__all__ = ["JsonRpcConnection", "read_message", "encode_message"]

log = logging.getLogger(__name__)

NotificationHandler = Callable[[Any], None]
RequestHandler = Callable[[Any], Any]
_STDERR_LINES = 40


def encode_message(payload: dict[str, Any]) -> bytes:
    """One framed message: the Content-Length header, a blank line, the UTF-8 JSON body."""
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def read_message(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next message of `stream`, or None at end of stream."""
    length = None
    while True:
        line = stream.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            if length is not None:
                break
            continue  # stray blank line before the headers
        name, _, value = line.decode("ascii", "replace").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = stream.read(length)
    if len(body) < length:
        return None
    return json.loads(body.decode("utf-8"))


class _Pending:
    """A request waiting for its response."""

    def __init__(self, method: str):
        self.method = method
        self.done = threading.Event()
        self.result: Any = None
        self.error: dict[str, Any] | None = None


class JsonRpcConnection:
    """Requests, notifications and the server's own requests over a started process's pipes."""

    def __init__(self, process: subprocess.Popen, name: str):
        self.process = process
        self.name = name
        self._write_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._next_id = 1
        self._notification_handlers: dict[str, NotificationHandler] = {}
        self._request_handlers: dict[str, RequestHandler] = {}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"lsp-{name}-out", daemon=True)
        self._stderr = threading.Thread(target=self._drain_stderr, name=f"lsp-{name}-err", daemon=True)
        self._reader.start()
        self._stderr.start()

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        self._notification_handlers[method] = handler

    def on_request(self, method: str, handler: RequestHandler) -> None:
        self._request_handlers[method] = handler

    # -- sending --------------------------------------------------------------------------------

    def _send(self, payload: dict[str, Any]) -> None:
        if self.closed.is_set():
            raise LanguageServerError(f"{self.name} has stopped{self._stderr_hint()}")
        data = encode_message(payload)
        try:
            with self._write_lock:
                self.process.stdin.write(data)
                self.process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:  # ValueError: the pipe was closed
            self.closed.set()
            raise LanguageServerError(f"{self.name} has stopped ({exc}){self._stderr_hint()}") from exc

    def notify(self, method: str, params: Any = None) -> None:
        payload: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            payload["params"] = params
        self._send(payload)

    def request(self, method: str, params: Any, timeout_s: float) -> Any:
        """The result of `method`; LanguageServerTimeout after `timeout_s`, LanguageServerError when
        the server answers with an error or stops."""
        with self._pending_lock:
            request_id = self._next_id
            self._next_id += 1
            pending = self._pending[request_id] = _Pending(method)
        try:
            self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            if not pending.done.wait(timeout_s):
                self._cancel(request_id)
                raise LanguageServerTimeout(f"{self.name} did not answer {method} within {timeout_s:.1f} s")
        finally:
            with self._pending_lock:
                self._pending.pop(request_id, None)
        if pending.error is not None:
            message = pending.error.get("message", "unknown error")
            raise LanguageServerError(f"{self.name} refused {method}: {message}")
        return pending.result

    def _cancel(self, request_id: int) -> None:
        try:
            self.notify("$/cancelRequest", {"id": request_id})
        except LanguageServerError:
            pass  # it stopped meanwhile: nothing left to cancel

    # -- receiving ------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            while True:
                message = read_message(self.process.stdout)
                if message is None:
                    break
                self._dispatch(message)
        except (OSError, ValueError) as exc:  # a closed pipe or a body that is not JSON
            log.warning("%s: reading its output failed: %s", self.name, exc)
        finally:
            self.closed.set()
            with self._pending_lock:
                for pending in self._pending.values():
                    pending.error = {"message": f"the server stopped{self._stderr_hint()}"}
                    pending.done.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            with self._pending_lock:
                pending = self._pending.get(message.get("id"))
            if pending is not None:
                pending.result, pending.error = message.get("result"), message.get("error")
                pending.done.set()
            return
        if "id" in message:
            self._answer(message["id"], method, message.get("params"))
            return
        handler = self._notification_handlers.get(method)
        if handler is not None:
            handler(message.get("params"))

    def _answer(self, request_id: Any, method: str, params: Any) -> None:
        handler = self._request_handlers.get(method)
        result = handler(params) if handler is not None else None
        try:
            self._send({"jsonrpc": "2.0", "id": request_id, "result": result})
        except LanguageServerError:
            pass  # the reader notices the end of the stream next

    def _drain_stderr(self) -> None:
        try:
            for raw in iter(self.process.stderr.readline, b""):
                self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip())
        except (OSError, ValueError):
            pass  # the pipe closed with the process

    def _stderr_hint(self) -> str:
        last = [line for line in self.stderr_tail if line.strip()][-3:]
        return f"; it printed: {' | '.join(last)}" if last else ""
