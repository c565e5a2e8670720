"""Next-edit suggestions, the deterministic path: the edit the developer just made, made again where
it applies next.

`EditHistory` keeps, per open document, its recent edits (in memory only, cleared when the file
closes), each typing burst merged into one edit: typing a new name over an old one is one edit
from the old name to the new. `predict` reads the last edit:

- a **rename**: the edit turned one identifier into another (`total` -> `subtotal`), at one use or
  at several of one line (an accepted line-wide rename); a name turned into a keyword (`e` ->
  `None`) is a repeat;
- a **repeat**: any other edit within a line (an argument added to a call, an operator changed,
  `(object)` dropped from a class line).

The old text is looked for after the cursor, at every step of the order below, before it is looked
for from the top (developers go down a file: a weaker place below beats a stronger one above). A
renamed name, at its next use (as a whole name or a part of one between underscores: `blacklist` in
`add_blacklist`), in code before prose (comments and strings, but for doctest lines and calls
written out: developers rename the code first), every use on that line at once; a name local to a
Python function (its parameter, or assigned in it but for `global` and `nonlocal`) in that function
only, its whole uses (and the function's own locals named after it) before parts of other names; not
in the value a renamed assignment target is made from (`prefix = f(prefix)` -> `usage_prefix =
f(prefix)`); when one name holds the other, its whole uses first (`comp` -> `compose`), or only
(`encode` -> `encode_request`). A word whose case changed in prose (`click` -> `Click` in a
docstring), or a builtin's name changed there (`a list of` -> `a sequence of`), goes on in prose
only; a builtin renamed in code, at its whole uses. A call's keyword argument renamed (`data=` ->
`content=`) goes to the next call's keyword of that name first. A repeat, between the same
neighbours it had on its line, `CONTEXT` characters each side, then fewer, then on one side only,
then alone (an insertion always needs neighbours; one at the end of its line goes at the end of
another; an edit ending inside a word is the change of that word, then, with no place for that, the
change as made). A rename with no use left to rename (a local `item_value` -> `_`, an import's
module) is tried as a repeat. The first place found gets the same change; never where the new text
stands already (`_no_default` holds `no_default`), nor, in Python, where a repeat would make code that
parses not parse (a def's parameter `ctx: Context` put into a call), unless the change left its own
code not parsing (`try:` -> `with f():` before its `except` goes). Places the user waved off
(`predict`'s `dismissed`) are no place either: the one after them in the same order comes instead.

When no use of a renamed name is left in its file, the rename is carried to other files
(`carried_rename`, `next_use_elsewhere`; Python only): when the file now defines the new name where
other modules see it (a def, class or assignment at module level, or a class's method) or imports it
(`from shop.report import subtotal`, `report.subtotal`), the next file that imports the old name from
that module (its import first), or uses it as that module's attribute, or for a method uses it as an
attribute in a file that names its class. The server picks the files (`features.next_edit`: the open
ones, then those the index says use the name).

A prediction that would undo a recent edit (the user just changed the new name back) is never
offered. The model path (a rewrite of the region around the cursor from the recent edits) is
`context.next_edit_model`.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import keyword
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import unquote, urlparse

from .format_repeat import closing, conversion_of, convert, expression_at, line_before_edits, next_conversion

__all__ = ["CONTEXT", "CarriedRename", "Edit", "EditHistory", "ModelAnswer", "Prediction", "carried_rename",
           "context_names", "defines", "difference", "module_name", "next_repeat_elsewhere",
           "next_use_elsewhere", "predict", "repeat_elsewhere", "undone", "widened"]

CONTEXT = 12  # characters of the edited line each side of the edit that a repeat must match first
# The neighbours (left, right) a repeat tries in turn: both sides, then one, then none.
_NEIGHBOURS = ((CONTEXT, CONTEXT), (6, 6), (3, 3), (CONTEXT, 0), (6, 0), (3, 0), (0, CONTEXT), (0, 6), (0, 3),
               (0, 0))
_BUILTINS = frozenset(dir(builtins))
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_AFTER_WORD, _NOT_BEFORE_WORD = r"(?<![A-Za-z0-9_])", r"(?![A-Za-z0-9_])"


@dataclass(frozen=True)
class Edit:
    """`old` at offset `start` of the document became `new` (offsets before the edit)."""

    start: int
    old: str
    new: str
    at: float = 0.0  # when it was last extended (monotonic seconds)
    before: str = ""  # the document before the edit (kept for the newest edits only)


@dataclass(frozen=True)
class ModelAnswer:
    """What the model path was asked and answered (`context.next_edit_model`), kept with its
    suggestion so that a recorded episode can teach the model: the prompt as the model read it
    (ending where its answer began), the region [start, end) of the document it rewrote, and its
    rewrite as written."""

    prompt: str
    start: int
    end: int
    rewrite: str


@dataclass(frozen=True)
class Prediction:
    """Replace the text at [start, end) of the document as it is now with `text`."""

    start: int
    end: int
    text: str
    kind: str  # "rename" | "repeat" (this module) | "model" (`context.next_edit_model`)
    answer: ModelAnswer | None = None  # the model path's prompt and rewrite


class _Done(NamedTuple):
    """Where the last edit stands in the document now ([start, end)), and the places already offered
    for the next one and waved off (`dismissed`: spans of the document as it is now)."""

    start: int
    end: int
    dismissed: tuple[tuple[int, int], ...] = ()


@dataclass
class _Document:
    text: str
    edits: list[Edit] = field(default_factory=list)


class EditHistory:
    """Recent edits per open document, a typing burst merged into one (see the module docstring)."""

    def __init__(self, max_edits: int = 32, burst_s: float = 1.5, clock=time.monotonic):
        self.max_edits = max_edits
        self.burst_s = burst_s
        self.clock = clock
        self._docs: dict[str, _Document] = {}

    def open(self, uri: str, text: str) -> None:
        self._docs[uri] = _Document(text)

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def text(self, uri: str) -> str | None:
        doc = self._docs.get(uri)
        return doc.text if doc else None

    def edits(self, uri: str) -> list[Edit]:
        doc = self._docs.get(uri)
        return list(doc.edits) if doc else []

    def change(self, uri: str, start: int | None, end: int | None, new: str) -> None:
        """One content change: [start, end) of the document's current text replaced by `new`
        (start None: the whole text replaced, as a client without incremental sync sends it)."""
        doc = self._docs.get(uri)
        if doc is None:
            return
        text = doc.text
        if start is None or end is None:
            start, end, new = difference(text, new)
        start, end = max(0, min(start, len(text))), max(0, min(end, len(text)))
        # An editor may replace more than changes (an inline completion item's range runs from
        # the changed name to the cursor): the edit is what changed.
        kept, changed_end, new = difference(text[start:end], new)
        start, end = start + kept, start + changed_end
        edit = Edit(start, text[start:end], new, self.clock(), text)
        doc.text = text[:start] + new + text[end:]
        if edit.old == edit.new:
            return
        merged = _merge(doc.edits[-1], edit, self.burst_s, doc.text) if doc.edits else None
        if merged is not None:
            doc.edits[-1] = merged
        else:
            doc.edits.append(edit)
            if len(doc.edits) > 1:
                doc.edits[-2] = Edit(doc.edits[-2].start, doc.edits[-2].old, doc.edits[-2].new,
                                     doc.edits[-2].at)  # only the newest keeps its document
            del doc.edits[: -self.max_edits]


def difference(old: str, new: str) -> tuple[int, int, str]:
    """The one replacement that turns `old` into `new` (common prefix and suffix kept)."""
    prefix = 0
    limit = min(len(old), len(new))
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[len(old) - 1 - suffix] == new[len(new) - 1 - suffix]:
        suffix += 1
    return prefix, len(old) - suffix, new[prefix : len(new) - suffix]


def _merge(prev: Edit, edit: Edit, burst_s: float, after: str) -> Edit | None:
    """`prev` and `edit` as one edit when `edit` continues the same burst of typing (within
    `burst_s`, at most `_NEAR` characters from where `prev` stands, on one line); else None.
    The merged edit is the one difference between the document before `prev` and `after`: an
    editor that sends `items` -> `s` as "delete `item`" and then types `tock` after the `s` has
    renamed `items` to `stock`."""
    if edit.at - prev.at > burst_s or not prev.before or "\n" in prev.old + prev.new + edit.old + edit.new:
        return None
    prev_end = prev.start + len(prev.new)  # where prev's text ends, in the document after it
    if not prev.start - _NEAR <= edit.start <= prev_end + _NEAR:
        return None
    start, end, new = difference(prev.before, after)
    old = prev.before[start:end]
    if "\n" in old or "\n" in new:
        return None
    return Edit(start, old, new, edit.at, prev.before)


_NEAR = 2  # characters between two edits of one burst (an editor's diff may leave one standing)


def _rename(edit: Edit) -> tuple[str, str] | None:
    """(old name, new name) when `edit` turned one identifier into another, at one use or at
    several on its line (`seq) == len(set(seq` -> `items) == len(set(items`, an accepted rename)."""
    before = edit.before
    if not before:
        return None
    left, right = edit.start, edit.start + len(edit.old)
    while left > 0 and (before[left - 1].isalnum() or before[left - 1] == "_"):
        left -= 1
    while right < len(before) and (before[right].isalnum() or before[right] == "_"):
        right += 1
    old_parts = _NAMES.split(before[left:right])
    after = before[left : edit.start] + edit.new + before[edit.start + len(edit.old) : right]
    new_parts = _NAMES.split(after)
    if len(old_parts) != len(new_parts):
        return None
    renamed = set()
    for index, (was, now) in enumerate(zip(old_parts, new_parts, strict=True)):
        if was != now and index % 2 == 0:
            return None  # the text between names changed: not a rename
        if was != now:
            renamed.add((was, now))
    if len(renamed) != 1:
        return None
    old, new = renamed.pop()
    if keyword.iskeyword(old) or keyword.iskeyword(new):
        return None  # `e` -> `None` puts a value in a name's place: a repeat, not a rename
    return old, new


def _part_rename(edit: Edit) -> tuple[str, str] | None:
    """(old part, new part) when `edit` changed one part of a name between underscores
    (`test_distinct` -> `test_isdistinct`: `distinct` -> `isdistinct`); else None."""
    before = edit.before
    if not before or "_" in edit.old + edit.new or not (edit.old + edit.new).isalnum():
        return None
    left, right = edit.start, edit.start + len(edit.old)
    while left > 0 and before[left - 1].isalnum():
        left -= 1
    while right < len(before) and before[right].isalnum():
        right += 1
    old = before[left:right]
    new = before[left : edit.start] + edit.new + before[edit.start + len(edit.old) : right]
    in_longer = (left > 0 and before[left - 1] == "_") or (right < len(before) and before[right] == "_")
    if not in_longer or old == new or not (_IDENT.fullmatch(old) and _IDENT.fullmatch(new)):
        return None
    return old, new


_NAMES = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)")  # split: text between names at even indexes


def _within_text(edit: Edit) -> bool:
    """Whether a blank-only `edit` stands between two non-blank characters of its line (a space put
    into or taken out of `nocover`), not at its indentation or its end."""
    before, end = edit.before, edit.start + len(edit.old)
    return 0 < edit.start and end < len(before) and not before[edit.start - 1].isspace() \
        and not before[end].isspace()


def _telling(context: str) -> bool:
    """Whether one-sided neighbours are specific enough to place a change: a name in them."""
    return len(context.strip()) >= 3 and any(ch.isalnum() for ch in context)


def undone(edits: Sequence[Edit], old: str, new: str) -> bool:
    """Whether one of `edits` turned `new` into `old`: the prediction (`old` -> `new`) would undo
    what the user chose."""
    for edit in edits:
        if (_rename(edit) or (edit.old, edit.new)) == (new, old):
            return True
    return False


def predict(history: EditHistory, uri: str, cursor: int,
            dismissed: Iterable[tuple[int, int]] = ()) -> Prediction | None:
    """The next edit after the document's last one, at the offset `cursor` of its current text; not
    at a place of `dismissed` (spans of the current text offered before and waved off: the place
    after them in the same order comes instead)."""
    edits = history.edits(uri)
    text = history.text(uri)
    if not edits or text is None:
        return None
    last = edits[-1]
    if not last.before or "\n" in last.old or "\n" in last.new:
        return None
    done = _Done(last.start, last.start + len(last.new), tuple(dismissed))  # where the last edit stands now
    renamed = _rename(last)
    if renamed is not None and uri.endswith((".py", ".pyi")) and _prose_word(last, renamed[0]):
        # `see :meth:` -> `see :attr:`: a word of the text, repeated where it reads the same, as a
        # whole word and in prose only (a typo fixed, `blow` -> `below`, is no `by` -> `bey`)
        if undone(edits[:-1], *renamed):
            return None
        return _repeat_at(last.before, text, cursor, done, _NEIGHBOURS, *_word_edit(last.before, last.start,
                                                                                   last.old, last.new),
                          prose_only=True)
    if renamed is not None:
        old, new = renamed
        if undone(edits[:-1], old, new):
            return None
        python = uri.endswith((".py", ".pyi"))
        scope = _local_scope(last, old, new) if python else None
        # A word's case changed in a comment or a string (`click` -> `Click`) is an edit of the words:
        # it goes on in prose only (`click.echo` in code is another thing).
        # So is a builtin's name in prose (`a list of two-tuples` -> `a sequence of`): `list(x)` in
        # code is the builtin.
        words = (old.lower() == new.lower() or old in _BUILTINS) and \
            _in_prose(last.before, _prose_spans(last.before), last.start)
        left = last.start
        while left > 0 and _wordy(last.before[left - 1]):
            left -= 1
        if python and last.before.startswith(old, left) and _call_keyword(last.before, left, left + len(old)):
            # A call's keyword (`post(url, data=body)` -> `content=body`) names the callee's
            # parameter: the other calls' keywords of that name first, not the variables so named.
            # `content=content` -> `data=data` renamed the value with the keyword: both go on.
            both = re.match(_same_value(old), last.before[left:]) and re.match(_same_value(new), text[left:])
            found = _next_keyword(text, old, new, cursor, done, bool(both))
            if found is not None:
                return found
        # A bare name renamed (an import, a local, a module's function) is not the method of that
        # spelling of another object (`from ._streams import encode` is not `url.encode()`); a class's
        # member (a method, a class attribute) is used as one, and `self.stream = stream` goes too.
        bare = python and not words and last.before.startswith(old, left) and \
            last.before[max(0, left - 1):left] != "." and not _class_member(last.before, left) and \
            not _in_prose(last.before, _prose_spans(last.before), left)
        if python and not words:
            # `t.Dict` -> `t.MutableMapping` in a parameter's annotation: that parameter's
            # annotation elsewhere first (`self.default_map: t.Optional[t.Dict[...]]`)
            found = _next_annotation(last, text, cursor, done)
            if found is not None and found.start >= cursor:
                return found
        value = _own_value(last, text, old, done)
        found = _next_rename(text, old, new, cursor, done, scope, words, value, bare)
        part = _part_rename(last) if found is None else None
        if part is not None and part != renamed and not undone(edits[:-1], *part):
            # `test_distinct` -> `test_isdistinct` was `distinct` -> `isdistinct` in a longer name
            # (an accepted suggestion, or a rename typed over one part): that rename goes on.
            scope = _local_scope(last, *part) if python else None
            found = _next_rename(text, *part, cursor, done, scope, words)
        if found is None:
            # No use left: the same change where the same text stands between the full neighbours
            # (`for idx, (item_key, item_value) in` in the next function); not at a narrower level:
            # those would put it where the rules above refuse (a module, a longer name).
            found = _next_repeat(last, text, cursor, done, _NEIGHBOURS[:1], python)
        return found
    old, new = last.old, last.new
    if undone(edits[:-1], old, new) or (not (old + new).strip() and not _within_text(last)):
        return None  # indentation or trailing blanks: not a change to repeat
    python = uri.endswith((".py", ".pyi"))
    repeat = _next_repeat(last, text, cursor, done, python=python)
    found = None
    if python:
        found = _next_conversion(edits, text, cursor, done, repeat) or \
            _next_argument(last, text, cursor, done, repeat) or \
            _next_parameter(last, text, cursor, done) or \
            _next_subscript_in_body(last, text, cursor, done) or \
            _next_annotation(last, text, cursor, done) or \
            _next_assignment_annotation(last, text, cursor, done) or \
            _next_trailing_comment(last, text, cursor, done, repeat) or \
            _next_return_annotation(last, text, cursor, done)
    return found or repeat


_CALLEE = re.compile(r"(?<![A-Za-z0-9_])(?:(def|class)[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)[ \t]*$")


def _prose_word(edit: Edit, old: str) -> bool:
    """Whether `edit` changed the word `old` in a comment or a docstring (a triple-quoted string) of
    Python code where no code names it: words of the documentation (`see :meth:` -> `see :attr:`),
    repeated where they read the same, not a name renamed. Not in other strings: those are values
    (test input `"wau wau"` -> `"bar bar"`), which go on as a name does."""
    before = edit.before
    prose = _prose_spans(before)
    if not prose or not _in_prose(before, prose, edit.start):
        return False
    index = bisect.bisect_right(prose, (edit.start, len(before) + 1)) - 1
    if not before.startswith(("#", '"""', "'''"), prose[index][0]):
        return False
    pattern = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(old) + r"(?![A-Za-z0-9_])")
    return not any(not _in_prose(before, prose, match.start()) for match in pattern.finditer(before))


def _call_at(text: str, close: int) -> tuple[str, int] | None:
    """The callee's name and the `(` of the call whose `)` is at `close` of `text` (one line); None
    when the bracket closes no call (a def's parameters, a tuple, a line's first bracket)."""
    line_start = text.rfind("\n", 0, close) + 1
    for at in range(close - 1, line_start - 1, -1):
        if text[at] == "(" and closing(text, at) == close + 1:
            match = _CALLEE.search(text, line_start, at)
            if match is None or match.group(1) or keyword.iskeyword(match.group(2)):
                return None
            return match.group(2), at
    return None


def _call_over_lines(text: str, close: int) -> tuple[str, int] | None:
    """`_call_at` for a call whose arguments span lines (`echo(ctx.get_help(), {` ... `})`), within
    the 40 lines above `close`."""
    floor = close
    for _ in range(40):
        floor = text.rfind("\n", 0, floor)
        if floor < 0:
            break
    for at in range(close - 1, max(floor, 0) - 1, -1):
        if text[at] == "(" and closing(text, at, lines=True) == close + 1:
            line_start = text.rfind("\n", 0, at) + 1
            match = _CALLEE.search(text, line_start, at)
            if match is None or match.group(1) or keyword.iskeyword(match.group(2)):
                return None
            return match.group(2), at
    return None


def _next_argument(last: Edit, text: str, cursor: int, done: _Done,
                   repeat: Prediction | None) -> Prediction | None:
    """When the last edit added an argument at the end of a call (`zip(a, b)` -> `zip(a, b,
    strict=False)`), the same argument at the end of the next call of that name whose arguments
    differ (`zip(expected, lf)`), after the cursor first, then from the top; not one that has it
    already. None when the edit was no such addition, or when the repeat of the same text (`repeat`)
    below the cursor is one of those places (it matched more of the call: its place first)."""
    added = last.new
    if last.old or "\n" in added or not re.fullmatch(r",[ \t]*[^,\s].*", added) or \
            not last.before.startswith(")", last.start):
        return None
    call = _call_at(last.before, last.start) or _call_over_lines(last.before, last.start)
    if call is None:
        return None
    name = call[0]
    argument = added.lstrip(", \t")
    keyword_name = re.match(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*=(?!=)", argument)
    prose = _prose_spans(text)
    parsed: dict[tuple[int, int], bool] = {}
    places = []
    for match in re.finditer(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"[ \t]*\(", text):
        opening = match.end() - 1
        end = closing(text, opening)
        if end < 0 or _in_prose(text, prose, match.start()) or _call_at(text, end - 1) is None:
            continue
        close = end - 1
        inner = text[opening + 1 : close]
        if any(start <= close <= stop for start, stop in ((done.start, done.end), *done.dismissed)):
            continue
        has = re.search(r"(?<![A-Za-z0-9_])" + re.escape(keyword_name.group(1)) + r"[ \t]*=(?!=)", inner) \
            if keyword_name else inner.rstrip().endswith(argument)
        if has or inner.rstrip().endswith(","):
            continue
        places.append(Prediction(close, close, added if inner.strip() else argument, "repeat"))
    if repeat is not None and repeat.start >= cursor and any(p.start == repeat.start for p in places):
        return None

    def fits(place: Prediction) -> bool:  # judged only as far as the search goes
        return not _breaks(text, place, parsed)

    below = next((p for p in places if p.start >= cursor and fits(p)), None)
    if below is not None or repeat is not None:
        return below
    found = next((p for p in places if fits(p)), None)
    if found is None and _IDENT.fullmatch(argument) and not keyword_name:
        # No other call to pass it: the function's def takes it (`self._parse_decls(decls,
        # expose_value)`, then `def _parse_decls(self, decls, expose_value)`).
        found = _def_taking(text, name, argument, cursor, done)
    return found


def _def_taking(text: str, name: str, argument: str, cursor: int, done: _Done) -> Prediction | None:
    """`argument` added as the last parameter of a def of `name` in `text` that has parameters and
    not that one (the nearest below `cursor`, else the first), or None."""
    skip = ((done.start, done.end), *done.dismissed)
    places = []
    for head, opening, end in _def_closes(text):
        if not re.match(r"[ \t]*(?:async[ \t]+)?def[ \t]+" + re.escape(name) + r"[ \t]*\($",
                        text[head:opening + 1]):
            continue
        parameters = text[opening + 1:end]
        if parameters.strip() and not parameters.rstrip().endswith((",", "*")) and not re.search(
                r"(?<![A-Za-z0-9_])" + re.escape(argument) + r"(?![A-Za-z0-9_])", parameters) and \
                not any(start <= end <= stop for start, stop in skip):
            places.append(Prediction(end, end, ", " + argument, "repeat"))
    return next((p for p in places if p.start >= cursor), None) or next(iter(places), None)


_DEF_HEAD = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*\(", re.MULTILINE)
_NO_RETURN = re.compile(r"[ \t]*->[ \t]*None[ \t]*")


def _def_closes(text: str) -> list[tuple[int, int, int]]:
    """Each def header of `text` as (its start, the offsets of the brackets around its parameters)."""
    closes = []
    for match in _DEF_HEAD.finditer(text):
        end = closing(text, match.end() - 1, lines=True)
        if end > 0:
            closes.append((match.start(), match.end() - 1, end - 1))
    return closes


def _returns_value(text: str, head: int, close: int) -> bool:
    """Whether the function whose header starts at `head` (its parameters closing at `close`) returns
    a value or yields anywhere in its body (nested functions' bodies too: it cannot tell them apart)."""
    indent = len(text[head:close]) - len(text[head:close].lstrip(" \t"))
    line_end = text.find("\n", close)
    for line in text[line_end + 1:].split("\n") if line_end >= 0 else ():
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        if len(line) - len(line.lstrip(" \t")) <= indent:
            break
        if re.match(r"(?:return[ \t]+[^\s#]|yield\b|.*[=(][ \t]*yield\b)", body):
            return True
    return False


def _next_return_annotation(last: Edit, text: str, cursor: int, done: _Done) -> Prediction | None:
    """When the last edit gave a function that returns nothing its return annotation (`def
    test_basic_auth():` -> `def test_basic_auth() -> None:`, a typing pass), the same after the next
    def's parameters with none, below the cursor first, then from the top; not a function that
    returns a value or yields; the nearest, though the repeat of the same text (`repeat`) may have
    matched more of a name further down (`test_get_cookie():` after `test_set_cookie():`). None
    when the edit was no such annotation."""
    if last.old or not _NO_RETURN.fullmatch(last.new):
        return None
    before = last.before
    close = last.start - 1
    while close >= 0 and before[close] in " \t":
        close -= 1
    if close < 0 or before[close] != ")" or not re.match(r"[ \t]*:", before[last.start:]):
        return None
    if not any(end == close for _, _, end in _def_closes(before)):
        return None
    prose = _prose_spans(text)
    skip = ((done.start, done.end), *done.dismissed)
    places = []
    for head, _, end in _def_closes(text):
        if not re.match(r"[ \t]*:", text[end + 1:]) or _in_prose(text, prose, head) or \
                any(start <= end + 1 <= stop for start, stop in skip) or _returns_value(text, head, end):
            continue
        places.append(Prediction(end + 1, end + 1, last.new, "repeat"))
    return next((p for p in places if p.start >= cursor), None) or next(iter(places), None)


def _next_parameter(last: Edit, text: str, cursor: int, done: _Done) -> Prediction | None:
    """When the last edit added a parameter at the end of a def's (`def iter_bytes(self)` -> `def
    iter_bytes(self, chunk_size: int = None)`, or `def test_source():` -> `def test_source(runner):`),
    the same at the end of the nearest def below the
    cursor whose parameters were the same (`def iter_raw(self)`), then from the top; the nearest,
    though the repeat of the same text may have matched more of a name further down
    (`aiter_bytes(self)`). None when the edit was no such addition."""
    added = last.new
    if last.old or "\n" in added or not re.fullmatch(r"(?:,[ \t]*)?[A-Za-z_*][^,\n]*", added) or \
            not last.before.startswith(")", last.start):
        return None
    header = next(((opening, end) for _, opening, end in _def_closes(last.before) if end == last.start), None)
    if header is None:
        return None
    parameters = " ".join(last.before[header[0] + 1 : header[1]].split())
    if bool(parameters) != added.startswith(","):
        return None  # `(self` + `, n`, or `(` + `runner`: the first parameter of a def that had none
    prose = _prose_spans(text)
    skip = ((done.start, done.end), *done.dismissed)
    places = [Prediction(end, end, added, "repeat") for head, opening, end in _def_closes(text)
              if " ".join(text[opening + 1 : end].split()) == parameters and not _in_prose(text, prose, head)
              and not any(start <= end <= stop for start, stop in skip)]
    return next((p for p in places if p.start >= cursor), None) or next(iter(places), None)


def _annotations(text: str, opening: int, close: int) -> list[tuple[str, int, int, int]]:
    """The annotated parameters between a def's brackets at `opening` and `close` of `text`, as
    (name, start, end of the annotation, end of the blanks after it)."""
    found = []
    depth, start, i = 0, opening + 1, opening + 1
    while i <= close:
        char = text[i]
        if char in "\"'":
            quote = text[i]
            i = text.find(quote, i + 1)
            if i < 0 or i > close:
                break
        elif char in "([{":
            depth += 1
        elif char in ")]}" and i < close:
            depth -= 1
        elif (char == "," and depth == 0) or i == close:
            match = re.match(r"\s*\**([A-Za-z_][A-Za-z0-9_]*)[ \t]*:[ \t]*", text[start:i])
            if match:
                head = start + match.end()
                equals = re.search(r"(?<![=!<>])=(?!=)", text[head:i])
                end = blank = head + equals.start() if equals else i
                while end > head and text[end - 1] in " \t\n":
                    end -= 1
                found.append((match.group(1), head, end, blank))
            start = i + 1
        i += 1
    return found


def _next_subscript_in_body(last: Edit, text: str, cursor: int, done: _Done) -> Prediction | None:
    """When the last edit parametrized a type in a function (`input: t.IO` -> `input: t.IO[t.Any]` in
    its parameters, or in its body), the same type further on in that function where it stands bare
    in code (the other parameters, `t.cast(t.IO, input)`, an annotated local `func:
    t.Optional[t.Callable] = None`): a typing pass finishes the function it is in before the next
    def's parameters. None when there is no such place, or the edit was no such change."""
    before, new = last.before, last.new
    if last.old or not (new.startswith("[") and new.endswith("]")) or "\n" in new:
        return None
    named = re.search(r"(?<![A-Za-z0-9_.])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$",
                      before[:last.start])
    block = _block(text, last.start) if named is not None else None
    if block is None or not _DEF.match(text, block[0]):
        return None
    prose = None
    bare = re.compile(r"(?<![A-Za-z0-9_.])" + re.escape(named.group()) + r"(?![A-Za-z0-9_\[(])")
    for match in bare.finditer(text, cursor, block[1]):
        if _skipped(text, (match.end(), match.end()), done, "", new) or _type_check(text, match.start()):
            continue
        prose = _prose_spans(text) if prose is None else prose
        if not _in_prose(text, prose, match.start()):
            return Prediction(match.end(), match.end(), new, "repeat")
    return None


_RUNTIME_CHECK = re.compile(r"(?<![A-Za-z0-9_.])is(?:instance|subclass)[ \t]*$")


def _type_check(text: str, offset: int) -> bool:
    """Whether `offset` of `text` is inside the arguments of an `isinstance(` or `issubclass(` call
    begun on its line: a check at run time, which takes no parametrized generic (`t.IO[t.Any]`)."""
    depth, line = 0, text.rfind("\n", 0, offset) + 1
    for i in range(offset - 1, line - 1, -1):
        if text[i] in ")]}":
            depth += 1
        elif text[i] in "([{":
            if depth:
                depth -= 1
            elif text[i] == "(" and _RUNTIME_CHECK.search(text, line, i):
                return True
    return False


def _next_annotation(last: Edit, text: str, cursor: int, done: _Done) -> Prediction | None:
    """When the last edit changed a def parameter's annotation (`show_default: bool = False` ->
    `show_default: bool | str = False`), the same change to the nearest parameter below of that name
    and that annotation in another def (`show_default: bool = True`), then from the top: the repeat
    of the same text matches the annotation's neighbours (`hide_input: bool = False`). None when the
    edit was no such change."""
    before = last.before
    if "," in last.new or "\n" in last.new:
        return None  # a parameter added, or a line broken: not the annotation's change
    edited = None
    for _, opening, end in _def_closes(before):
        if opening < last.start <= end:
            edited = next(((name, start, blank) for name, start, _, blank
                           in _annotations(before, opening, end)
                           if start <= last.start and last.start + len(last.old) <= blank), None)
            break
    if edited is None:
        return None
    name, start, blank = edited
    old = before[start:blank].rstrip()
    new = (before[start:last.start] + last.new + before[last.start + len(last.old):blank]).rstrip()
    if old == new or not old or not new or "\n" in old:
        return None
    skip = ((done.start, done.end), *done.dismissed)
    spans = [(a, b) for _, opening, end in _def_closes(text)
             for other, a, b, _ in _annotations(text, opening, end) if other == name]
    # and the attribute or variable of that name annotated alike (`self.default_map: ... = default_map`)
    assigned = re.compile(r"^[ \t]*(?:self\.)?" + re.escape(name) + r"[ \t]*:[ \t]*(" + re.escape(old)
                          + r")[ \t]*=", re.MULTILINE)
    spans += [match.span(1) for match in assigned.finditer(text)]
    places = [Prediction(a, b, new, "repeat") for a, b in sorted(spans)
              if text[a:b] == old and not any(x <= a <= y for x, y in skip)]
    return next((p for p in places if p.start >= cursor), None) or next(iter(places), None)


_ASSIGNED = re.compile(r"([ \t]*)([A-Za-z_][A-Za-z0-9_]*)([ \t]*)=(?!=)[ \t]*(.*?)[ \t]*$")


def _next_assignment_annotation(last: Edit, text: str, cursor: int, done: _Done) -> Prediction | None:
    """When the last edit annotated a plain assignment (`name = None` -> `name: t.ClassVar[str] =
    None`, a class's attribute), the same annotation on the next assignment below at that
    indentation, of the same value and with none, in the same block (not `self.prog_name =
    prog_name` in a method). None when the edit was no such annotation."""
    added, before = last.new, last.before
    if last.old or not re.fullmatch(r":[ \t]*[^\s=][^=\n]*?", added.rstrip()):
        return None
    line_start = before.rfind("\n", 0, last.start) + 1
    line_end = before.find("\n", last.start)
    line = before[line_start:len(before) if line_end < 0 else line_end]
    match = _ASSIGNED.fullmatch(line)
    if match is None or line_start + match.end(2) != last.start:
        return None
    indent, value = match.group(1), match.group(4)
    skip = ((done.start, done.end), *done.dismissed)
    for start, other in _lines_below(text, cursor):
        if other.strip() and not other.startswith(indent):
            return None  # the block ended
        found = _ASSIGNED.fullmatch(other)
        if found and found.group(1) == indent and found.group(4) == value and \
                not any(a <= start + found.end(2) <= b for a, b in skip):
            place = start + found.end(2)
            return Prediction(place, place, added, "repeat")
    return None


def _lines_below(text: str, cursor: int) -> Iterable[tuple[int, str]]:
    """Each line of `text` after the one holding `cursor`, as (its offset, its text without the
    line break)."""
    at = text.find("\n", cursor)
    while at >= 0:
        start = at + 1
        end = text.find("\n", start)
        yield start, text[start:len(text) if end < 0 else end].rstrip("\r")
        at = end


_LEAD = re.compile(r"[ \t]*(?:async[ \t]+)?([A-Za-z_]+)")


def _next_trailing_comment(last: Edit, text: str, cursor: int, done: _Done,
                           repeat: Prediction | None) -> Prediction | None:
    """When the last edit put a comment at the end of a block's header (`async def restart(self) ->
    None:` + `  # pragma: nocover`, or an `except ...:`), the same comment at the end of the nearest
    header below the cursor that opens with that keyword and has no comment; None when the repeat of
    the same text (`repeat`) found a place below the cursor (a line that reads the same), or the
    edit was no such comment."""
    added = last.new
    before = last.before
    if last.old or not re.fullmatch(r"[ \t]+#[^\n]*", added) or \
            (repeat is not None and repeat.start >= cursor):
        return None
    if not (last.start == len(before) or before.startswith(("\n", "\r\n"), last.start)):
        return None
    line_start = before.rfind("\n", 0, last.start) + 1
    line = before[line_start:last.start]
    lead = _LEAD.match(line)
    if lead is None or not keyword.iskeyword(lead.group(1)) or "#" in line or not line.rstrip().endswith(":"):
        return None  # a block's header only: `# type: ignore` after an import is that line's own
    prose = _prose_spans(text)
    skip = ((done.start, done.end), *done.dismissed)
    for start, other in _lines_below(text, cursor):
        match = _LEAD.match(other)
        if match and match.group(1) == lead.group(1) and "#" not in other and \
                other.rstrip().endswith(":") and not _in_prose(text, prose, start + match.start(1)) and \
                not any(a <= start + len(other) <= b for a, b in skip):
            place = start + len(other.rstrip())
            return Prediction(place, start + len(other), added, "repeat")
    return None


def _next_conversion(edits: Sequence[Edit], text: str, cursor: int, done: _Done,
                     repeat: Prediction | None) -> Prediction | None:
    """When the edits made on the last one's line converted a %-format expression (`"%s" % x` ->
    `"{}".format(x)` or `f"{x}"`), the next one in code converted the same way
    (`context.format_repeat`): the one the repeat of the same text (`repeat`) falls in when it is
    below the cursor (the same neighbours: `"sdist called %s" % format` -> `"bdist called %s" %
    format`), else the same expression first, then any. None when the edits were no conversion."""
    lines = line_before_edits(text, reversed(edits), done.start)
    made = conversion_of(*lines) if lines is not None else None
    if made is None:
        return None
    prose = _prose_spans(text)

    def code(offset: int) -> bool:
        return not _in_prose(text, prose, offset)

    skip = ((done.start, done.end), *done.dismissed)
    if repeat is not None and repeat.start >= cursor:
        expression = expression_at(text, repeat.start)
        in_code = expression is not None and code(expression.start)
        converted = convert(expression, made[1]) if in_code else None
        if converted is not None and not any(expression.start < end and start < expression.end
                                             for start, end in skip):
            return Prediction(expression.start, expression.end, converted, "repeat")
    found = next_conversion(text, cursor, *made, skip, code)
    return None if found is None else Prediction(*found, "repeat")


def _call_keyword(text: str, start: int, end: int) -> bool:
    """Whether the name at [start, end) of `text` is a keyword argument of a call (`f(x, data=1)`),
    not a parameter of a def or an assignment."""
    if not re.match(r"[ \t]*=(?!=)", text[end:end + 8]):
        return False
    before = text[max(0, start - 2000):start].rstrip()
    if not before.endswith(("(", ",")):
        return False
    depth = 0
    for i in range(len(before) - 1, -1, -1):
        char = before[i]
        if char in ")]}":
            depth += 1
        elif char in "([{":
            if depth == 0:
                head = before[:i]
                return char == "(" and re.search(r"\bdef\s+\w+\s*$", head) is None and \
                    re.search(r"[\w)\]]\s*$", head) is not None
            depth -= 1
    return False


def _same_value(name: str) -> str:
    """A keyword argument whose value is the variable of its name (`content=content`)."""
    return re.escape(name) + r"([ \t]*=[ \t]*)" + re.escape(name) + r"(?![A-Za-z0-9_])"


def _next_keyword(text: str, old: str, new: str, cursor: int, done: _Done,
                  value: bool = False) -> Prediction | None:
    """The next keyword argument `old=` of a call, renamed; with `value`, its value too where that
    is the variable of its name (`content=content` -> `data=data`)."""
    pattern = re.compile(r"(?<![A-Za-z0-9_.])(" + re.escape(old) + r")(?=[ \t]*=(?!=))")
    found = _next_group(text, pattern, cursor, done, old, new, lambda span: _call_keyword(text, *span))
    if found is None:
        return None
    both = re.match(_same_value(old), text[found[0]:]) if value else None
    if both:
        return Prediction(found[0], found[0] + both.end(), new + both.group(1) + new, "rename")
    return Prediction(found[0], found[1], new, "rename")


def _own_value(edit: Edit, text: str, old: str, done: _Done) -> tuple[int, int] | None:
    """Where the edit renamed the target of an assignment (`prefix = f(prefix)` -> `usage_prefix =
    f(prefix)`), the span in `text` of the value it is assigned: the old name there is the value the
    new variable is made from, not a use to rename."""
    line_start = edit.before.rfind("\n", 0, edit.start) + 1
    if not re.fullmatch(r"[ \t]*[A-Za-z0-9_.]*", edit.before[line_start:edit.start]):
        return None
    line_end = text.find("\n", done[1])
    line_end = len(text) if line_end < 0 else line_end
    target = re.match(r"[A-Za-z0-9_]*[ \t]*(?::[^=\n]*)?=(?!=)", text[done[1]:line_end])
    return (done[1] + target.end(), line_end) if target else None


def _next_rename(text: str, old: str, new: str, cursor: int, done: _Done,
                 scope: tuple[int, int] | None = None, words: bool = False,
                 value: tuple[int, int] | None = None, bare: bool = False) -> Prediction | None:
    """The renamed name's next use (as a whole name or a part of one between underscores:
    `blacklist` in `add_blacklist`) in code first, then in prose (comments, and strings other than
    doctest lines and calls: a developer renames the code before the words about it). Every use of
    the name on that line is renamed at once (`self.start = start`). A name local to a function
    (`scope`, its span in `text`) is renamed within that function only: another function's name
    of the same spelling is another variable. When one name holds the other, whole uses first, and
    only they when the names differ by parts between underscores. With `words`, in prose only. Not
    in `value`, the span of the value a renamed assignment target is made from; with `bare`, not
    another object's method (`x.old(`, but `self.old(`). A use below the cursor at any of these steps
    before one above it (the first step's first from the top)."""
    part = re.compile(r"(?<![A-Za-z0-9])(" + re.escape(old) + r")(?![A-Za-z0-9])")
    prose = _prose_spans(text)
    modules = _module_spans(text)  # `from report import` names a module, not the renamed name

    def inside(span: tuple[int, int]) -> bool:
        if value is not None and value[0] <= span[0] < value[1]:
            return False
        if bare and text.startswith("(", span[1]):
            start = span[0]
            while start > 0 and _wordy(text[start - 1]):
                start -= 1
            owner = re.search(r"([A-Za-z_][A-Za-z0-9_]*)?[ \t]*\.[ \t]*$", text[max(0, start - 40):start])
            if owner and owner.group(1) not in ("self", "cls"):
                return False  # `url.encode()`: another object's method
        return (scope is None or scope[0] <= span[0] and span[1] <= scope[1]) and not any(
            start <= span[0] < end for start, end in modules)

    def in_code(span: tuple[int, int]) -> bool:
        # A call written out in prose (`such as fn([v1, v2])`) is an example of the code.
        return inside(span) and (text.startswith("(", span[1]) or not _in_prose(text, prose, span[0]))

    def in_words(span: tuple[int, int]) -> bool:
        return inside(span) and not in_code(span)

    if words:
        order = ((part, in_words),)
    elif old in _BUILTINS:
        # A builtin (`dict` -> `RequestExtensions`): its whole uses; `as_dict` is another name.
        whole = re.compile(r"(?<![A-Za-z0-9_])(" + re.escape(old) + r")(?![A-Za-z0-9_])")
        order = ((whole, in_code), (whole, inside))
    elif old in new or new in old:
        # `comp` -> `compose`: whole uses first, then parts of longer names (`test_comp`). But when
        # the names differ by whole parts between underscores (`encode` -> `encode_request`,
        # `relative_url` -> `url`), a longer name holding the name is another name built the same
        # way (`encode_response`, `is_relative_url`): whole uses only.
        whole = re.compile(r"(?<![A-Za-z0-9_])(" + re.escape(old) + r")(?![A-Za-z0-9_])")
        old_parts, new_parts = set(old.strip("_").split("_")), set(new.strip("_").split("_"))
        by_parts = old_parts < new_parts or new_parts < old_parts
        order = ((whole, in_code), (whole, inside)) + (() if by_parts else ((part, in_code), (part, inside)))
    elif scope is not None:
        # A function's local (`text` -> `generator` of `def pager(text)`) is a variable: its uses
        # are whole names, or parts of other locals of that function named after it (`def
        # add_blacklist` beside `blacklist`); a part of another name (`_default_text_stdout()`,
        # `self._body_iter`) is another thing, renamed after them.
        body = text[scope[0]:scope[1]]

        def local(span: tuple[int, int]) -> bool:
            left, right = span
            while left > 0 and _wordy(text[left - 1]):
                left -= 1
            while right < len(text) and _wordy(text[right]):
                right += 1
            name = text[left:right]
            nested = r"^\s*(?:async\s+)?(?:def|class)\s+" + name + r"\b"
            return name == old or not text[:left].rstrip().endswith(".") and (
                _bound(body, name) or re.search(nested, body, re.M) is not None)

        order = ((part, lambda span: in_code(span) and local(span)),
                 (part, lambda span: inside(span) and local(span)), (part, in_code), (part, inside))
    else:
        order = ((part, in_code), (part, inside))
    above = None
    for pattern, where in order:
        found = _next_group(text, pattern, cursor, done, old, new, where)
        if found is not None and found[0] >= cursor:
            return _whole_line_rename(text, pattern, found, done, old, new, where)
        above = above or (found and (pattern, found, where))
    return None if above is None else _whole_line_rename(text, above[0], above[1], done, old, new, above[2])


_DEF = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)")


def _class_member(text: str, offset: int) -> bool:
    """Whether the name at `offset` of `text` is a class's member: on an indented def or class line
    (a method), or on a line whose nearest less indented line above is a class line."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    indent = _indent(line)
    if not indent:
        return False
    if _BLOCK_HEAD.match(line):
        return True
    end = line_start - 1
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        above = text[start:end]
        if above.strip() and _indent(above) < indent:
            return above.lstrip().startswith("class ")
        end = start - 1
    return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _local_scope(edit: Edit, old: str, new: str) -> tuple[int, int] | None:
    """The span, in the document as it is after `edit`, of the Python function in which the renamed
    name is local (a parameter of it, or assigned in it without `global` or `nonlocal`: the old or
    the new name, since an accepted rename may have renamed the parameter already); None when the
    edit is in no function or the name is not local to the innermost one (an attribute, a global, a
    function's own name)."""
    before = edit.before
    left = edit.start
    while left > 0 and _wordy(before[left - 1]):
        left -= 1
    if before[:left].rstrip(" \t").endswith("."):
        return None  # an attribute (`self.func`), not the parameter of the same name
    lines = before.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    row = bisect.bisect_right(starts, edit.start) - 1
    floor = None  # the least indentation of the lines between the edit and the def above it
    for top in range(row, -1, -1):
        line = lines[top]
        if not line.strip():
            continue
        match = _DEF.match(line)
        if match and (floor is None or _indent(line) < floor or top == row):
            break
        if not line.lstrip().startswith(")"):
            floor = _indent(line) if floor is None else min(floor, _indent(line))
    else:
        return None
    if top == row and match.start(1) <= edit.start - starts[row] <= match.end(1):
        return None  # the function's own name
    depth = _indent(lines[top])
    end_row, opened = top + 1, False
    for end_row in range(top + 1, len(lines) + 1):
        if end_row == len(lines):
            break
        line = lines[end_row]
        if opened and line.strip() and _indent(line) <= depth and not line.lstrip().startswith(")"):
            break
        opened = opened or bool(line.strip())
    body = "\n".join(lines[top:end_row])
    if not any(_bound(body, name) for name in (old, new)):
        return None
    delta = len(edit.new) - len(edit.old)
    end = starts[end_row] - 1 if end_row < len(lines) else len(before)
    return starts[top], end + (delta if end >= edit.start else 0)


def _bound(body: str, name: str) -> bool:
    """Whether `name` is a local of the function whose source is `body` (its def line first)."""
    word = r"(?<![A-Za-z0-9_.])" + re.escape(name) + r"(?![A-Za-z0-9_])"
    if re.search(r"^\s*(?:global|nonlocal)\b[^\n]*" + word, body, re.M):
        return False
    if name in _parameters(body):
        return True
    return bool(re.search(r"^\s*" + word + r"\s*(?::[^=\n]*)?=(?!=)|\bfor\s+[^\n]*?" + word + r"[^\n]*?\bin\b"
                          r"|\bas\s+" + word, body, re.M))


def _parameters(source: str) -> list[str]:
    """The parameter names of the def that `source` starts with: the first name of each of its
    signature's top-level comma-separated parts (`timeout: OptionalTimeout = None` is `timeout`)."""
    opened = source.find("(")
    if opened < 0:
        return []
    names, depth, part = [], 0, ""
    for char in source[opened + 1:]:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            names.append(part)
            part = ""
        else:
            part += char
    names.append(part)
    firsts = (re.match(r"\s*\**([A-Za-z_][A-Za-z0-9_]*)", piece) for piece in names)
    return [match.group(1) for match in firsts if match]


def _whole_line_rename(text: str, pattern: re.Pattern, found: tuple[int, int], done: _Done,
                       old: str, new: str, where=None) -> Prediction:
    """The rename at `found` and at every later use of the name on its line (for which `where`
    holds, given one), as one replacement."""
    line_end = text.find("\n", found[1])
    line_end = len(text) if line_end < 0 else line_end
    end, pieces = found[1], [new]
    for match in pattern.finditer(text, found[1], line_end):
        span = match.span(1)
        if _skipped(text, span, done, old, new) or (where is not None and not where(span)):
            continue
        pieces += [text[end : span[0]], new]
        end = span[1]
    return Prediction(found[0], end, "".join(pieces), "rename")


def _wordy(char: str) -> bool:
    return char.isalnum() or char == "_"


def _word_edit(before: str, start: int, old: str, new: str) -> tuple[int, str, str]:
    """The edit `old` -> `new` at `start` of `before`, widened to whole words where an end of it falls
    inside one: an editor's diff cuts a change where the texts stop agreeing (`not show_pos` ->
    `not self.show_pos` is `elf.s` put after `not s`), but the change is of the word (`show_pos` ->
    `self.show_pos`), and only that word is a place for it again."""
    end = start + len(old)
    if start > 0 and _wordy(before[start - 1]) and (
            _wordy((old or new)[:1] or " ") or (end < len(before) and _wordy(before[end]))):
        left = start
        while left > 0 and _wordy(before[left - 1]):
            left -= 1
        old, new, start = before[left:start] + old, before[left:start] + new, left
    end = start + len(old)
    if end < len(before) and _wordy(before[end]) and (_wordy(old[-1:] or " ") or _wordy(new[-1:] or " ")):
        right = end
        while right < len(before) and _wordy(before[right]):
            right += 1
        old, new = old + before[end:right], new + before[end:right]
    return start, old, new


def _next_repeat(last: Edit, text: str, cursor: int, done: _Done,
                 levels: Sequence[tuple[int, int]] = _NEIGHBOURS, python: bool = False) -> Prediction | None:
    """The same change where the same text stands between the same neighbours, the widest that
    match first (of `levels`: characters left and right), below the cursor before above it: the
    first place below at any level, else the widest level's first place from the top (developers
    go down the file; `_NEIGHBOURS`' narrower levels there beat a wider one's place above). The
    change of the whole words it falls in first (`_word_edit`), then, with no place for that, the
    change as made (`platforms: Any` -> `platform_rules: T`, made as `s: Any` -> `_rules: T` after
    `platform`, goes on to `browsers: Any`). In `python` code, never where the change would break
    the code around it (`_breaks`), unless it broke the code where it was made (`try:` -> `with
    f():`, the `except` below it to go next: the developer is in the middle of a change); a word
    split or joined in a string or a comment, in strings and comments only."""
    before, end = last.before, last.start + len(last.old)
    # A word split or joined in a string or a comment (`special_chars` -> `special-chars`) goes on in
    # strings and comments: in code that is an expression (`__init_-(self)`), not a name.
    words = python and 0 < last.start and end < len(before) and _wordy(before[last.start - 1]) and \
        _wordy(before[end]) and not all(_wordy(char) for char in last.old + last.new) and \
        _in_prose(before, _prose_spans(before), last.start)
    if python and _judged_parse(before, last.start) and not _judged_parse(text, done.start):
        python = False
    as_made = (last.start, last.old, last.new)
    whole = _word_edit(last.before, *as_made)
    found = _repeat_at(last.before, text, cursor, done, levels, *whole, python=python, prose_only=words)
    if found is None and whole != as_made:
        found = _repeat_at(last.before, text, cursor, done, levels, *as_made, python=python, prose_only=words)
    return found


def _repeat_at(before: str, text: str, cursor: int, done: _Done, levels: Sequence[tuple[int, int]],
               start: int, old: str, new: str, python: bool = False,
               prose_only: bool = False) -> Prediction | None:
    """`_next_repeat` for the change `old` -> `new` at `start` of `before`; `prose_only`: in strings
    and comments only."""
    fits = None
    if python or prose_only:
        parsed: dict[tuple[int, int], bool] = {}  # each block's parse, as it is, once
        prose: list[tuple[int, int]] = []

        def fits(span: tuple[int, int]) -> bool:
            if not prose:
                prose.extend(_prose_spans(text) or [(-1, -1)])
            if _in_prose(text, prose, span[0]):
                return True  # in a string or a comment: words, not code to break
            if prose_only:
                return False
            return not (python and _breaks(text, _placed(before, start, old, new, text, span), parsed))

    line_start = before.rfind("\n", 0, start) + 1
    line_end = before.find("\n", start + len(old))
    line_end = len(before) if line_end < 0 else line_end
    word = bool(_IDENT.fullmatch(old))
    above = None
    for left_size, right_size in levels:
        if not old and not left_size and not right_size:
            break  # an insertion needs neighbours to say where it goes
        outer_left = max(line_start, start - left_size) if left_size else start
        outer_right = min(line_end, start + len(old) + right_size) if right_size else start + len(old)
        left, right = before[outer_left:start], before[start + len(old) : outer_right]
        if bool(left_size) != bool(right_size) and not _telling(left or right):
            continue  # one side only, and it says too little (a lone `)`) to put the change anywhere
        head = re.escape(left) if left_size else (r"(?<![A-Za-z0-9])" if word else "")
        tail = re.escape(right) if right_size else (r"(?![A-Za-z0-9])" if word else "")
        # Where the neighbours end at a word's end, so they must where they match: `default` is
        # not the start of `defaults`.
        if _wordy((left + old + right or " ")[0]) and not (outer_left and _wordy(before[outer_left - 1])):
            head = _NOT_AFTER_WORD + head
        if _wordy((left + old + right or " ")[-1]) and not (
                outer_right < len(before) and _wordy(before[outer_right])):
            tail = tail + _NOT_BEFORE_WORD
        if (right_size or not old) and start + len(old) == line_end:
            # The edit was at the end of its line: so at the end of another (an insertion always:
            # text added after a line's code does not go inside another's).
            tail = r"(?=\r?\n|\Z)"
        where = fits
        if not left_size and not right_size and old.strip() == "," and \
                re.match(r"[ \t]*[)\]}]", before[start + len(old):]):
            tail = r"(?=[ \t]*[)\]}])"  # a trailing comma removed: another trailing comma, not any

            strings = _prose_spans(text)

            def where(span: tuple[int, int], fits=fits, strings=strings) -> bool:  # code; no `("a",)`
                return (fits is None or fits(span)) and not _in_prose(text, strings, span[0]) and \
                    not _one_tuple(text, span[0])
        if not old and new[:1] == "[" and new[-1:] == "]":
            tail += r"(?![ \t]*\[)"  # a subscript (`t.IO` + `[t.Any]`): not where one stands already
        pattern = re.compile(head + "(" + re.escape(old) + ")" + tail)
        found = _next_group(text, pattern, cursor, done, old, new, where)
        if found is not None and found[0] >= cursor:
            return _placed(before, start, old, new, text, found)
        above = above or found
    return None if above is None else _placed(before, start, old, new, text, above)


def _one_tuple(text: str, comma: int) -> bool:
    """Whether the comma at `comma` of `text` makes a tuple of one (`("--cache",)`): its bracket is a
    `(` that follows no name or call and holds no other comma at its level."""
    depth = 0
    for at in range(comma - 1, max(-1, comma - 2000), -1):
        char = text[at]
        if char in ")]}":
            depth += 1
        elif char in "([{":
            if depth == 0:
                if char != "(":
                    return False
                head = text[:at].rstrip()
                return not (head and (_wordy(head[-1]) or head[-1] in ")]"))
            depth -= 1
        elif char == "," and depth == 0:
            return False
    return False


def _placed(before: str, start: int, old: str, new: str, text: str, span: tuple[int, int]) -> Prediction:
    """The repeat of `old` -> `new` (made at `start` of `before`) at `span` of `text`; where the
    marks the change put after the old text stand there already (`"arg"` -> `"ARG".` where `"arg".`
    stands), the change takes them in rather than doubling them."""
    end = span[1]
    for size in range(len(new), 0, -1):
        added = new[-size:]
        if not any(_wordy(char) for char in added) and not old.endswith(added) and \
                text.startswith(added, end) and not before.startswith(added, start + len(old)):
            end += size
            break
    return Prediction(span[0], end, new, "repeat")


_BLOCK_HEAD = re.compile(r"[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]")


def _block(text: str, offset: int) -> tuple[int, int, int] | None:
    """The Python block the line at `offset` of `text` stands in, as (start, end, indent): from the
    nearest `def` or `class` line above it indented less whose block holds it (or from the line
    itself when it is one, or is at the top level) to the last line after it indented more (or a
    closing bracket's line at its indent: `) -> None:`; after a decorator, the line it decorates).
    None when the line is not in such a block."""
    lines = text.split("\n")
    row = text.count("\n", 0, offset)
    limit = _indent(lines[row])
    head = row
    if limit and not _BLOCK_HEAD.match(lines[row]):
        head = -1
    while True:
        if head < 0:  # the nearest head above, indented less than `limit`
            head = next((r for r in range(row - 1, -1, -1) if lines[r].strip() and _indent(lines[r]) < limit
                         and _BLOCK_HEAD.match(lines[r])), -1)
            if head < 0:
                return None
        last = _block_end(lines, head)
        if last >= row:
            break
        if head == row or not _indent(lines[head]):
            return None  # the line continues a statement the block does not hold
        limit, head = _indent(lines[head]), -1  # a nested def above it: the one around both
    start = sum(len(line) + 1 for line in lines[:head])
    end = start + sum(len(line) + 1 for line in lines[head:last + 1]) - 1
    return start, end, _indent(lines[head])


def _block_end(lines: list[str], head: int) -> int:
    """The last line of the block whose first line is `head` (see `_block`)."""
    indent = _indent(lines[head])
    last = opener = head  # `opener`: the block's last line at its indent (a decorator goes on)
    for r in range(head + 1, len(lines)):
        line = lines[r]
        if line.strip() and _indent(line) <= indent:
            closing = line.lstrip()[:1] in ")]}"
            if _indent(line) < indent or not (closing or lines[opener].lstrip().startswith("@")):
                break
            opener = opener if closing else r
        last = r
    return last


def _parses(block: str, indent: int) -> bool:
    """Whether `block`, each line indented at least `indent`, parses as Python once dedented."""
    lines = block.split("\n")
    if any(line.strip() and not line[:indent].isspace() and indent for line in lines):
        return False  # a line less indented (a string's text at column 0): not a block to judge
    try:
        ast.parse("\n".join(line[indent:] for line in lines))
    except (SyntaxError, ValueError):
        return False
    return True


def _judged_parse(text: str, offset: int) -> bool:
    """Whether the block (`_block`) of the line at `offset` of `text` parses (False when it is in no
    block to judge)."""
    block = _block(text, offset)
    return block is not None and _parses(text[block[0]:block[1]], block[2])


def _breaks(text: str, found: Prediction, parsed: dict[tuple[int, int], bool]) -> bool:
    """Whether `found` would break the Python code around it: its block (`_block`) parses now and
    would not after it (`f(x)` -> `f(ctx: Context, x)`, a def's parameter put into a call). `parsed`
    caches the blocks' parses as they are."""
    block = _block(text, found.start)
    if block is None or found.end > block[1]:
        return False
    start, end, indent = block
    if (start, end) not in parsed:
        parsed[(start, end)] = _parses(text[start:end], indent)
    if not parsed[(start, end)]:
        return False  # broken already (or not judged): the change is not what breaks it
    return not _parses(text[start:found.start] + found.text + text[found.end:end], indent)


def _skipped(text: str, span: tuple[int, int], done: _Done, old: str, new: str) -> bool:
    """Whether the match at `span` is no place for the change: it overlaps the edit just made (or
    stands at its very place) or a place offered and waved off, or `new` stands there already (an
    insertion made there before, or a new name that holds the old one: `no_default` in
    `_no_default`)."""
    for start, end in ((done.start, done.end), *done.dismissed):
        if (span[0] < end and span[1] > start) or span[0] == start or span[1] == end:
            return True
    if not old:
        return text.startswith(new, span[0])
    at = new.find(old)
    while at >= 0:
        if span[0] >= at and text.startswith(new, span[0] - at):
            return True
        at = new.find(old, at + 1)
    return False


def _next_group(text: str, pattern: re.Pattern, cursor: int, done: _Done, old: str, new: str,
                where=None) -> tuple[int, int] | None:
    """The span of group 1 of the first match at or after `cursor` (else the first from the top)
    that is not `_skipped` (and, given `where`, for which `where(span)` holds)."""
    first = None
    for match in pattern.finditer(text):
        span = match.span(1)
        if _skipped(text, span, done, old, new) or (where is not None and not where(span)):
            continue
        if span[0] >= cursor:
            return span
        first = first or span
    return first


# Comments and string literals (triple-quoted first, so that one is not read as three strings).
_PROSE = re.compile("|".join((r'"""[\s\S]*?(?:"""|\Z)', r"'''[\s\S]*?(?:'''|\Z)", r"#[^\n]*",
                               r'"(?:\\.|[^"\\\n])*"', r"'(?:\\.|[^'\\\n])*'")))
_DOCTEST = (">>>", "...")


def _prose_spans(text: str) -> list[tuple[int, int]]:
    """The spans of `text`'s comments and string literals, in order (Python's syntax; elsewhere a
    rough guess, which only orders the uses of a name)."""
    return [match.span() for match in _PROSE.finditer(text)]


def _in_prose(text: str, spans: list[tuple[int, int]], offset: int) -> bool:
    """Whether `offset` lies in a comment or a string, other than on a doctest line of a string."""
    index = bisect.bisect_right(spans, (offset, len(text) + 1)) - 1
    if index < 0 or not spans[index][0] < offset < spans[index][1]:
        return False
    if text.startswith("#", spans[index][0]):
        return True  # a comment (`...  # pragma: no cover` is no doctest line)
    line = text[text.rfind("\n", 0, offset) + 1 : offset].lstrip()
    return not line.startswith(_DOCTEST)


# -- a rename carried to other files ---------------------------------------------------------------


@dataclass(frozen=True)
class CarriedRename:
    """A rename other files take part in: `old` -> `new`, a name of the modules `modules` (each its last
    dotted part: `report` for shop/report.py; a file that imports the name may pass it on, so both
    the module it comes from and that file's), or with `owner` a method or attribute of that class."""

    old: str
    new: str
    modules: tuple[str, ...]
    owner: str | None = None
    # Whether the file renamed the definition itself; else it renamed an imported name or a module's
    # attribute, which goes on only where the project defines the name (the caller asks its index:
    # `typing.Dict` -> `typing.Mapping` is no rename of the project's).
    at_definition: bool = True


_PY = (".py", ".pyi")
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#]+)", re.M)


def module_name(path: str) -> str:
    """The last dotted part of the module at `path` (a package's for its `__init__.py`)."""
    parts = re.split(r"[\\/]", path.rstrip("/\\"))
    stem = parts[-1].rsplit(".", 1)[0]
    return parts[-2] if stem == "__init__" and len(parts) > 1 else stem


def _word(name: str) -> str:
    return r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])"


def _definition(text: str, name: str) -> tuple[str, str | None] | None:
    """("module", None) when `text` defines `name` at module level (def, class, assignment); ("member",
    class) for a method or class attribute; None otherwise (a nested function's, or no definition)."""
    lines = text.split("\n")
    pattern = re.compile(r"([ \t]*)(?:(?:async[ \t]+)?def[ \t]+|class[ \t]+)?" + re.escape(name)
                         + r"(?:[ \t]*[(:=]|$)")
    prose, offset = _prose_spans(text), 0
    for row, line in enumerate(lines):
        match, start, offset = pattern.match(line), offset, offset + len(line) + 1
        if match is None or _in_prose(text, prose, start + match.end(1)):
            continue
        statement = line[match.end(1):]
        is_def = statement.startswith(("def", "async", "class"))
        assigned = re.match(re.escape(name) + r"[ \t]*(?::[^=\n]*)?=(?!=)", statement)
        if not is_def and not assigned:
            continue
        depth = len(match.group(1))
        if depth == 0:
            return "module", None
        for above in range(row - 1, -1, -1):  # the block it sits in: a class's, or a function's
            outer = lines[above]
            if outer.strip() and _indent(outer) < depth and not outer.lstrip().startswith((")", "@", "#")):
                found = re.match(r"[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", outer)
                if found and _indent(outer) == 0:
                    return "member", found.group(1)
                break
    return None


def _import_spans(text: str, module: str, name: str) -> list[tuple[int, int]]:
    """Spans of `name` in the from-imports of `text` that import it from `module` (the module's last
    part, or a relative import of it: `from .report import`, `from . import`)."""
    spans = []
    for match in _FROM_IMPORT.finditer(text):
        source = match.group(1)
        if source.rsplit(".", 1)[-1] != module and source.strip(".") != "":
            continue
        for found in re.finditer(_word(name), match.group(2)):
            before = match.group(2)[: found.start()].rstrip()
            if before.endswith(" as") or before.endswith("\tas"):
                continue  # `... import total as t`: `total` here is the alias, not the module's name
            spans.append((match.start(2) + found.start(), match.start(2) + found.end()))
    return spans


def _module_spans(text: str) -> list[tuple[int, int]]:
    """Where `text`'s imports name modules: the `shop.report` of `from shop.report import` and of
    `import shop.report as r`."""
    spans = [match.span(1) for match in _FROM_IMPORT.finditer(text)]
    for match in _IMPORT.finditer(text):
        if re.search(r"\bfrom\b|[{'\"*]", match.group(1)):
            continue  # JavaScript's `import x from "y"`: not a module's name
        for item in re.finditer(r"[^,]+", match.group(1)):
            name = re.search(r"\S+", item.group())
            if name is not None:
                start = match.start(1) + item.start() + name.start()
                spans.append((start, start + len(name.group())))
    return spans


def _imported_modules(text: str) -> dict[str, str]:
    """What `text`'s imports may name a module by: alias -> the module's last part (`import
    shop.report` -> {"shop.report": "report"}; `import shop.report as r`, `from shop import report
    as r` -> {"r": "report"}; `from shop import report` -> {"report": "report"})."""
    found = {}
    for match in _IMPORT.finditer(text):
        for item in match.group(1).split(","):
            parts = item.split()
            if parts:
                alias = parts[2] if len(parts) == 3 and parts[1] == "as" else parts[0]
                found[alias] = parts[0].rsplit(".", 1)[-1]
    for match in _FROM_IMPORT.finditer(text):
        for item in match.group(2).strip("() \t\n").split(","):
            parts = item.split()
            if parts and parts[0] != "*":
                found[parts[2] if len(parts) == 3 and parts[1] == "as" else parts[0]] = parts[0]
    return found


def _module_aliases(text: str, module: str) -> list[str]:
    """The names under which `text` refers to the module `module` (its last part)."""
    return [alias for alias, name in _imported_modules(text).items() if name == module]


def carried_rename(history: EditHistory, uri: str) -> CarriedRename | None:
    """The document's last edit as a rename other files take part in (see the module docstring), or
    None: not a rename, undone, local to a function, not Python, or a name no other module sees."""
    edits, text = history.edits(uri), history.text(uri)
    if not edits or text is None or not uri.endswith(_PY):
        return None
    renamed = _rename(edits[-1])
    if renamed is None or undone(edits[:-1], *renamed) or _local_scope(edits[-1], *renamed) is not None:
        return None
    old, new = renamed
    defined = _definition(text, new)
    if defined is not None and _definition(text, old) is None:
        return CarriedRename(old, new, (module_name(_uri_path(uri)),), defined[1])
    holding = _holding(_uri_path(uri), text, new)
    if holding:  # imported by its new name
        return CarriedRename(old, new, holding, at_definition=False)
    modules = _imported_modules(text)  # used as a module's attribute: `report.subtotal`
    attribute = r"(?<![A-Za-z0-9_.])([A-Za-z_][\w.]*)\." + re.escape(new) + r"(?![A-Za-z0-9_])"
    for alias in re.findall(attribute, text):
        if alias in modules:
            return CarriedRename(old, new, (modules[alias],), at_definition=False)
    return None


# A repeat goes to another file only between its full neighbours on both sides (placed so, 76% of
# the in-file offers are right on real histories; 39% with 6 characters each side, 7-32% with one
# side or none).
_ELSEWHERE_LEVELS = ((CONTEXT, CONTEXT),)


def repeat_elsewhere(history: EditHistory, uri: str) -> Edit | None:
    """The document's last edit when it is a change to repeat in other files (an edit within a line
    that is no rename, was not undone and is not in an import, with no place left for it in its own
    file); else None."""
    edits, text = history.edits(uri), history.text(uri)
    if not edits or text is None:
        return None
    last = edits[-1]
    if not last.before or "\n" in last.old + last.new or _rename(last) is not None:
        return None
    if undone(edits[:-1], last.old, last.new) or not (last.old + last.new).strip():
        return None
    imports = [m.span() for pattern in (_FROM_IMPORT, _IMPORT) for m in pattern.finditer(last.before)]
    if any(start <= last.start <= end for start, end in imports):
        return None  # a name added to an import: each file imports what it needs
    done = _Done(last.start, last.start + len(last.new))
    return last if _next_repeat(last, text, 0, done) is None else None


def next_repeat_elsewhere(edit: Edit, text: str) -> Prediction | None:
    """The first place in another file's `text` where `edit` (a `repeat_elsewhere`) applies: the same
    text between the same neighbours on both sides, every line of the file in order."""
    return _next_repeat(edit, text, 0, _Done(-1, -1), _ELSEWHERE_LEVELS)


def context_names(edit: Edit) -> list[str]:
    """The names on `edit`'s line, nearest to it first: what the files it may be repeated in use
    (the server asks its index which files those are)."""
    before, start, end = edit.before, edit.start, edit.start + len(edit.old)
    line_start = before.rfind("\n", 0, start) + 1
    line_end = before.find("\n", end)
    line = before[line_start : len(before) if line_end < 0 else line_end]
    found = [(max(line_start + m.start() - end, start - line_start - m.end(), 0), m.group())
             for m in _IDENT.finditer(line)]
    return [name for _, name in sorted(found) if not keyword.iskeyword(name)]


def defines(text: str, name: str) -> bool:
    """Whether the Python source `text` defines `name` at module level or in a class."""
    return _definition(text, name) is not None


def _holding(path: str, text: str, name: str) -> tuple[str, ...]:
    """The modules other files may import `name` from, as the file at `path` holds it: its own when it
    defines it at module level; the module it imports it from and its own when it imports it (a
    package's `__init__.py` passes on what it imports); none otherwise."""
    own = module_name(path)
    defined = _definition(text, name)
    if defined is not None:
        return (own,) if defined[0] == "module" else ()
    for match in _FROM_IMPORT.finditer(text):
        if re.search(_word(name), match.group(2)):
            source = match.group(1).strip(".").rsplit(".", 1)[-1]
            return tuple(dict.fromkeys(module for module in (source, own) if module))
    return ()


def widened(rename: CarriedRename, documents: Iterable[tuple[str, str]]) -> CarriedRename:
    """`rename` with the modules of `documents` ((path, text): the files open in the editor, where the
    developer has been renaming) that hold its new name: a rename carried from a file that imports
    the name goes on to the files that import it from where it is defined."""
    if rename.owner is not None:
        return rename
    modules = list(rename.modules)
    for path, text in documents:
        if path.endswith(_PY) and re.search(_word(rename.new), text):
            modules += [m for m in _holding(path, text, rename.new) if m not in modules]
    return CarriedRename(rename.old, rename.new, tuple(modules), rename.owner, rename.at_definition)


def _uri_path(uri: str) -> str:
    """The path part of a file URI, percent-decoded (enough to name its module)."""
    return unquote(urlparse(uri).path) if "://" in uri else uri


def next_use_elsewhere(rename: CarriedRename, text: str, path: str = "") -> Prediction | None:
    """The first place in another file's `text` (at `path`) where `rename` applies: its import of the
    old name from one of the modules, or its first use of it as such a module's attribute
    (`report.total`); when the file is one of those modules (the developer renamed a use of an
    imported name first), its module-level definition or its own relative import of the old name
    (a package passing on its module's name: the way to where it is defined); for a method, its
    first use as an attribute when the file names the class. None when the file takes no part.
    Every use on that line in code goes at once."""
    old, new = rename.old, rename.new
    if any(re.search(_word(new), match.group(2)) for match in _FROM_IMPORT.finditer(text)):
        return None  # it imports the new name already: not a rename here (`Client` for `AsyncClient`)
    if rename.owner is not None:
        if not re.search(_word(rename.owner), text):
            return None
        places = [m.span(1) for m in re.finditer(r"\.[ \t]*(" + re.escape(old) + r")(?![A-Za-z0-9_])", text)]
    else:
        places = [span for module in rename.modules for span in _import_spans(text, module, old)]
        if path and module_name(path) in rename.modules:
            places += [m.span(1) for m in re.finditer(r"^(?:(?:async[ \t]+)?def[ \t]+|class[ \t]+)?("
                                                      + re.escape(old) + r")(?=[ \t]*[(:=])", text, re.M)]
            for match in _FROM_IMPORT.finditer(text):  # a package passing on its module's name
                if match.group(1).startswith("."):
                    places += [(match.start(2) + m.start(), match.start(2) + m.end())
                               for m in re.finditer(_word(old), match.group(2))]
        for alias in {a for module in rename.modules for a in _module_aliases(text, module)}:
            attribute = r"(?<![A-Za-z0-9_.])" + re.escape(alias) + r"\.(" + re.escape(old) + r")\b"
            places += [m.span(1) for m in re.finditer(attribute, text)]
    prose = _prose_spans(text)
    places = sorted({span for span in places if not _in_prose(text, prose, span[0])})  # once each
    if not places:
        return None
    first = places[0]
    line_end = text.find("\n", first[1])
    line_end = len(text) if line_end < 0 else line_end
    end, pieces = first[1], [new]
    for span in places[1:]:
        if span[0] >= line_end:
            break
        pieces += [text[end : span[0]], new]
        end = span[1]
    return Prediction(first[0], end, "".join(pieces), "rename")
