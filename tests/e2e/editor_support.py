"""Shared by the editor tests (headless Neovim, code-server): which commands the server offers, and
`FakeOpenAIServer`, a test double of an OpenAI-compatible model server whose answers are scripted, so
an agent edit's text is known in advance and the test judges only the editor applying it."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["server_commands", "FakeOpenAIServer", "edit_block", "DONE_BLOCK", "AGENT_RUN", "ACCEPT",
           "FEEDBACK_STATUS", "FEEDBACK_SET_RECORD"]

AGENT_RUN = "squidcode.agent.run"
ACCEPT = "squidcode.completion.accept"
FEEDBACK_STATUS = "squidcode.feedback.status"
FEEDBACK_SET_RECORD = "squidcode.feedback.setRecord"
DONE_BLOCK = "```done\n```"


def _frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def _read_message(stream) -> dict:
    length = None
    while True:
        line = stream.readline()
        if not line:
            raise EOFError("the server closed its output")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return json.loads(stream.read(length))


def server_commands(server_cmd: list[str], timeout: float = 30.0) -> list[str]:
    """The commands `squidcode serve` lists in executeCommandProvider (initialize, then exit)."""
    proc = subprocess.Popen(server_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                 "params": {"processId": None, "rootUri": None, "capabilities": {}}}))
        proc.stdin.flush()
        while True:
            message = _read_message(proc.stdout)
            if message.get("id") == 1:
                break
        provider = message["result"]["capabilities"].get("executeCommandProvider") or {}
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
        proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "exit"}))
        proc.stdin.flush()
        return list(provider.get("commands") or [])
    finally:
        timer.cancel()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def edit_block(path: str, search: str, replace: str) -> str:
    """An agent answer in the text protocol: one SEARCH/REPLACE edit of `path`."""
    return f"```edit {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```"


class FakeOpenAIServer:
    """An OpenAI-compatible chat server (test double for vLLM/llama.cpp/Ollama): the first chat
    completion answers `first`, every later one `then`; requests are kept in `requests`."""

    def __init__(self, first: str, then: str = DONE_BLOCK):
        self.first, self.then = first, then
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                self._send(200, outer._answer(request))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _answer(self, request: dict) -> dict:
        with self._lock:
            content = self.first if not self.requests else self.then
            self.requests.append(request)
        n = max(1, int(request.get("n") or 1))
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or "fake",
            "choices": [{"index": i, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"} for i in range(n)],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
