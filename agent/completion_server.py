"""Inline completions from a completion server over HTTP: llama.cpp's `/infill`, or the
`/v1/completions` of any OpenAI-compatible server (vLLM, llama.cpp, Ollama).

A team runs one bigger code model on a GPU box and every member's squidcode asks it instead of
the editor's own process (`completion.backend`):

- `llama-server`: llama.cpp's `/infill` with the text around the cursor, the repository references
  as `input_extra` chunks and `cache_prompt` on, as llama.vim sends them: the server formats the
  hole with the model's FIM tokens, and its prompt cache keeps the chunks and the prefix that did not
  change between keystrokes;
- `openai`: `/v1/completions`, with `completion.fim` applied here (a family's format or a
  template, references in its repository layout), or the server's own `suffix` field ("auto"), or
  the text before the cursor alone ("off"); references then go in front as plain text, the way
  the local runtime composes them.

Answers stream. `cancelled()` is polled while waiting, so a newer keystroke or `$/cancelRequest`
closes the connection at once, and the server stops generating when it sees it close. A server
that cannot be reached, answers nothing within `server_timeout_s`, refuses the key or answers an
error raises a `BackendError`; the caller answers with the local model and says so (once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from context.config import CompletionConfig
from context.fim import fim_prompt, resolve
from context.squid.encode import DEFAULT_PREFIX

from .errors import BackendAuthError, BackendConnectionError, BackendError, BackendTimeoutError

__all__ = ["CompletionServer", "HoleRequest", "ServerAnswer", "server_model_id"]

log = logging.getLogger(__name__)

_POLL_S = 0.01  # how often a waiting request looks at `cancelled()`


@dataclass(frozen=True)
class HoleRequest:
    """What one completion asks a server for: the text around the cursor and the references."""

    prefix: str
    suffix: str
    path: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # (path, text) of the reference chunks
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    continuation: str = ""  # the answer so far, to be continued (closing what it opened)


@dataclass(frozen=True)
class ServerAnswer:
    """A server's answer and what it cost."""

    text: str
    stop_reason: str  # "stop" (a stop string or the end of text) or "length"
    new_tokens: int
    prompt_tokens: int  # prompt tokens the server read (0: it did not say)
    cached_tokens: int  # of those, taken from its prompt cache (0: none, or it did not say)
    first_token_s: float
    latency_s: float
    model: str


class CompletionServer:
    """One completion server, as `completion.backend`/`server_*` describe it; `complete` is async."""

    def __init__(self, config: CompletionConfig, *, transport: httpx.AsyncBaseTransport | None = None):
        if config.backend not in ("llama-server", "openai"):
            raise ValueError(f"not a server backend: {config.backend!r}")
        self.config = config
        self.url = config.server_url.rstrip("/")
        headers = {}
        if config.server_api_key_env:
            key = os.environ.get(config.server_api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
            else:
                log.warning("completion server: $%s is not set; asking without a key",
                            config.server_api_key_env)
        # The first token must come within `server_timeout_s`; later chunks as well, one to the next.
        timeout = httpx.Timeout(config.server_timeout_s, connect=min(config.server_timeout_s, 5.0))
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, transport=transport)

    @property
    def name(self) -> str:
        return server_model_id(self.config)

    def endpoint(self) -> str:
        return f"{self.url}/infill" if self.config.backend == "llama-server" else f"{self.url}/completions"

    def body(self, request: HoleRequest) -> dict:
        """The JSON body of `request` for this backend."""
        config = self.config
        if config.backend == "llama-server":
            body = {"input_prefix": request.prefix, "input_suffix": request.suffix,
                    "input_extra": [{"filename": path, "text": text} for path, text in request.extra],
                    "prompt": request.continuation, "n_predict": request.max_tokens,
                    "temperature": request.temperature, "stop": list(request.stop),
                    "cache_prompt": True, "stream": True}
        else:
            body = {"max_tokens": request.max_tokens, "temperature": request.temperature,
                    "stop": list(request.stop), "stream": True, **_openai_prompt(config.fim, request)}
        if config.server_model:
            body["model"] = config.server_model
        return body

    async def complete(self, request: HoleRequest, cancelled: Callable[[], bool] = lambda: False
                       ) -> ServerAnswer | None:
        """The server's answer to `request`; None when `cancelled()` turned true first (the
        connection is closed then). Raises a `BackendError` subclass when the server fails."""
        task = asyncio.ensure_future(self._stream(request))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_POLL_S)
                if done:
                    return task.result()
                if cancelled():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return None
        except asyncio.CancelledError:  # the caller's own cancellation: close the stream too
            task.cancel()
            raise

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _stream(self, request: HoleRequest) -> ServerAnswer:
        started = time.perf_counter()
        body = self.body(request)
        try:
            async with self._client.stream("POST", self.endpoint(), json=body) as response:
                await _check_status(response)
                return await _read_answer(_events(response), started, self.config.server_model)
        except httpx.ConnectError as exc:
            raise BackendConnectionError(f"completion server {self.url} cannot be reached ({exc})") from exc
        except httpx.TimeoutException as exc:
            waited = f"{self.config.server_timeout_s:g} s"
            raise BackendTimeoutError(f"completion server {self.url} answered nothing in {waited}") from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"completion server {self.url} failed: {exc}") from exc


def server_model_id(config: CompletionConfig) -> str:
    """How episodes name a completion server's model: the backend, and its model or address."""
    return f"{config.backend}:{config.server_model or config.server_url.rstrip('/')}"


def _openai_prompt(fim: str, request: HoleRequest) -> dict:
    """`prompt` (and `suffix`) of a `/v1/completions` body under the `completion.fim` setting."""
    if fim not in ("auto", "off"):
        fmt = resolve(fim, ())
        files = [(path, text) for path, text in request.extra] if fmt.file_sep else []
        hole = fim_prompt(fmt, request.prefix, request.suffix, path=request.path, files=files)
        if fmt.file_sep is None and request.extra:
            hole = _plain_references(request.extra) + hole
        return {"prompt": hole + request.continuation}
    prompt = _plain_references(request.extra) + request.prefix + request.continuation
    if fim == "auto" and request.suffix and not request.continuation:
        return {"prompt": prompt, "suffix": request.suffix}
    return {"prompt": prompt}


def _plain_references(extra: tuple[tuple[str, str], ...]) -> str:
    """References in front of a prompt as the local runtime composes them (`context.squid`)."""
    if not extra:
        return ""
    return DEFAULT_PREFIX + "".join(text if text.endswith("\n") else text + "\n" for _, text in extra)


async def _check_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    detail = (await response.aread())[:300].decode("utf-8", "replace")
    if response.status_code in (401, 403):
        raise BackendAuthError(f"completion server refused the key (HTTP {response.status_code}): {detail}")
    raise BackendError(f"completion server answered HTTP {response.status_code}: {detail}")


async def _events(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON objects of a server-sent event stream (`data: {...}` lines) until `[DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise BackendError(f"completion server sent something that is not JSON: {data[:120]!r}") from exc
        if isinstance(event, dict) and "error" in event:
            raise BackendError(f"completion server failed: {event['error']}")
        if isinstance(event, dict):
            yield event


async def _read_answer(events: AsyncIterator[dict], started: float, model: str) -> ServerAnswer:
    """Gather a streamed answer: llama-server's `content` events or OpenAI `choices` chunks."""
    parts: list[str] = []
    first = None
    reason = "stop"
    new_tokens = prompt_tokens = cached = 0
    async for event in events:
        choices = event.get("choices")
        if choices:
            piece = choices[0].get("text") or ""
            reason = _reason(choices[0].get("finish_reason")) or reason
        else:
            piece = event.get("content") or ""
            if event.get("stop"):
                reason = "length" if event.get("stop_type") == "limit" else "stop"
        if piece:
            first = first if first is not None else time.perf_counter() - started
            parts.append(piece)
            new_tokens += 1  # a chunk is a token on these servers; usage or timings say exactly
        model = event.get("model") or model
        usage, timings = event.get("usage") or {}, event.get("timings") or {}
        if usage:
            new_tokens = usage.get("completion_tokens", new_tokens)
            prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
        if timings:
            # llama.cpp: prompt_n read now, cache_n taken from the cache.
            cached = timings.get("cache_n", cached)
            prompt_tokens = timings.get("prompt_n", 0) + timings.get("cache_n", 0) or prompt_tokens
            new_tokens = timings.get("predicted_n", new_tokens)
    latency = time.perf_counter() - started
    return ServerAnswer("".join(parts), reason, new_tokens, prompt_tokens, cached,
                        latency if first is None else first, latency, model)


def _reason(finish_reason: str | None) -> str | None:
    if finish_reason is None:
        return None
    return "length" if finish_reason == "length" else "stop"
