"""A raw LSP client for end-to-end tests: the server as a subprocess over stdio, spoken to in
Content-Length framed JSON-RPC, so a test can send what no well-behaved client library would (bad
frames, a shutdown in the middle of anything) and see the server's exit code and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import REPO, SERVER_CMD

__all__ = ["RawLspClient", "ServerDied", "end_position", "server_env", "start_client", "utf16_len"]


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def end_position(text: str) -> dict[str, int]:
    lines = text.split("\n")
    return {"line": len(lines) - 1, "character": utf16_len(lines[-1])}


class ServerDied(AssertionError):
    pass


class RawLspClient:
    """A minimal LSP client over the server's stdio that sends exactly the bytes it is given.

    A reader thread parses frames from the server's stdout, so the server can never block on a
    full pipe while the test writes: responses are kept by id, responses with a null id (parse
    errors) in order, notifications in order. Requests the server sends to the client are
    answered with a null result.
    """

    def __init__(self, cmd: list[str], *, env: dict[str, str], cwd: Path, stderr_path: Path):
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=cwd,
            env=env,
        )
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self.responses: dict[Any, dict] = {}
        self.null_id_responses: list[dict] = []
        self.notifications: list[dict] = []
        self.server_requests: list[dict] = []
        self.unparsable: list[bytes] = []
        self._eof = False
        self._next_id = 0
        self._reader = threading.Thread(target=self._read_loop, name="lsp-reader", daemon=True)
        self._reader.start()

    # -- writing -------------------------------------------------------------------------------

    def send(self, message: dict | bytes) -> None:
        """Frame and write one message: a dict is JSON-encoded, bytes are sent as the body as is."""
        body = message if isinstance(message, bytes) else json.dumps(message).encode("utf-8")
        frame = f"Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body
        with self._write_lock:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()

    def send_frames(self, *bodies: bytes) -> None:
        """Several framed bodies in one write, as a client that batches its output would send."""
        data = b"".join(f"Content-Length: {len(b)}\r\n\r\n".encode("ascii") + b for b in bodies)
        with self._write_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send_request(self, method: str, params: Any = None, *, msg_id: Any = None) -> Any:
        msg_id = self.new_id() if msg_id is None else msg_id
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def request(self, method: str, params: Any = None, timeout: float = 60) -> dict:
        """Send a request and return its whole response message (with `result` or `error`)."""
        return self.wait_response(self.send_request(method, params), timeout)

    # -- reading -------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        stream = self.proc.stdout
        try:
            while True:
                length = None
                while True:
                    header = stream.readline()
                    if not header:
                        return
                    if header in (b"\r\n", b"\n"):
                        break
                    name, _, value = header.decode("ascii").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    continue
                body = stream.read(length)
                if len(body) < length:
                    return
                try:
                    message = json.loads(body)
                except ValueError:
                    with self._cond:
                        self.unparsable.append(body)
                        self._cond.notify_all()
                    continue
                self._dispatch(message)
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _dispatch(self, message: dict) -> None:
        if "method" in message and "id" in message:
            with self._cond:
                self.server_requests.append(message)
            try:
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
            except (BrokenPipeError, OSError):
                pass
            return
        with self._cond:
            if "method" in message:
                self.notifications.append(message)
            elif message.get("id") is None:
                self.null_id_responses.append(message)
            else:
                self.responses[message["id"]] = message
            self._cond.notify_all()

    def _wait_for(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = check()
                if found is not None:
                    return found
                if self._eof:
                    raise ServerDied(f"server closed stdout while waiting for {what}; {self.tail()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; {self.tail()}")
                self._cond.wait(remaining)

    def wait_response(self, msg_id: Any, timeout: float = 60) -> dict:
        return self._wait_for(lambda: self.responses.get(msg_id), timeout, f"response {msg_id!r}")

    def wait_null_id_response(self, after: int, timeout: float = 30) -> dict:
        """The first response with a null id that arrived after the first `after` of them."""
        return self._wait_for(
            lambda: self.null_id_responses[after] if len(self.null_id_responses) > after else None,
            timeout,
            "a response with a null id",
        )

    def wait_notification(
        self, method: str, predicate: Callable[[dict], bool] = lambda p: True, timeout: float = 30
    ) -> dict:
        def check():
            for note in self.notifications:
                if note["method"] == method and predicate(note.get("params")):
                    return note
            return None

        return self._wait_for(check, timeout, f"a {method} notification")

    def messages_shown(self) -> list[str]:
        with self._cond:
            return [
                n["params"]["message"] for n in self.notifications if n["method"] == "window/showMessage"
            ]

    def tail(self, chars: int = 3000) -> str:
        self._stderr.flush()
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            text = ""
        return f"server exit code {self.proc.poll()}; stderr tail:\n{text[-chars:]}"

    # -- lifecycle -----------------------------------------------------------------------------

    def initialize(
        self, *, root: Path | None = None, options: Any = None, folders: list[Path] | None = None
    ) -> dict:
        params: dict[str, Any] = {"processId": os.getpid(), "capabilities": {}}
        if root is not None:
            params["rootUri"] = root.as_uri()
            folders = folders or [root]
        if folders:
            params["workspaceFolders"] = [{"uri": f.as_uri(), "name": f.name} for f in folders]
        if options is not None:
            params["initializationOptions"] = options
        response = self.request("initialize", params, timeout=120)
        assert "result" in response, response
        self.notify("initialized", {})
        return response["result"]

    def open(self, uri: str, text: str, language: str = "python", version: int = 1) -> None:
        self.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": language, "version": version, "text": text}},
        )

    def inline_completion(self, uri: str, position: dict, timeout: float = 120) -> dict:
        return self.request(
            "textDocument/inlineCompletion",
            {
                "textDocument": {"uri": uri},
                "position": position,
                "context": {"triggerKind": 1},
            },
            timeout=timeout,
        )

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                response_id = self.send_request("shutdown")
                self.wait_response(response_id, timeout=10)
                self.notify("exit")
                self.proc.wait(timeout=10)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self._reader.join(timeout=5)
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self._stderr.close()


def server_env(config_home: Path) -> dict[str, str]:
    """The test process's environment (same model cache) with an empty user config directory."""
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = str(config_home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_client(tmp: Path, name: str = "server") -> RawLspClient:
    config_home = tmp / "config-home"
    config_home.mkdir(exist_ok=True)
    return RawLspClient(
        SERVER_CMD, env=server_env(config_home), cwd=REPO, stderr_path=tmp / f"{name}.stderr.log"
    )
