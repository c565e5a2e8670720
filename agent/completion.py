"""Inline code completion: build the prompt around a cursor, generate, cut at a natural boundary.

The embedded model has no fill-in-the-middle training, so its prompt is the text before the cursor,
trimmed to a token budget (nearest text kept). A code model with FIM tokens (`context.fim`) reads
the text after the cursor too, in its family's format. Either way the text after the cursor is
used where it helps: mid-line the completion ends with the line; otherwise it stops before it would
repeat the code that already follows the cursor.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from context.boundary import (
    CursorContext,
    bracket_at_cursor,
    cursor_context,
    cut_at_boundary,
    is_mid_line,
    suggestion,
)
from context.config import CompletionConfig
from context.errors import GenerationCancelled, SquidcodeError
from context.fim import FimFormat, resolve, trim_suffix
from context.foreground import foreground_busy
from context.prompt_record import CHARS_PER_TOKEN_CEILING, ReferenceIdentity, ServedPrompt, window_ids
from context.runtime import ModelRuntime

__all__ = [
    "CompletionRequest",
    "Completion",
    "CursorContext",
    "ServedPrompt",
    "cursor_context",
    "build_prompt_ids",
    "fim_format",
    "served_prompt",
    "text_after",
    "cut_at_boundary",
    "complete",
    "complete_served",
    "warm_window",
]

log = logging.getLogger(__name__)

# Instruct-tuned models drift into chat markdown; a fence never belongs in a code suggestion.
_PROSE_STOPS = ("```",)


@dataclass(frozen=True)
class CompletionRequest:
    """A document and a cursor, as a character offset into its text."""

    text: str
    offset: int
    language: str | None = None
    path: str | None = None  # the file, so it is never its own reference document


@dataclass(frozen=True)
class Completion:
    """Text to insert at the cursor, with what it cost and the prompt it was answered from."""

    text: str
    latency_s: float
    prompt_tokens: int
    new_tokens: int
    stop_reason: str
    prompt: ServedPrompt  # recorded with the episode; the trainer prompts with it as it is
    # What answered: "local" (this process's model), or a completion server's backend:model.
    served_by: str = "local"
    cached_tokens: int = 0  # prompt tokens a completion server took from its prompt cache

    @property
    def reference_tokens(self) -> int:
        """Tokens of Squid-composed reference documents before the prompt."""
        return self.prompt.reference_tokens

    @property
    def dropped_tokens(self) -> int:
        """Tokens of the `prefix_tokens` window left out to answer within `keystroke_prefill_tokens`."""
        return self.prompt.dropped_tokens


def fim_format(runtime, config: CompletionConfig) -> FimFormat | None:
    """The fill-in-the-middle format `completion.fim` asks for with this model; None: the prefix
    prompt ("off", or "auto" with a model without FIM tokens). "auto" with an adapter applied that
    was trained in a format (`ModelRuntime.adapter_fim`): that one."""
    if config.fim == "auto":
        return getattr(runtime, "adapter_fim", None) or getattr(runtime, "fim_format", None)
    return resolve(config.fim, ())


def text_after(request: CompletionRequest, config: CompletionConfig) -> str:
    """The document after the cursor, as much as a FIM prompt's `suffix_tokens` can hold."""
    return request.text[request.offset : request.offset + config.suffix_tokens * CHARS_PER_TOKEN_CEILING]


def served_prompt(runtime, request: CompletionRequest, ctx: CursorContext,
                  config: CompletionConfig) -> ServedPrompt:
    """The prompt the local model answers `request` from: the window before the cursor, in the
    model's FIM format with the text after the cursor when it has one."""
    fmt = fim_format(runtime, config)
    return ServedPrompt.build(runtime, ctx, config, fmt, text_after(request, config) if fmt else "")


def build_prompt_ids(runtime: ModelRuntime, prefix: str, budget_tokens: int) -> list[int]:
    """Token ids of the text before the cursor, at most `budget_tokens`, nearest text kept."""
    return window_ids(runtime.encode, prefix, budget_tokens)


@dataclass(frozen=True)
class _References:
    """The reference documents composed for one request: a private cache and what it holds."""

    cache: object = None
    tokens: int = 0
    composed: object = None  # the `context.squid.ComposedContext` the cache is a copy of

    def served(self, decode: Callable[[list[int]], str]) -> dict:
        """`ServedPrompt`'s reference fields: each document's identity and text (its served tokens
        decoded), the shared prefix's hash, the recovery."""
        composed = self.composed
        if composed is None:
            return {}
        sources = composed.sources or (None,) * len(composed.spans)
        identities = tuple(
            ReferenceIdentity(key.content, source, end - start, decode(list(composed.token_ids[start:end])))
            for key, (start, end), source in zip(composed.document_keys, composed.spans, sources, strict=True)
        )
        recovery = tuple(sorted(asdict(composed.recovery).items())) if composed.recovery else ()
        return {"references": identities, "reference_tokens": self.tokens,
                "reference_prefix": composed.prefix_hash, "reference_recovery": recovery}


def _reading(runtime: ModelRuntime, references, composed: _References) -> ModelRuntime:
    """The runtime that continues `composed`: the references' reader (`squid.reader`, a copy of the
    model with a Squid reader merged in) after a composition while `runtime` runs the base model;
    `runtime` itself otherwise (no references, or an adapter applied: its caches are not the base
    model's the reader was distilled on)."""
    reader = getattr(references, "reader", None)
    if composed.cache is None or reader is None or runtime.adapter_id is not None:
        return runtime
    return reader


def _reference_cache(references, prefix: str, wait: bool = False, should_pause=None) -> _References:
    """A private cache of the Squid-composed reference documents (an empty one without any);
    `wait`: with every reference, the ones not encoded yet encoded first, giving way (raising
    GenerationCancelled) when `should_pause` turns true."""
    if references is None:
        return _References()
    try:
        if should_pause is None:
            composed = references.compose(prefix, wait=wait)
        else:
            composed = references.compose(prefix, wait=wait, should_pause=should_pause)
    except GenerationCancelled:
        raise
    except (SquidcodeError, RuntimeError, ValueError, OSError) as exc:
        # References only improve a completion; one that cannot have them still gets one.
        log.warning("squid: reference documents unavailable (%s); completing without them", exc)
        return _References()
    if composed is None:
        return _References()
    log.info("squid: %d reference documents composed (%d tokens, recomputed %.0f%%)",
             len(composed.spans), composed.offset, 100 * composed.recomputed_fraction)
    return _References(composed.new_cache(), composed.offset, composed)


def complete(
    runtime: ModelRuntime,
    request: CompletionRequest,
    config: CompletionConfig,
    should_stop: Callable[[], bool] | None = None,
    references=None,
) -> Completion | None:
    """One inline completion at the cursor, or None when there is nothing worth offering.

    `references` (a `context.squid.references.CompletionReferences`, None = off) supplies reference
    documents as a Squid-composed cache that the prompt continues from.
    """
    hold = references.foreground() if references is not None else contextlib.nullcontext()
    with hold:
        return _complete(runtime, request, config, should_stop, references)


def warm_window(runtime: ModelRuntime, request: CompletionRequest, config: CompletionConfig,
                references=None, should_stop: Callable[[], bool] | None = None) -> bool:
    """Prefill the whole completion window at `request`'s cursor while nothing waits on the model.

    A keystroke that could not reuse the cached window got a shorter one (`keystroke_prefill_tokens`);
    this brings the full `prefix_tokens` back for the keystrokes that follow. It stops as soon as
    foreground work (the next completion) waits, keeping its progress. True when the window is held.
    """
    if config.keystroke_prefill_tokens == 0:
        return True  # completions prefill the whole window themselves
    # The background encoder waits meanwhile: on two cores the two would share them at half speed each,
    # and the window warmed first serves the very next keystroke.
    hold = references.foreground() if references is not None else contextlib.nullcontext()
    with hold:
        return _warm(runtime, request, config, references, should_stop)


def _warm(runtime, request, config, references, should_stop) -> bool:
    ctx = cursor_context(request.text, request.offset, config.suffix_lines)
    prompt = served_prompt(runtime, request, ctx, config)
    # The window is warmed after every reference the next keystroke will read, the ones still
    # queued for the background encoder encoded here first: warmed after the ready ones only, the
    # window no longer matched once the rest were ready, and the next keystroke answered from a
    # `keystroke_prefill_tokens` window (seen on real code: half the file context lost to Squid).
    # Those encodes give way to the next keystroke as the window's prefill does, keeping their work.
    stop = should_stop or (lambda: False)
    try:
        composed = _reference_cache(references, ctx.prefix, wait=True,
                                    should_pause=lambda: foreground_busy() or stop())
    except GenerationCancelled:
        return False
    return _reading(runtime, references, composed).warm(list(prompt.ids), past=composed.cache,
                                                        should_stop=should_stop)


def _complete(runtime, request, config, should_stop, references) -> Completion | None:
    started = time.perf_counter()
    ctx = cursor_context(request.text, request.offset, config.suffix_lines)
    prompt = served_prompt(runtime, request, ctx, config)
    prompt_ids, heal = list(prompt.ids), prompt.heal
    stop = _stops(ctx, config, request.language)
    composed = _reference_cache(references, ctx.prefix)
    model = _reading(runtime, references, composed)
    if model is not runtime:
        log.info("squid: the composition read through the reader %s", model.reader_id)
    try:
        result = model.generate(
            prompt_ids,
            max_new_tokens=config.max_tokens,
            stop=stop,
            temperature=config.temperature,
            should_stop=should_stop,
            heal=heal,
            past=composed.cache,
            prefill_limit=config.keystroke_prefill_tokens,  # None: as tuned for this machine
            pinned=prompt.pinned_tokens,
        )
    except GenerationCancelled:
        return None
    if result.stop_reason == "stopped_by_caller":
        return None
    raw, new_tokens, reason = result.text, result.new_tokens, result.stop_reason
    finished = []

    def finish():
        # The budget ran out inside something the completion opened: let it close it.
        more = (_finish(runtime, prompt, heal + raw, ctx, config, stop, should_stop, references)
                if config.finish_tokens else None)
        if more is None:
            return None
        finished.append(more)
        return raw + more.text, more.stop_reason == "length"

    text = suggestion(raw, ctx, config.max_lines, reason == "length", request.language, finish)
    if finished:
        new_tokens, reason = new_tokens + finished[0].new_tokens, finished[0].stop_reason
    if not text.strip():
        return None
    return Completion(
        text=text,
        latency_s=time.perf_counter() - started,
        prompt_tokens=result.prompt_tokens,
        new_tokens=new_tokens,
        stop_reason=reason,
        prompt=replace(prompt, stop=stop, dropped_tokens=result.dropped_tokens,
                       **composed.served(runtime.decode), reader=getattr(model, "reader_id", None) or ""),
    )


def _stops(ctx: CursorContext, config: CompletionConfig, language: str | None) -> tuple[str, ...]:
    # Mid-line a suggestion ends with the line, except after an opening bracket the editor closed:
    # an argument list may start on the next line (`context.boundary.suggestion`).
    one_line = is_mid_line(ctx) and bracket_at_cursor(ctx) is None
    stop = tuple(config.stop) + (("\n",) if one_line else ("\n\n\n",))
    return stop + (_PROSE_STOPS if language != "markdown" else ())


class _FinishWanted(Exception):
    """The boundary rules want more of an answer that ran out inside what it opened."""


async def complete_served(server, request: CompletionRequest, config: CompletionConfig,
                          cancelled: Callable[[], bool], references: tuple[tuple[str, str], ...] = ()
                          ) -> Completion | None:
    """One inline completion from a completion server (`agent.completion_server`), cut by the
    same boundary rules as the local model's; None: nothing worth offering, or cancelled.

    `references`: (path, text) of the reference documents. Raises the server's `BackendError`s.
    Without the server's tokenizer the window is measured in characters (`_SERVER_CHARS_PER_TOKEN`).
    """
    from .completion_server import HoleRequest

    started = time.perf_counter()
    ctx = cursor_context(request.text, request.offset, config.suffix_lines)
    prefix = _server_window(ctx.prefix, config.prefix_tokens * _SERVER_CHARS_PER_TOKEN)
    suffix = trim_suffix(text_after(request, config), config.suffix_tokens,
                         lambda part: -(-len(part) // _SERVER_CHARS_PER_TOKEN))
    hole = HoleRequest(prefix, suffix, request.path or "", references, config.max_tokens,
                       _stops(ctx, config, request.language), config.temperature)
    answer = await server.complete(hole, cancelled)
    if answer is None:
        return None

    def wanted():
        raise _FinishWanted

    ran_out = answer.stop_reason == "length"
    more = None
    try:
        text = suggestion(answer.text, ctx, config.max_lines, ran_out, request.language,
                          wanted if config.finish_tokens else None)
    except _FinishWanted:
        more = await server.complete(replace(hole, continuation=answer.text, max_tokens=config.finish_tokens),
                                     cancelled)
        if more is None:
            return None
        text = suggestion(answer.text, ctx, config.max_lines, ran_out, request.language,
                          lambda: (answer.text + more.text, more.stop_reason == "length"))
    if not text.strip():
        return None
    prompt = ServedPrompt(ids=None, text=prefix, start=len(ctx.prefix) - len(prefix),
                          line_suffix=ctx.line_suffix, following_lines=ctx.following_lines,
                          prefix_tokens=config.prefix_tokens, max_lines=config.max_lines,
                          finish_tokens=config.finish_tokens, max_tokens=config.max_tokens, stop=hole.stop,
                          fim=config.fim, suffix=suffix)
    return Completion(
        text=text, latency_s=time.perf_counter() - started, prompt_tokens=answer.prompt_tokens,
        new_tokens=answer.new_tokens + (more.new_tokens if more else 0),
        stop_reason=(more or answer).stop_reason, prompt=prompt, served_by=server.name,
        cached_tokens=answer.cached_tokens,
    )


# Code is ~3-4 characters per token; a server's window is cut by this estimate (it has the tokenizer).
_SERVER_CHARS_PER_TOKEN = 4


# The server's window starts at a multiple of a quarter of its length: it keeps its start while
# the next quarter is typed, so the server's prompt cache (a matching prefix) holds across keystrokes.
_WINDOW_STEPS = 4


def _server_window(prefix: str, chars: int) -> str:
    """At most the last `chars` characters before the cursor (at least three quarters of them), from
    the start of a line when there is one. Its start moves in steps of `chars // _WINDOW_STEPS`
    characters, not at every keystroke: a window that slid with the cursor would begin at another
    line every line or so, and the server would read the whole prompt again each time."""
    if len(prefix) <= chars:
        return prefix
    step = max(chars // _WINDOW_STEPS, 1)
    window = prefix[-(-(len(prefix) - chars) // step) * step:]
    newline = window.find("\n")
    return window[newline + 1:] if 0 <= newline < len(window) - 1 else window


def _finish(runtime, prompt: ServedPrompt, generated: str, ctx, config, stop, should_stop, references):
    """Up to `finish_tokens` more after `prompt` + `generated`, or None when cancelled."""
    composed = _reference_cache(references, ctx.prefix)  # a fresh copy: generation may extend one
    try:
        more = _reading(runtime, references, composed).generate(
            list(prompt.ids) + runtime.encode(generated),
            pinned=prompt.pinned_tokens,
            max_new_tokens=config.finish_tokens,
            stop=stop,
            temperature=config.temperature,
            should_stop=should_stop,
            past=composed.cache,
            prefill_limit=config.keystroke_prefill_tokens,
        )
    except GenerationCancelled:
        return None
    return None if more.stop_reason == "stopped_by_caller" else more

