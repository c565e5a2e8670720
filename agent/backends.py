"""Model backends for the agent: the local runtime, and an OpenAI-compatible chat server over httpx.

Both answer `sample(conversation, k, ...)` with K samples. The local backend renders the conversation
into one prompt through `build_local_prompt`, with the documents either in that text or, given a
Squid service, as composed per-document caches in front of it; it decodes the K samples in one
batch and ranks by a log-probability computed with one forward pass over prompt + sample. The HTTP
backend asks the server for K choices (`n`), streams, and speaks native tool calls; it retries
connection errors, 429 and 5xx with backoff, and says clearly when the server refuses the key or
cannot be reached.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from context.config import SquidCacheConfig
from context.errors import GenerationCancelled

from .copy_search import OPEN, CopySearch, EditCopy, copy_vocabulary
from .errors import (
    AgentCancelled,
    BackendAuthError,
    BackendConnectionError,
    BackendError,
    BackendTimeoutError,
)
from .protocol import ToolCall

__all__ = [
    "Document",
    "Conversation",
    "Sample",
    "Backend",
    "LocalBackend",
    "OpenAIBackend",
    "build_local_prompt",
    "split_local_prompt",
    "cut_at_step_stop",
    "LOCAL_PREFILL",
]

log = logging.getLogger(__name__)

ShouldStop = Callable[[], bool]
# The local model's answer is started for it: small models then write a block far more often.
LOCAL_PREFILL = "```"
_LOCAL_STOP = ("\n```\n", "\n```<", "<|im_end|>")


def cut_at_step_stop(generated: str) -> tuple[str, int | None]:
    """What `LocalBackend.sample` makes of the text generated after the opening fence: cut before
    the first stop sequence, with the closing fence put back; and how many characters of
    `generated` that took (None: no stop sequence, all of it)."""
    ends = [(at, stop) for stop in _LOCAL_STOP if (at := generated.find(stop)) >= 0]
    if not ends:
        return generated, None
    at, stop = min(ends)
    return generated[:at] + "\n```", at + len(stop)


@dataclass(frozen=True)
class Document:
    """A piece of the workspace shown to the model before the conversation."""

    rel: str
    text: str
    start_line: int = 1


@dataclass
class Conversation:
    """What the model sees: instructions, a repo map, documents, then the turns so far."""

    system: str
    repo_map: str = ""
    documents: list[Document] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style turns
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style tool schemas
    # For the local model: text its answer must start with, after the opening fence (the loop's
    # fallback after an answer that did not parse: an edit block of the file asked about, opened).
    prefill: str = ""
    # With a prefill that opens an edit block's search text: the file's text, which that search
    # text is decoded as a copy of (`agent.copy_search`).
    copy_from: str | None = None
    # (path, text) of the file asked about, with `agent.copy_search`: the search text of an edit
    # block of it that the answer opens is decoded as a copy of it (`copy_search.EditCopy`).
    edit_source: tuple[str, str] | None = None
    # The lines the request names (1-based, inclusive): a copied search text starts among them.
    copy_lines: tuple[int, int] | None = None


@dataclass
class Sample:
    """One sampled answer: text and/or native tool calls, its token count and log-probability."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: int = 0
    logprob: float | None = None  # mean log-probability per token, when the backend knows it
    finish_reason: str = ""


class Backend(Protocol):
    name: str
    native_tools: bool

    def sample(
        self,
        conversation: Conversation,
        k: int,
        *,
        temperature: float,
        max_tokens: int,
        seed: int,
        should_stop: ShouldStop,
    ) -> list[Sample]: ...

    def logprob(self, conversation: Conversation, sample: Sample) -> float | None: ...


def _context_block(conversation: Conversation) -> str:
    parts = []
    if conversation.repo_map:
        parts.append(f"Repository map:\n{conversation.repo_map.strip()}")
    for doc in conversation.documents:
        parts.append(f"File {doc.rel} (from line {doc.start_line}):\n```\n{doc.text.rstrip()}\n```")
    return "\n\n".join(parts)


def build_local_prompt(
    tokenizer, system: str, repo_map: str, documents: list[Document], messages: list[dict[str, Any]]
) -> str:
    """The local model's prompt: the chat template over system + documents + turns, answer started.

    The repo map and the documents open the first user turn; `split_local_prompt` cuts the same
    prompt where the documents go, for Squid composition.
    """
    context = _context_block(Conversation(system, repo_map, documents))
    turns = [{"role": "system", "content": system}]
    for i, message in enumerate(messages):
        content = message.get("content") or ""
        if i == 0 and context:
            content = f"{context}\n\n{content}"
        role = "assistant" if message["role"] == "assistant" else "user"
        turns.append({"role": role, "content": content})
    try:
        prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except (ValueError, AttributeError, TypeError):
        prompt = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant: "
    return prompt + LOCAL_PREFILL


# Stands in for the documents while the prompt is rendered, to find where they go.
_DOCUMENTS_MARK = "\x00squid-documents\x00"


def split_local_prompt(
    tokenizer, system: str, repo_map: str, messages: list[dict[str, Any]]
) -> tuple[str, str] | None:
    """`build_local_prompt` cut where the documents go: (head, tail), for documents placed between
    them, each block followed by a blank line; None when there is no first turn to hold them."""
    if not messages:
        return None
    first = dict(messages[0])
    first["content"] = _DOCUMENTS_MARK + (first.get("content") or "")
    rendered = build_local_prompt(tokenizer, system, "", [], [first, *messages[1:]])
    head, mark, tail = rendered.partition(_DOCUMENTS_MARK)
    if not mark:
        return None
    if repo_map:
        # In the plain prompt the repo map comes before the documents; here it follows them, as
        # it changes with every request and the documents' caches must not depend on it.
        tail = f"{_context_block(Conversation(system, repo_map, []))}\n\n{tail}"
    return head, tail


class LocalBackend:
    """The in-process model runtime (`context.runtime.ModelRuntime`).

    With a `squid` service (`context.squid.service.SquidService`) the conversation's documents are
    not part of the prompt text: each is a per-document KV cache, encoded once and reused by every
    step of the loop and every candidate, composed in front of the prompt; only the instructions
    and turns are prefilled. Without one (or when composing fails) they are in the prompt text.
    """

    name = "local"
    native_tools = False

    def __init__(self, runtime, squid: SquidCacheConfig | None = None, squid_disk: Path | None = None):
        """`squid`: compose the documents from per-document caches with these settings (their disk
        tier in `squid_disk`); None puts them into the prompt text."""
        self.runtime = runtime
        self.squid = squid
        self.squid_disk = squid_disk
        self._services: dict[str, object] = {}  # prompt head -> SquidService
        self._copy_vocabulary: dict[str, list[int]] | None = None  # built at the first copy constraint
        self.last_results: list = []  # the runtime's GenerationResults of the last `sample` (timings)

    def prompt(self, conversation: Conversation) -> str:
        return build_local_prompt(
            self.runtime.tokenizer,
            conversation.system,
            conversation.repo_map,
            conversation.documents,
            conversation.messages,
        ) + conversation.prefill

    def _prepared(self, conversation: Conversation) -> tuple[list[int], object]:
        """(prompt ids, composed documents or None): with Squid, the ids continue the composed
        prompt head and documents; otherwise they are the whole prompt."""
        composed = self._composed(conversation)
        if composed is None:
            return self.runtime.encode(self.prompt(conversation)), None
        context, tail = composed
        return self.runtime.encode(tail + conversation.prefill), context

    def _composed(self, conversation: Conversation):
        """(composed head + documents, the prompt text after them), or None for the plain prompt."""
        if self.squid is None or not conversation.documents:
            return None
        parts = split_local_prompt(self.runtime.tokenizer, conversation.system, conversation.repo_map,
                                   conversation.messages)
        if parts is None:
            return None
        head, tail = parts
        from context.errors import SquidcodeError
        from context.squid.service import ReferenceDocument, SquidService

        service = self._services.get(head)
        if service is None:
            # The documents' caches follow the prompt head (system turn, start of the user turn).
            service = SquidService(self.runtime, self.squid, self.squid_disk, start_thread=False,
                                   prefix_text=head)
            self._services = {head: service}  # one system prompt at a time
        references = [
            ReferenceDocument(_context_block(Conversation("", "", [doc])) + "\n\n", source=doc.rel)
            for doc in conversation.documents
        ]
        try:
            # Written to disk as well: the next episode (a CLI run, a restarted server) reuses them.
            context = service.context_for(references, wait=True, persist=True)
        except (SquidcodeError, RuntimeError, ValueError, OSError) as exc:
            log.warning("squid: agent documents not composed (%s); they go into the prompt", exc)
            return None
        # A document longer than the per-document budget would be cut there: use the plain prompt.
        if context is None or len(context.spans) != len(conversation.documents):
            return None
        return context, tail

    def sample(
        self,
        conversation: Conversation,
        k: int,
        *,
        temperature: float,
        max_tokens: int,
        seed: int = 0,
        should_stop: ShouldStop = lambda: False,
    ) -> list[Sample]:
        """K answers to the conversation, decoded together in one batch after one prefill
        (`ModelRuntime.generate_batch`); one answer is a plain generation."""
        prompt_ids, composed = self._prepared(conversation)
        if should_stop():
            raise AgentCancelled("cancelled while sampling")
        past = composed.new_cache() if composed is not None else None
        constrain = self._copy_constraint(conversation)
        try:
            if k == 1:
                results = [self.runtime.generate(
                    prompt_ids, max_new_tokens=max_tokens, stop=_LOCAL_STOP, temperature=temperature,
                    seed=seed, should_stop=should_stop, past=past, constrain=constrain,
                )]
            else:
                results = self.runtime.generate_batch(
                    prompt_ids, k, max_new_tokens=max_tokens, stop=_LOCAL_STOP, temperature=temperature,
                    seed=seed, should_stop=should_stop, past=past, constrain=constrain,
                )
        except GenerationCancelled as exc:
            raise AgentCancelled(str(exc)) from exc
        if should_stop():
            raise AgentCancelled("cancelled while sampling")
        self.last_results = results
        samples = []
        for result in results:
            text = LOCAL_PREFILL + conversation.prefill + result.text
            if result.stop_reason == "stop":
                text += "\n```"
            samples.append(Sample(text, [], result.new_tokens, None, result.stop_reason))
        return samples

    def _copy_constraint(self, conversation: Conversation) -> CopySearch | EditCopy | None:
        """The search text of an edit block the prefill opened, decoded as a copy of the file; else
        that of an edit block of the file asked about that the answer opens (`edit_source`)."""
        opened = conversation.copy_from is not None and conversation.prefill.endswith(OPEN)
        if not opened and (conversation.edit_source is None or conversation.prefill):
            return None
        if self._copy_vocabulary is None:
            self._copy_vocabulary = copy_vocabulary(self.runtime.token_texts())
        if opened:
            return CopySearch(conversation.copy_from, self._copy_vocabulary, conversation.copy_lines)
        return EditCopy(*conversation.edit_source, self._copy_vocabulary, conversation.copy_lines)

    def logprob(self, conversation: Conversation, sample: Sample) -> float | None:
        """Mean log-probability per token of the sample after the prompt, in one forward pass (over
        the same composed documents the sample was drawn with)."""
        import torch

        prompt_ids, composed = self._prepared(conversation)
        opened = LOCAL_PREFILL + conversation.prefill
        answer = sample.text[len(opened) :] if sample.text.startswith(opened) else sample.text
        answer_ids = self.runtime.encode(answer)
        if not answer_ids:
            return None
        ids = torch.tensor([prompt_ids + answer_ids], device=self.runtime.device)  # [1, seq]
        extra = {}
        if composed is not None:  # the documents sit at 0..offset-1; the prompt continues after them
            positions = torch.arange(composed.offset, composed.offset + ids.shape[1], device=ids.device)
            extra = {"cache": composed.new_cache(), "position_ids": positions[None]}
        with torch.inference_mode():
            logits = (
                self.runtime.model(input_ids=ids, **extra).logits[0, len(prompt_ids) - 1 : -1].float()
            )  # [n, vocab]
            logp = torch.log_softmax(logits, dim=-1)
            picked = logp.gather(1, torch.tensor(answer_ids, device=logp.device)[:, None])  # [n, 1]
        return float(picked.mean())


class OpenAIBackend:
    """An OpenAI-compatible chat completions server (vLLM, llama.cpp, Ollama, or a hosted API)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        stream: bool = True,
        native_tools: bool = True,
        transport: httpx.BaseTransport | None = None,
    ):
        """`native_tools` False: the tools are described in the instructions and the model answers
        in the text protocol's fenced blocks, for served models without function calling."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        self.stream = stream
        self.native_tools = native_tools
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10)), transport=transport
        )

    @classmethod
    def from_config(cls, config) -> OpenAIBackend:
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        return cls(
            config.base_url,
            config.model,
            key,
            timeout_s=config.request_timeout_s,
            retries=config.retries,
            native_tools=config.tool_protocol == "native",
        )

    def close(self) -> None:
        self._client.close()

    def _messages(self, conversation: Conversation) -> list[dict[str, Any]]:
        system = conversation.system
        context = _context_block(conversation)
        if context:
            system = f"{system}\n\n{context}"
        return [{"role": "system", "content": system}, *conversation.messages]

    def sample(
        self,
        conversation: Conversation,
        k: int,
        *,
        temperature: float,
        max_tokens: int,
        seed: int = 0,
        should_stop: ShouldStop = lambda: False,
    ) -> list[Sample]:
        """K answers: one request with `n = k`, then, from servers that ignore `n` (llama.cpp's,
        Ollama's), one request per missing answer, each with its own seed."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self._messages(conversation),
            "temperature": temperature,
            "max_tokens": max_tokens,
            "n": k,
            "seed": seed,
            "logprobs": True,
            "stream": self.stream,
        }
        if conversation.tools:
            body["tools"] = conversation.tools
        samples = self._with_retries(body, k, should_stop)[:k]
        while len(samples) < k:
            if should_stop():
                raise AgentCancelled("cancelled while the model server was answering")
            missing = k - len(samples)
            retry = {**body, "n": missing, "seed": seed + len(samples)}
            samples += self._with_retries(retry, missing, should_stop)[:missing]
        return samples

    def _with_retries(self, body: dict[str, Any], k: int, should_stop: ShouldStop) -> list[Sample]:
        for attempt in range(self.retries + 1):
            try:
                return self._request(body, k, should_stop)
            except (BackendConnectionError, BackendTimeoutError, _Retryable) as exc:
                if attempt == self.retries:
                    if isinstance(exc, _Retryable):
                        raise BackendError(str(exc)) from exc
                    raise
                delay = self.backoff_s * (2**attempt)
                log.warning("model server: %s; retrying in %.1fs", exc, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def logprob(self, conversation: Conversation, sample: Sample) -> float | None:
        return sample.logprob

    def _request(self, body: dict[str, Any], k: int, should_stop: ShouldStop) -> list[Sample]:
        url = f"{self.base_url}/chat/completions"
        try:
            with self._client.stream("POST", url, json=body) as response:
                self._check_status(response)
                if body["stream"] and response.headers.get("content-type", "").startswith(
                    "text/event-stream"
                ):
                    return _read_stream(response, k, should_stop)
                response.read()
                return _read_whole(response)
        except httpx.TimeoutException as exc:
            raise BackendTimeoutError(f"the model server at {self.base_url} did not answer in time") from exc
        except httpx.ConnectError as exc:
            raise BackendConnectionError(
                f"cannot connect to the model server at {self.base_url}: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            raise BackendConnectionError(f"the connection to {self.base_url} failed: {exc}") from exc

    def _check_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        response.read()
        detail = response.text[:300]
        if response.status_code in (401, 403):
            raise BackendAuthError(
                f"the model server at {self.base_url} refused the API key "
                f"(HTTP {response.status_code}): set agent.api_key_env to the variable "
                "holding a valid key"
            )
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code} from {self.base_url}: {detail}")
        raise BackendError(
            f"the model server at {self.base_url} answered HTTP {response.status_code}: {detail}"
        )


class _Retryable(BackendError):
    """A server answer worth retrying (429, 5xx)."""


def _tool_calls(raw: Any) -> list[ToolCall]:
    calls = []
    for item in raw or []:
        function = (item or {}).get("function") or {}
        name = function.get("name")
        arguments = function.get("arguments") or "{}"
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            args = {"__unparsable__": arguments}
        calls.append(
            ToolCall(
                name if isinstance(name, str) else "",
                args if isinstance(args, dict) else {"__unparsable__": arguments},
                item.get("id"),
            )
        )
    return calls


def _mean_logprob(choice: dict[str, Any]) -> float | None:
    content = ((choice.get("logprobs") or {}).get("content")) or []
    values = [
        t.get("logprob") for t in content if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
    ]
    return sum(values) / len(values) if values else None


def _read_whole(response: httpx.Response) -> list[Sample]:
    try:
        data = response.json()
        choices = data["choices"]
        samples = []
        for choice in choices:
            message = choice["message"]
            samples.append(
                Sample(
                    message.get("content") or "",
                    _tool_calls(message.get("tool_calls")),
                    int((data.get("usage") or {}).get("completion_tokens") or 0) // max(len(choices), 1),
                    _mean_logprob(choice),
                    choice.get("finish_reason") or "",
                )
            )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BackendError(
            f"the model server's answer is not a chat completion: {response.text[:200]!r}"
        ) from exc
    if not samples:
        raise BackendError("the model server answered no choices")
    return samples


def _read_stream(response: httpx.Response, k: int, should_stop: ShouldStop) -> list[Sample]:
    """Accumulate server-sent chat completion chunks per choice index."""
    texts: dict[int, list[str]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    logps: dict[int, list[float]] = {}
    finish: dict[int, str] = {}
    for line in response.iter_lines():
        if should_stop():
            raise AgentCancelled("cancelled while the model server was answering")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
            for choice in chunk["choices"]:
                _add_delta(choice, texts, calls, logps, finish)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendError(
                f"the model server streamed something that is not a chat chunk: {payload[:200]!r}"
            ) from exc
    indexes = sorted(set(texts) | set(calls))
    if not indexes:
        raise BackendError("the model server streamed no answer")
    samples = []
    for i in indexes:
        raw_calls = [
            {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments", "")}}
            for _, c in sorted(calls.get(i, {}).items())
        ]
        values = logps.get(i, [])
        samples.append(
            Sample(
                "".join(texts.get(i, [])),
                _tool_calls(raw_calls),
                len(values) or len(texts.get(i, [])),
                sum(values) / len(values) if values else None,
                finish.get(i, ""),
            )
        )
    return samples


def _add_delta(choice, texts, calls, logps, finish) -> None:
    index = int(choice.get("index", 0))
    delta = choice.get("delta") or {}
    if delta.get("content"):
        texts.setdefault(index, []).append(delta["content"])
    for call in delta.get("tool_calls") or []:
        slot = calls.setdefault(index, {}).setdefault(int(call.get("index", 0)), {})
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["name"] = function["name"]
        slot["arguments"] = slot.get("arguments", "") + (function.get("arguments") or "")
    for token in ((choice.get("logprobs") or {}).get("content")) or []:
        if isinstance(token.get("logprob"), int | float):
            logps.setdefault(index, []).append(float(token["logprob"]))
    if choice.get("finish_reason"):
        finish[index] = choice["finish_reason"]
