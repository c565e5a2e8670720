"""Inline code completion: build the prompt around a cursor, generate, cut at a natural boundary.

The embedded model has no fill-in-the-middle training, so the prompt is the text before the cursor,
trimmed to a token budget (nearest text kept). The text after the cursor is used where it helps:
mid-line the completion ends with the line; otherwise it stops before it would repeat the code that
already follows the cursor.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from context.config import CompletionConfig
from context.errors import GenerationCancelled, SquidcodeError
from context.runtime import ModelRuntime

__all__ = [
    "CompletionRequest",
    "Completion",
    "CursorContext",
    "cursor_context",
    "build_prompt_ids",
    "cut_at_boundary",
    "complete",
]

log = logging.getLogger(__name__)

# Characters per token is ~3-4 for code; reading 8x the token budget in characters is always enough
# and keeps a huge document from being tokenized whole.
_CHARS_PER_TOKEN_CEILING = 8
# A line ending in one of these opens a block: the completion may continue on the following lines.
_BLOCK_OPENERS = (":", "{", "=>", " do", " then", "->")
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
    """Text to insert at the cursor, with what it cost."""

    text: str
    latency_s: float
    prompt_tokens: int
    new_tokens: int
    stop_reason: str
    reference_tokens: int = 0  # tokens of Squid-composed reference documents before the prompt


@dataclass(frozen=True)
class CursorContext:
    """The text around the cursor that the prompt and the boundary rules look at."""

    prefix: str  # everything before the cursor
    line_prefix: str  # the cursor's line, up to the cursor
    line_suffix: str  # the cursor's line, after the cursor
    following_lines: tuple[str, ...]  # the next lines after the cursor's line


def cursor_context(text: str, offset: int, suffix_lines: int) -> CursorContext:
    offset = max(0, min(offset, len(text)))
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    following: list[str] = []
    cursor = line_end + 1
    while len(following) < suffix_lines and cursor < len(text):
        nxt = text.find("\n", cursor)
        nxt = len(text) if nxt < 0 else nxt
        following.append(text[cursor:nxt].rstrip("\r"))
        cursor = nxt + 1
    return CursorContext(
        prefix=text[:offset],
        line_prefix=text[line_start:offset],
        line_suffix=text[offset:line_end].rstrip("\r"),
        following_lines=tuple(following),
    )


def build_prompt_ids(runtime: ModelRuntime, prefix: str, budget_tokens: int) -> list[int]:
    """Token ids of the text before the cursor, at most `budget_tokens`, nearest text kept."""
    window = prefix[-budget_tokens * _CHARS_PER_TOKEN_CEILING :]
    ids = runtime.encode(window)
    return ids[-budget_tokens:]


def _is_mid_line(ctx: CursorContext) -> bool:
    return bool(ctx.line_suffix.strip())


def _opens_block(line: str) -> bool:
    stripped = line.rstrip()
    return not stripped or stripped.endswith(_BLOCK_OPENERS)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def cut_at_boundary(raw: str, ctx: CursorContext, max_lines: int, truncated: bool = False) -> str:
    """Cut a raw model continuation where an editor user expects a suggestion to end.

    - mid-line: the rest of the current line only;
    - after a line that does not open a block: the rest of that line only;
    - otherwise a block: lines until one is indented less than the block, a second blank line,
      a line that repeats the code after the cursor, or `max_lines`; when generation ran out of
      tokens (`truncated`), the unfinished last line is dropped.
    """
    raw = raw.replace("\r\n", "\n")
    if _is_mid_line(ctx) or not _opens_block(ctx.line_prefix):
        return raw.split("\n", 1)[0].rstrip()

    lines = raw.split("\n")
    if truncated and len(lines) > 1:
        lines.pop()
    if not ctx.line_prefix.strip():
        # The cursor sits on an empty line: blank lines before the code are noise.
        while len(lines) > 1 and not lines[0].strip():
            lines.pop(0)
    prefix_lines = ctx.prefix.split("\n")
    previous = next((ln for ln in reversed(prefix_lines[:-1]) if ln.strip()), None)
    # Small models often restate the line they were given; drop that echo.
    if previous is not None:
        first_code = next((i for i, ln in enumerate(lines) if ln.strip()), None)
        if first_code is not None and (ctx.line_prefix + lines[first_code]).strip() == previous.strip():
            del lines[: first_code + 1]

    upcoming = next((ln.strip() for ln in ctx.following_lines if ln.strip()), None)
    kept: list[str] = []
    base_indent: int | None = None
    blank_run = 0
    for index, line in enumerate(lines):
        full = ctx.line_prefix + line if index == 0 else line
        if not line.strip():
            blank_run += 1
            if blank_run >= 2 or (kept and index == len(lines) - 1):
                break
            kept.append(line)
            continue
        blank_run = 0
        if upcoming is not None and line.strip() == upcoming:
            break
        if base_indent is None:
            base_indent = _indent(full)
        elif _indent(full) < base_indent:
            break
        kept.append(line)
        if sum(1 for ln in kept if ln.strip()) >= max_lines:
            break
    return "\n".join(kept).rstrip()


def _reference_cache(references, prefix: str):
    """A private cache of the Squid-composed reference documents, or (None, 0) without any."""
    if references is None:
        return None, 0
    try:
        composed = references.compose(prefix)
    except (SquidcodeError, RuntimeError, ValueError, OSError) as exc:
        # References only improve a completion; one that cannot have them still gets one.
        log.warning("squid: reference documents unavailable (%s); completing without them", exc)
        return None, 0
    if composed is None:
        return None, 0
    log.info("squid: %d reference documents composed (%d tokens, recomputed %.0f%%)",
             len(composed.spans), composed.offset, 100 * composed.recomputed_fraction)
    return composed.new_cache(), composed.offset


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


def _complete(runtime, request, config, should_stop, references) -> Completion | None:
    started = time.perf_counter()
    ctx = cursor_context(request.text, request.offset, config.suffix_lines)
    prompt_ids = build_prompt_ids(runtime, ctx.prefix, config.prefix_tokens)
    # Token healing: a prompt ending in whitespace (indentation, a space after `return`) ends on
    # a token the model rarely saw there; drop it and let generation regenerate it.
    heal = ""
    if len(prompt_ids) > 1:
        last_text = runtime.decode(prompt_ids[-1:])
        if last_text and not last_text.strip():
            prompt_ids, heal = prompt_ids[:-1], last_text
    stop = tuple(config.stop) + (("\n",) if _is_mid_line(ctx) else ("\n\n\n",))
    if request.language != "markdown":
        stop += _PROSE_STOPS
    past, reference_tokens = _reference_cache(references, ctx.prefix)
    try:
        result = runtime.generate(
            prompt_ids,
            max_new_tokens=config.max_tokens,
            stop=stop,
            temperature=config.temperature,
            should_stop=should_stop,
            heal=heal,
            past=past,
        )
    except GenerationCancelled:
        return None
    if result.stop_reason == "stopped_by_caller":
        return None
    text = cut_at_boundary(result.text, ctx, config.max_lines, truncated=result.stop_reason == "length")
    if not text.strip():
        return None
    return Completion(
        text=text,
        latency_s=time.perf_counter() - started,
        prompt_tokens=result.prompt_tokens,
        new_tokens=result.new_tokens,
        stop_reason=result.stop_reason,
        reference_tokens=reference_tokens,
    )
