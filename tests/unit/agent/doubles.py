"""Test doubles for the agent: a scripted model backend and a loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.backends import Conversation, Sample
from agent.errors import AgentCancelled

__all__ = ["ScriptedBackend", "ScriptedRuntime", "FakeOpenAIServer"]


class ScriptedBackend:
    """A model double that answers from a script: each step pops the next answer (or list of K answers).

    It records every conversation it was shown, so tests can assert what the model read.
    """

    name = "scripted"

    def __init__(
        self,
        answers: list,
        native_tools: bool = False,
        logprobs: dict[str, float] | None = None,
        delay_s: float = 0.0,
    ):
        self.answers = list(answers)
        self.native_tools = native_tools
        self.logprobs = logprobs or {}
        self.delay_s = delay_s
        self.seen: list[Conversation] = []
        self.calls: list[tuple[int, float, int]] = []
        self.seeds: list[int] = []

    def sample(self, conversation, k, *, temperature, max_tokens, seed=0, should_stop=lambda: False):
        self.seen.append(
            Conversation(
                conversation.system,
                conversation.repo_map,
                list(conversation.documents),
                [dict(m) for m in conversation.messages],
                conversation.tools,
            )
        )
        self.calls.append((k, temperature, max_tokens))
        self.seeds.append(seed)
        if self.delay_s:
            deadline = time.monotonic() + self.delay_s
            while time.monotonic() < deadline:
                if should_stop():
                    raise AgentCancelled("cancelled")
                time.sleep(0.01)
        out = []
        for _ in range(k):
            answer = self.answers.pop(0) if self.answers else "```done\n```"
            if isinstance(answer, Sample):
                out.append(answer)
            else:
                out.append(Sample(answer, [], max(1, len(answer) // 4)))
        return out

    def logprob(self, conversation, sample):
        return self.logprobs.get(sample.text)


class FakeOpenAIServer:
    """A loopback HTTP server that speaks the OpenAI chat completions protocol, from a script.

    `responses` is a list of what to do for each request, in order: a dict (a chat completion body,
    or {"status": 401, ...}), "garbage" (a non-JSON body), ("sleep", seconds), or
    {"stream": [chunk, ...]} (sent as server-sent events). Requests are recorded in `requests`.
    """

    def __init__(self, responses: list):
        self.responses = list(responses)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                server.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                server.headers.append(dict(self.headers))
                action = server.responses.pop(0) if server.responses else {"status": 500}
                server.respond(self, action)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def respond(self, handler: BaseHTTPRequestHandler, action) -> None:
        if isinstance(action, tuple) and action[0] == "sleep":
            time.sleep(action[1])
            action = action[2] if len(action) > 2 else {"choices": []}
        if action == "garbage":
            body, status, kind = b"<html>not json", 200, "text/html"
        elif isinstance(action, dict) and "stream" in action:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
            for chunk in action["stream"]:
                data = chunk if isinstance(chunk, str) else json.dumps(chunk)
                handler.wfile.write(f"data: {data}\n\n".encode())
            handler.wfile.write(b"data: [DONE]\n\n")
            return
        else:
            status = action.get("status", 200) if isinstance(action, dict) else 200
            body, kind = json.dumps(action).encode(), "application/json"
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def chat_completion(
    *contents: str, tool_calls: list | None = None, logprobs: list[float] | None = None
) -> dict:
    """A non-streamed chat completion body with one choice per content."""
    choices = []
    for i, content in enumerate(contents):
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls and i == 0:
            message["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": "stop"}
        if logprobs:
            choice["logprobs"] = {"content": [{"token": "x", "logprob": logprobs[i]}]}
        choices.append(choice)
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": choices,
        "usage": {"completion_tokens": 10 * len(contents)},
    }


class ScriptedRuntime:
    """A model-runtime double for `LocalBackend` (the prompt it renders and the answer text it
    builds are the real code's): `generate` pops the next scripted continuation and records the
    prompt it was asked to continue. Its tokenizer has no chat template, so prompts are plain."""

    tokenizer = None
    device = "cpu"

    def __init__(self, continuations: list[str]):
        self.continuations = list(continuations)
        self.prompts: list[str] = []
        self.constraints: list = []  # the `constrain` of each generate call (None: free)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def token_texts(self) -> list[str]:
        return [chr(i) for i in range(256)]

    def generate(self, prompt_ids, *, max_new_tokens, stop=(), temperature=0.0, seed=None, should_stop=None,
                 past=None, constrain=None, **_):
        from context.runtime import GenerationResult

        self.prompts.append("".join(map(chr, prompt_ids)))
        self.constraints.append(constrain)
        text = self.continuations.pop(0) if self.continuations else "done\n"
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        reason = "stop" if cut >= 0 else "eos"
        text = text[:cut] if cut >= 0 else text
        return GenerationResult(text, len(text), len(prompt_ids), 0.0, 0.0, reason)
