"""Where an inline completion ends: the rules an editor user expects, shared by the completion
path (`agent.completion`) and the trainer, which judges its samples by the text a user would see.

- mid-line: the rest of the current line only;
- after a line that does not open a block: the rest of that line only;
- otherwise a block, up to a dedent, a second blank line, a repeat of the code after the cursor or
  the line limit;
- right after an opening bracket (only closers after the cursor), a continuation that starts on the
  next line: its lines up to the one that closes that bracket (an argument list, a literal).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CursorContext",
    "Cut",
    "boundary_cut",
    "bracket_at_cursor",
    "cursor_context",
    "cut_at_boundary",
    "is_mid_line",
    "leaves_open",
    "may_span_lines",
    "opens_block",
    "suggestion",
]

# A line ending in one of these opens a block: the completion may continue on the following lines.
_BLOCK_OPENERS = (":", "{", "=>", " do", " then", "->")


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


def is_mid_line(ctx: CursorContext) -> bool:
    return bool(ctx.line_suffix.strip())


def bracket_at_cursor(ctx: CursorContext, language: str | None = None) -> str | None:
    """The opening bracket the cursor sits right after at the end of its line's code, or the one a
    comma there leaves open (`f(a,|`: the list goes on), with nothing but its closers after the
    cursor (as an editor that closes brackets leaves them); None elsewhere. A continuation there may
    go on the next lines, up to the one that closes it (`suggestion`)."""
    before = ctx.line_prefix.rstrip()
    after = "".join(ctx.line_suffix.split())
    if not before:
        return None
    if before[-1] in _CLOSERS:
        opener = before[-1]
    elif before[-1] == ",":
        opener = _innermost_open(before, language)
        if opener is None:
            return None
    else:
        return None
    if after and (after[0] != _CLOSERS[opener] or not set(after) <= set(_CLOSERS.values())):
        return None
    return opener


def _innermost_open(line: str, language: str | None) -> str | None:
    """The innermost bracket `line` opens and leaves open (None: all closed, or a string left open)."""
    open_: list[str] = []
    for index, char in _code_chars(line, language):
        if index < 0:
            return None
        if char in _CLOSERS:
            open_.append(char)
        elif open_ and char == _CLOSERS[open_[-1]]:
            open_.pop()
    return open_[-1] if open_ else None


def opens_block(line: str) -> bool:
    """Whether a completion after `line` (the cursor's line, up to the cursor) may span lines."""
    stripped = line.rstrip()
    return not stripped or stripped.endswith(_BLOCK_OPENERS)


def may_span_lines(ctx: CursorContext) -> bool:
    """Whether a suggestion at `ctx` may span lines (after a line that opens a block, or right after
    an opening bracket), so that one that ran out of tokens inside something it opened is worth
    finishing (`suggestion`'s `finish`): the trainer budgets its samples' extra tokens by it."""
    return bracket_at_cursor(ctx) is not None or (not is_mid_line(ctx) and opens_block(ctx.line_prefix))


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
    return boundary_cut(raw, ctx, max_lines, truncated).text


@dataclass(frozen=True)
class Cut:
    """`cut_at_boundary`'s text, and what ended it."""

    text: str
    # The length of the part of `raw` that decided the end: through the line break that ends a
    # line-only suggestion, the first character of a line indented less than the block, the break
    # ending a second blank line, the end of a line that repeats the code after the cursor; the
    # whole of `raw` when the model ended it there itself (`truncated` false: an end-of-sequence
    # token). None when the end was not the model's choice: the line limit, or tokens ran out.
    decided: int | None


def boundary_cut(raw: str, ctx: CursorContext, max_lines: int, truncated: bool = False) -> Cut:
    """`cut_at_boundary`, saying where in `raw` the model's own text decided the end (`Cut`): the
    trainer keeps those tokens in the loss, so a preference about where suggestions end is learnt
    as a preference about their content is (an end-of-sequence token is learnt so)."""
    if "\r\n" in raw:
        return Cut(cut_at_boundary(raw.replace("\r\n", "\n"), ctx, max_lines, truncated), None)
    if is_mid_line(ctx) or not opens_block(ctx.line_prefix):
        line, newline, _ = raw.partition("\n")
        decided = len(line) + 1 if newline else (None if truncated else len(raw))
        return Cut(line.rstrip(), decided)

    lines = raw.split("\n")
    starts = [0]  # starts[i]: the offset of lines[i] in `raw`
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    if truncated and len(lines) > 1:
        lines.pop()
        starts.pop()
    if not ctx.line_prefix.strip():
        # The cursor sits on an empty line: blank lines before the code are noise.
        while len(lines) > 1 and not lines[0].strip():
            lines.pop(0)
            starts.pop(0)
    prefix_lines = ctx.prefix.split("\n")
    previous = next((ln for ln in reversed(prefix_lines[:-1]) if ln.strip()), None)
    # Small models often restate the line they were given; drop that echo.
    if previous is not None:
        first_code = next((i for i, ln in enumerate(lines) if ln.strip()), None)
        if first_code is not None and (ctx.line_prefix + lines[first_code]).strip() == previous.strip():
            del lines[: first_code + 1]
            del starts[: first_code + 1]

    upcoming = next((ln.strip() for ln in ctx.following_lines if ln.strip()), None)
    kept: list[str] = []
    base_indent: int | None = None
    blank_run = 0
    decided: int | None = None if truncated else len(raw)
    for index, line in enumerate(lines):
        full = ctx.line_prefix + line if index == 0 else line
        if not line.strip():
            blank_run += 1
            if blank_run >= 2:
                decided = starts[index] + len(line) + 1 if index + 1 < len(lines) else decided
                break
            if kept and index == len(lines) - 1:
                break
            kept.append(line)
            continue
        blank_run = 0
        if upcoming is not None and line.strip() == upcoming:
            decided = starts[index] + len(line)
            break
        if base_indent is None:
            base_indent = _indent(full)
        elif _indent(full) < base_indent:
            decided = starts[index] + _indent(line) + 1
            break
        kept.append(line)
        if sum(1 for ln in kept if ln.strip()) >= max_lines:
            decided = None
            break
    return Cut("\n".join(kept).rstrip(), decided)


_CLOSERS = {"(": ")", "[": "]", "{": "}"}
# Text, not code: quotes there are apostrophes.
_PROSE = frozenset({"markdown", "plaintext", "text", "restructuredtext", "latex", "git-commit"})


def _code_chars(text: str, language: str | None):
    """(index, character) of the code in `text`: comments skipped, a string as its opening quote
    alone. A string left unterminated yields (-1, quote) and ends the scan."""
    python = language in (None, "python")
    comment = "#" if python else "//"
    quotes = "\"'" if python else "\"'`"
    i, n = 0, len(text)
    while i < n:
        if text.startswith(comment, i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if python and text.startswith(('"""', "'''"), i):
            end = text.find(text[i : i + 3], i + 3)
            if end < 0:
                yield -1, text[i]
                return
            yield i, text[i]
            i = end + 3
            continue
        char = text[i]
        if char in quotes:
            j = i + 1
            while j < n and text[j] != char and (char == "`" or text[j] != "\n"):
                j += 2 if text[j] == "\\" else 1
            if j >= n or text[j] != char:
                yield -1, char
                return
            yield i, char
            i = j + 1
            continue
        yield i, char
        i += 1


def leaves_open(text: str, language: str | None = None) -> bool:
    """Whether `text`, read on its own, leaves a string or a bracket open, so that inserting it
    breaks the code after it (a docstring cut off by the token budget, say).

    Python (the default) knows triple-quoted strings and `#` comments, and a last line that opens
    a block (`for x in xs:`) leaves that block open: it has no body. Other languages get quotes,
    backquotes and `//` comments. A closer of a bracket opened before `text` is not counted.
    Prose languages never count as open.
    """
    if language in _PROSE:
        return False
    expected: list[str] = []
    last = ""  # the last character of code outside strings and comments; "" before any
    for index, char in _code_chars(text, language):
        if index < 0:
            return True
        if char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif expected and char == expected[-1]:
            expected.pop()
        if not char.isspace():
            last = char
    # A Python block header as the last line (outside brackets, so not a slice or a dict): no body.
    return bool(expected) or (language in (None, "python") and last == ":")


def _closer_index(text: str, language: str | None) -> int | None:
    """Where in `text` the bracket it starts with is closed; None while it is open."""
    expected: list[str] = []
    for index, char in _code_chars(text, language):
        if index < 0:
            return None
        if char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif expected and char == expected[-1]:
            expected.pop()
            if not expected:
                return index
    return None


def _cut_back_to_closed(text: str, language: str | None = None) -> str:
    """`text` without its last lines, as few as leave nothing open; "" when no line does."""
    lines = text.split("\n")
    while lines and leaves_open("\n".join(lines), language):
        lines.pop()
    return "\n".join(lines).rstrip()


_DOCSTRING_OPENER = re.compile(r"""[rRuU]?(\"\"\"|''')""")
_SENTENCE_END = (".", "!", "?")
# What starts a docstring's fields or sections rather than continuing its summary (reST, Google, NumPy).
_DOCSTRING_SECTION = re.compile(
    r"(:(param|parameter|arg|type|returns?|rtype|raises?|yields?)\b|@\w+\b|"
    r"(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?|Attributes)\s*:?\s*$|-{3,}\s*$)")


def _docstring_summary(text: str, ctx: CursorContext, max_lines: int, truncated: bool) -> str:
    """A docstring that opens `text` and is not closed in it (the tokens ran out in its body),
    closed after its summary, as PEP 257 writes one: the docstring's first paragraph (up to a blank
    line, or a line that starts its fields or sections: `:param`, `Args:`), when it is complete (such
    a line follows it, or its last line ends a sentence), then the closing quotes on
    the summary's own line (`\"\"\"Return the total.\"\"\"`) or on a line of their own at the
    docstring's indentation. "" when there is no complete summary: a guess at one is not offered.

    The model's work is not thrown away when it writes a long docstring the budget cannot hold,
    and what is offered is its own text with only the closing quotes added."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None or (truncated and len(lines) == 1):
        return ""  # nothing, or a single line the budget cut in its middle
    opener = _DOCSTRING_OPENER.match(lines[first].lstrip(" \t"))
    if opener is None:
        return ""
    quote = opener.group(1)
    indent = (ctx.line_prefix if first == 0 else "") + lines[first][: _indent(lines[first])]
    head = lines[first].lstrip(" \t")[opener.end() :]
    body = [head.rstrip(), *(line.rstrip() for line in lines[first + 1 :])]
    summary: list[str] = []
    complete = False
    for line in body:
        if not line.strip() or _DOCSTRING_SECTION.match(line.strip()):
            if any(part.strip() for part in summary):
                complete = True  # a blank line, or a field list or section, ends the first paragraph
                break
            if line.strip():
                return ""  # the docstring opens with its fields: no summary
            summary.append(line)
            continue
        summary.append(line)
    while summary and not summary[-1].strip():
        summary.pop()
    if not summary or not (complete or summary[-1].endswith(_SENTENCE_END)):
        return ""
    if len(summary) == 1 and summary[0].strip():  # the summary on the opening line: one line
        kept = [*lines[:first], lines[first].rstrip() + quote]
    else:
        kept = [*lines[:first], lines[first].rstrip(), *summary[1:], indent + quote]
    if sum(1 for line in kept if line.strip()) > max_lines:
        return ""
    return "\n".join(kept)


def _starts_next_line(raw: str) -> bool:
    first, newline, _ = raw.replace("\r\n", "\n").partition("\n")
    return bool(newline) and not first.strip()


def _closed_after_cursor(ctx: CursorContext, opener: str, language: str | None) -> str | None:
    """Where the text after the cursor already closes the bracket `opener` at the cursor: "line"
    (an editor closed it), "below" (the following lines, none of them indented less than the
    cursor's line: the bracket's own lines are there already), or None."""
    if ctx.line_suffix.strip():
        return "line"
    indent = _indent(ctx.line_prefix)
    below: list[str] = []
    for line in ctx.following_lines:
        if line.strip() and _indent(line) < indent:
            break
        below.append(line)
    return "below" if _closer_index(opener + "\n" + "\n".join(below), language) is not None else None


def _bracket_lines(raw: str, ctx: CursorContext, opener: str, max_lines: int, truncated: bool,
                   language: str | None) -> str | None:
    """The suggestion of a continuation `raw` that starts with a line break right after the bracket
    `opener` at the cursor: its lines up to the one that closes the bracket; None when no line
    within `max_lines` does (a second blank line, or a line indented less than the cursor's, ends
    the search). What the text after the cursor already holds is left out: an editor's closer
    after the cursor ends the suggestion just before the model's; closing lines below the cursor
    make it the lines before the model's closing line (and before a repeat of the code there)."""
    lines = raw.replace("\r\n", "\n").split("\n")[1:]
    if truncated and lines:
        lines.pop()  # unfinished
    closed_after = _closed_after_cursor(ctx, opener, language)
    upcoming = next((ln.strip() for ln in ctx.following_lines if ln.strip()), None)
    indent = _indent(ctx.line_prefix)
    kept: list[str] = []
    for line in lines:
        if not line.strip():
            if kept and not kept[-1].strip():
                break
            kept.append(line)
            continue
        if _indent(line) < indent or (closed_after == "below" and line.strip() == upcoming):
            break
        kept.append(line)
        body = "\n".join(kept)
        close = _closer_index(opener + "\n" + body, language)
        if close is not None:
            return _closing(body, close - 2, opener, closed_after, language)
        if sum(1 for ln in kept if ln.strip()) >= max_lines:
            break
    if closed_after == "below":
        return _cut_back_to_closed("\n" + "\n".join(kept), language)
    return None


def _closing(body: str, close: int, opener: str, closed_after: str | None, language: str | None) -> str:
    """The suggestion of `body` (the lines after the cursor's line break) whose last line closes the
    cursor's bracket at `close`."""
    line_start = body.rfind("\n", 0, close) + 1
    if closed_after == "line":
        # The editor's closer follows the suggestion: end just before the model's.
        head = body[:close]
        return "\n" + (head if not body[line_start:close].strip() else head.rstrip())
    if closed_after == "below":
        return _cut_back_to_closed("\n" + body[: max(line_start - 1, 0)], language)
    whole = "\n" + body.rstrip()
    # What follows the closer on its line may open something of its own: keep up to the closer then.
    return whole if not leaves_open(opener + whole, language) else "\n" + body[: close + 1]


def _before_closer_after_cursor(text: str, ctx: CursorContext, language: str | None) -> str:
    """Inside brackets that the line closes after the cursor (`f(|)`, as an editor that closes
    brackets leaves it), a suggestion is cut before its own closer of that bracket: the line holds
    it already, and the suggestion is inserted, not replacing it (`f(x|)`, not `f(x))`)."""
    after = ctx.line_suffix.lstrip()
    if language in _PROSE or not after or after[0] not in _CLOSERS.values():
        return text
    expected: list[str] = []
    for index, char in _code_chars(text, language):
        if index < 0:
            return text
        if char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif char in _CLOSERS.values():
            if expected and char == expected[-1]:
                expected.pop()
            elif not expected:
                return text[:index].rstrip() if char == after[0] else text
    return text


def suggestion(raw: str, ctx: CursorContext, max_lines: int, truncated: bool, language: str | None = None,
               finish: Callable[[], tuple[str, bool] | None] | None = None) -> str:
    """What the completion path offers of a model continuation `raw` (`truncated`: it ran out of
    tokens). The completion path and the trainer both call it, so training scores what users see.

    Cut at the boundary (`cut_at_boundary`). A multi-line suggestion that ran out of tokens inside
    something it opened (`leaves_open`) is continued by `finish()`, which returns the longer raw
    text and whether that ran out too (None: no more), and cut again. One still open is cut back to
    its last line that closes everything.

    Right after an opening bracket (`bracket_at_cursor`), a continuation that starts on the next
    line is offered up to its line that closes the bracket (`_bracket_lines`), continued by
    `finish()` when it ran out of tokens first; one that does not close it gets the rules above.
    """
    opener = bracket_at_cursor(ctx, language) if language not in _PROSE else None
    if opener is not None and _starts_next_line(raw):
        lines = _bracket_lines(raw, ctx, opener, max_lines, truncated, language)
        if lines is None and truncated and finish is not None:
            more, finish = finish(), None
            if more is not None:
                raw, truncated = more
                lines = _bracket_lines(raw, ctx, opener, max_lines, truncated, language)
        if lines is not None:
            return lines
    text = cut_at_boundary(raw, ctx, max_lines, truncated=truncated)
    if is_mid_line(ctx):
        return _before_closer_after_cursor(text, ctx, language)
    if not opens_block(ctx.line_prefix) or not leaves_open(text, language):
        return text
    more = finish() if truncated and finish is not None else None
    if more is not None:
        text, truncated = cut_at_boundary(more[0], ctx, max_lines, truncated=more[1]), more[1]
    closed = _cut_back_to_closed(text, language)
    if not closed and language in (None, "python"):
        return _docstring_summary(text, ctx, max_lines, truncated)
    return closed
