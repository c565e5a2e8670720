"""Next edits: a %-format expression converted by hand goes on at the next one.

A repository moving from `%` formatting to `str.format` or f-strings is converted one expression at
a time (`"Status for %s" % path` -> `"Status for {}".format(path)`, or `f"Status for {path}"`). The
deterministic path (`context.next_edit`) repeats the same text between the same neighbours; these
changes differ at every place, so they are repeated here as a conversion: the developer's own one is
read (the line as it was before the edits made on it, against the line now), the style it shows is
the one of `VARIANTS` whose conversion of their old expression gives exactly what they wrote, and
the next %-format expression in code (after the cursor first, then from the top) is converted in
that style. Only what converts faithfully is offered: no `%(name)s` keys, no `*` widths, no `%c`,
no single operand for several placeholders (a tuple held in a variable), no bytes, and in f-strings
no expression that cannot stand in one (a backslash, braces, a quote of both kinds).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["VARIANTS", "Expression", "Style", "closing", "conversion_of", "convert", "expression_at",
           "line_before_edits", "next_conversion", "percent_expressions"]

_SPEC = re.compile(r"%(?:\((?P<key>[^)]*)\))?(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?"
                   r"(?:\.(?P<precision>\*|\d*))?(?P<kind>[diouxXeEfFgGcrsa%])")
# A string literal on one line (no f-string: its own braces are not a %-format's).
_STRING = re.compile(r"""(?<![A-Za-z0-9_])(?P<prefix>[uUrR]?)(?P<quote>"|')"""
                     r"""(?P<body>(?:\\.|(?!(?P=quote))[^\\\n])*)(?P=quote)""")
_QUOTED = re.compile(r"""(?P<quote>"|')(?:\\.|(?!(?P=quote))[^\\\n])*(?P=quote)""")
_PERCENT = re.compile(r"[ \t]*%(?!=)[ \t]*")
_ATTRIBUTE = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d[\d_.]*[jJ]?")
_CLOSE = {"(": ")", "[": "]", "{": "}"}
Place = tuple[int, int, str]  # [start, end) of a text and what replaces it


@dataclass(frozen=True)
class Style:
    """How a %-format expression is converted: to `.format(...)` or to an f-string; `int_spec`:
    `%d` keeps its `d` (`{:d}`, else `{}`); `left_explicit`: `%-5s` is `{:<5}` (else `{:5}`);
    `double_quotes`: a single-quoted literal becomes double-quoted (a formatter's style)."""

    fstring: bool
    int_spec: bool = False
    left_explicit: bool = False
    double_quotes: bool = False


# In the order tried: the first that reproduces the developer's conversion is theirs (so a choice
# their conversion did not show falls to the plainer one, as pyupgrade writes it).
VARIANTS = tuple(Style(*choice) for choice in itertools.product((False, True), repeat=4))


@dataclass(frozen=True)
class Expression:
    """`literal % operand` at [start, end) of a text: the literal's prefix, quote and body, and the
    operands (the tuple's items, or the one operand) as written."""

    start: int
    end: int
    prefix: str
    quote: str
    body: str
    operands: tuple[str, ...]
    tuple_operand: bool


def _skip_string(text: str, at: int) -> int:
    """The end of the string literal at `at` (a quote), or -1 when it does not end on its line."""
    match = _QUOTED.match(text, at)
    return match.end() if match else -1


def closing(text: str, at: int, lines: bool = False) -> int:
    """The offset after the bracket matching the one at `at` (strings inside skipped); -1 if none.
    On the same line only, unless `lines` (comments then skipped too)."""
    depth = 0
    i = at
    while i < len(text):
        char = text[i]
        if char in "\"'":
            end = _skip_string(text, i)
            if end < 0:
                return -1
            i = end
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif char == "\n" or char == "#":
            if not lines:
                return -1  # one line only: a conversion across lines is not one edit of a line
            if char == "#":
                i = text.find("\n", i)
                if i < 0:
                    return -1
        i += 1
    return -1


def _operand_end(text: str, at: int) -> int:
    """The end of the operand of `%` at `at`: an atom (a name, a number, a string, a bracket) and
    its trailers (`.name`, a call, a subscript); -1 when there is none."""
    if at >= len(text):
        return -1
    char = text[at]
    if char in _CLOSE:
        end = closing(text, at)
    elif char in "\"'" or (char in "uUrRbBfF" and text[at + 1 : at + 2] in ("'", '"')):
        end = _skip_string(text, at + (char not in "\"'"))
    else:
        match = _NAME.match(text, at)
        end = match.end() if match else -1
    while end > 0 and end < len(text):
        if text[end] == "." and (match := _ATTRIBUTE.match(text, end)):
            end = match.end()
        elif text[end] in "([":
            end = closing(text, end)
        else:
            break
    return end


def _split_items(inner: str) -> list[str]:
    """The items of a tuple's inner text, split at its top-level commas (a trailing one dropped)."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(inner):
        char = inner[i]
        if char in "\"'":
            end = _skip_string(inner, i)
            i = end if end > 0 else len(inner)
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
        i += 1
    items.append(inner[start:])
    if items and not items[-1].strip():
        items.pop()
    return [item.strip() for item in items]


def percent_expressions(text: str, start: int = 0, end: int | None = None) -> Iterator[Expression]:
    """The `string % operand` expressions on single lines of `text[start:end]`, in order."""
    end = len(text) if end is None else end
    for match in _STRING.finditer(text, start, end):
        after = _PERCENT.match(text, match.end())
        if not after:
            continue
        left = text[max(0, match.start() - 80) : match.start()].rstrip(" \t")
        if left.endswith(("'", '"', "*", "/", "%", "@", "**")):
            continue  # the literal continues another (`"a" "%s"`), or is the right side of a product
        operand_end = _operand_end(text, after.end())
        if operand_end < 0 or operand_end > end or text.startswith("**", operand_end) or \
                re.match(r"[ \t]*\*\*", text[operand_end : operand_end + 8]):
            continue  # `"%s" % x ** 2` formats `x ** 2`
        operand = text[after.end() : operand_end]
        items = _split_items(operand[1:-1]) if operand[0] == "(" else []
        tuple_operand = operand[0] == "(" and (len(items) != 1 or operand[1:-1].rstrip().endswith(","))
        operands = tuple(items) if tuple_operand else (operand[1:-1].strip() if operand[0] == "(" and items
                                                        else operand,)
        yield Expression(match.start(), operand_end, match.group("prefix"), match.group("quote"),
                         match.group("body"), operands, tuple_operand)


def _field(spec: re.Match, style: Style) -> str | None:
    """The replacement field's conversion and format spec for one %-spec (`!r`, `:02d`, ``), or None
    when it has no faithful one."""
    flags, width, precision, kind = spec["flags"], spec["width"] or "", spec["precision"], spec["kind"]
    if spec["key"] is not None or width == "*" or precision == "*" or kind == "c":
        return None
    conversion = {"r": "!r", "a": "!a"}.get(kind, "")
    align = ""
    if "-" in flags:
        align = "<" if style.left_explicit or kind not in "sra" else ""
    elif width and kind in "sra":
        align = ">"  # % right-aligns text in its width; format's default for text is left
    sign = "".join(flag for flag in "+ " if flag in flags)
    alternate = "#" if "#" in flags else ""
    zero = "0" if "0" in flags and "-" not in flags and kind not in "sra" else ""
    dot = "" if precision is None else "." + (precision or "0")
    if kind in "sra":
        kind_spec = ""
    elif kind in "diu":
        kind_spec = "d" if style.int_spec or sign or alternate else ""
    else:
        kind_spec = kind
    spec_text = align + sign + alternate + zero + width + dot + kind_spec
    return conversion + (":" + spec_text if spec_text else "")


def _fits_fstring(expression: str, quote: str) -> str | None:
    """`expression` as it can stand in an f-string quoted with `quote` (its quotes turned to the
    other kind when it has only those), or None."""
    if any(char in expression for char in "\\{}\n#") or re.search(r"(?<![=!<>]):|!(?!=)", expression):
        return None
    other = "'" if quote == '"' else '"'
    if quote in expression:
        if other in expression:
            return None
        expression = expression.replace(quote, other)
    return expression


def convert(expression: Expression, style: Style) -> str | None:
    """`expression` converted in `style`, or None when it does not convert faithfully."""
    if "b" in expression.prefix.lower() or "f" in expression.prefix.lower():
        return None
    pieces, fields, last = [], [], 0
    body = expression.body
    for spec in _SPEC.finditer(body):
        literal = body[last : spec.start()]
        pieces.append(literal.replace("{", "{{").replace("}", "}}"))
        last = spec.end()
        if spec["kind"] == "%":
            if spec.group() != "%%":
                return None
            pieces.append("%")
            continue
        field = _field(spec, style)
        if field is None:
            return None
        fields.append(len(pieces))
        pieces.append(field)
    tail = body[last:]
    if "%" in tail:
        return None  # a lone `%` that is no spec: not a format string this can read
    pieces.append(tail.replace("{", "{{").replace("}", "}}"))
    operands = expression.operands
    if not fields or len(operands) != len(fields):
        return None
    prefix = expression.prefix.replace("u", "").replace("U", "")
    quote = expression.quote
    if style.double_quotes and quote == "'":
        if '"' in body or "\\'" in body:
            return None
        quote = '"'
    if style.fstring:
        for index, operand in zip(fields, operands, strict=True):
            fitted = _fits_fstring(operand, quote)
            if fitted is None:
                return None
            pieces[index] = "{" + fitted + pieces[index] + "}"
        return prefix + "f" + quote + "".join(pieces) + quote
    for index in fields:
        pieces[index] = "{" + pieces[index] + "}"
    literal = prefix + quote + "".join(pieces) + quote
    return literal + ".format(" + ", ".join(operands) + ")"


def conversion_of(line_before: str, line_now: str) -> tuple[Expression, Style] | None:
    """The %-format expression of `line_before` that `line_now` has converted, and the style of its
    conversion (the first of `VARIANTS` that gives what was written); None when the change is no
    such conversion."""
    if "%" not in line_before or line_before == line_now:
        return None
    for expression in percent_expressions(line_before):
        head, tail = line_before[: expression.start], line_before[expression.end :]
        if not (line_now.startswith(head) and line_now.endswith(tail)):
            continue
        written = line_now[len(head) : len(line_now) - len(tail)]
        for style in VARIANTS:
            if convert(expression, style) == written:
                return expression, style
    return None


def expression_at(text: str, offset: int) -> Expression | None:
    """The %-format expression of `text` that holds `offset`, if one does (on its line)."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    on_line = percent_expressions(text, line_start, line_end)
    return next((e for e in on_line if e.start <= offset < e.end), None)


def next_conversion(text: str, cursor: int, converted: Expression, style: Style,
                    skip: Sequence[tuple[int, int]], code: Callable[[int], bool]) -> Place | None:
    """The next %-format expression of `text` that converts in `style`: (start, end, its
    conversion). The same expression as `converted` (the one the developer converted: its literal
    and operands) first, then one with the same literal, then any; at each, after `cursor` first;
    then the first of them from the top. Not one overlapping a span of `skip`, nor one where
    `code(offset)` is false (in a string or a comment)."""
    tiers: list[list[Place]] = [[], [], []]
    for expression in percent_expressions(text):
        if any(expression.start < end and start < expression.end for start, end in skip):
            continue
        if not code(expression.start):
            continue
        result = convert(expression, style)
        if result is None:
            continue
        same_literal = (expression.prefix, expression.body) == (converted.prefix, converted.body)
        tier = 2 - same_literal - (same_literal and expression.operands == converted.operands)
        tiers[tier].append((expression.start, expression.end, result))
    above = None
    for places in tiers:
        below = next((place for place in places if place[0] >= cursor), None)
        if below is not None:
            return below
        above = above or (places[0] if places else None)
    return above


def line_before_edits(text: str, edits: Iterable, offset: int) -> tuple[str, str] | None:
    """The line of `text` holding `offset` as it was before the latest edits made on it (newest
    first in `edits`: objects with `start`, `old`, `new`, offsets in the document before each), and as
    it is now; None when the newest edit spans lines."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    now = text[line_start:line_end]
    line = now
    for edit in edits:
        if "\n" in edit.old or "\n" in edit.new:
            break
        at = edit.start - line_start
        if at < 0 or at + len(edit.new) > len(line):
            break  # an edit on another line: the ones before it are not this line's
        line = line[:at] + edit.old + line[at + len(edit.new) :]
    return (line, now) if line != now else None
