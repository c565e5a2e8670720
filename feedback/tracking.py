"""Follow accepted completions and applied agent edits through later edits, and judge them.

A tracked region is a span of one document, in LSP coordinates (line, character in the client's
position units, UTF-16 by default). Each incremental change (range + new text) moves the regions of
its document: a change before a region shifts it, one inside grows or shrinks it, one across a
boundary clips it. That arithmetic is all the `didChange` path does; reading a region's text and
comparing it happens only when a checkpoint falls due.

At each checkpoint (seconds after the edit) a region is judged against what was inserted:
`unchanged`, `mostly_unchanged` (normalised edit distance < 0.33), `modified`, `removed`, or
`reverted` (its text is what it was before the edit: an undo). Closed documents keep their last text
and are judged on it; reopening the same text, or a rename, picks the regions up again.
"""

from __future__ import annotations

import difflib
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "EditTracker",
    "TextChange",
    "Observation",
    "Region",
    "classify",
    "normalised_distance",
    "MOSTLY_UNCHANGED_BELOW",
    "STATUSES",
]

Pos = tuple[int, int]  # (line, character) in client position units

MOSTLY_UNCHANGED_BELOW = 0.33
STATUSES = ("unchanged", "mostly_unchanged", "modified", "removed", "reverted")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Above this many character pairs, edit distance is estimated from difflib's matching blocks.
_EXACT_DISTANCE_CELLS = 2_000_000


@dataclass(frozen=True, slots=True)
class TextChange:
    """One content change of a didChange: `start`/`end` None means the whole text was replaced."""

    start: Pos | None
    end: Pos | None
    text: str


@dataclass(slots=True)
class Region:
    id: str
    episode_id: str
    uri: str
    start: Pos
    end: Pos
    new_text: str
    old_text: str
    created: float
    pending: list[float]  # checkpoint offsets (s) not yet observed, ascending
    undone_in_one: bool = False  # one change replaced the untouched region with its old text
    touched: bool = False  # some change fell inside or across the region
    coarse: bool = False  # a change swallowed the region: its bounds are approximate
    snapshot: str | None = None  # the region's text when its document was closed


@dataclass(frozen=True, slots=True)
class Observation:
    """A region judged at a checkpoint."""

    region_id: str
    episode_id: str
    checkpoint_s: float
    status: str
    distance: float
    kept_text: str
    source: str  # "open": read from the live document; "closed": from its text at close
    uri: str = ""
    new_text: str = ""  # what the output inserted
    old_text: str = ""  # what it replaced
    final: bool = False  # the region's last checkpoint


@dataclass(slots=True)
class _Expectation:
    episode_id: str
    position: Pos
    text: str
    old_text: str
    deadline: float


@dataclass
class _Document:
    text: str
    regions: list[Region] = field(default_factory=list)
    expected: list[_Expectation] = field(default_factory=list)
    closed: bool = False


def _units(text: str, utf16: bool) -> int:
    if not utf16 or text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _span_shape(text: str, utf16: bool) -> tuple[int, int]:
    """(line breaks in text, length of its last line in position units)."""
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    if not breaks:
        return 0, _units(text, utf16)
    last = _LINE_BREAK.split(text)[-1]
    return breaks, _units(last, utf16)


def _map_after(p: Pos, s: Pos, e: Pos, shape: tuple[int, int]) -> Pos:
    """Where a position at or after a change's end `e` lands once [s, e) is replaced."""
    breaks, last = shape
    if p[0] == e[0]:
        base = s[1] if breaks == 0 else 0
        return (s[0] + breaks, base + last + p[1] - e[1])
    return (p[0] + breaks - (e[0] - s[0]), p[1])


def _end_of_insert(s: Pos, shape: tuple[int, int]) -> Pos:
    breaks, last = shape
    return (s[0] + breaks, (s[1] if breaks == 0 else 0) + last)


def _move(region: Region, s: Pos, e: Pos, text: str, utf16: bool) -> None:
    """Transform `region` by the change replacing [s, e) with `text`."""
    a, b = region.start, region.end
    if s >= b:
        return  # after the region (an insertion right at its end stays outside)
    shape = _span_shape(text, utf16)
    if a == b and s < a < e:  # an emptied region inside a deleted span stays empty
        region.start = region.end = s
    elif e <= a:  # before the region (an insertion right at its start shifts it)
        region.start, region.end = _map_after(a, s, e, shape), _map_after(b, s, e, shape)
    elif a <= s and e <= b:  # inside
        region.undone_in_one = not region.touched and s == a and e == b and text == region.old_text
        region.touched = True
        region.end = _map_after(b, s, e, shape)
    elif s <= a and e >= b:  # swallows the whole region
        region.start, region.end = s, _end_of_insert(s, shape)
        region.coarse = bool(text)
        region.undone_in_one = False
    elif s < a:  # across the start
        region.start, region.end = s, _map_after(b, s, e, shape)
        region.touched = True
    else:  # across the end
        region.end = _end_of_insert(s, shape)
        region.touched = True


def _offset(text: str, line_starts: list[int], pos: Pos, utf16: bool) -> int:
    line, units = pos
    if line >= len(line_starts):
        return len(text)
    start = line_starts[line]
    stop = line_starts[line + 1] if line + 1 < len(line_starts) else len(text)
    content = text[start:stop]
    if not utf16 or content.isascii():
        return min(start + units, stop)
    count = 0
    for i, char in enumerate(content):
        if count >= units:
            return start + i
        count += 2 if ord(char) > 0xFFFF else 1
    return stop


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in _LINE_BREAK.finditer(text)]


def _position_of(text: str, offset: int, utf16: bool) -> Pos:
    starts = _line_starts(text[:offset])
    line = len(starts) - 1
    return (line, _units(text[starts[-1] : offset], utf16))


def region_text(text: str, start: Pos, end: Pos, utf16: bool = True) -> str:
    starts = _line_starts(text)
    return text[_offset(text, starts, start, utf16) : _offset(text, starts, end, utf16)]


def normalised_distance(a: str, b: str) -> float:
    """Levenshtein distance over the longer length (0 same, 1 nothing in common)."""
    if a == b:
        return 0.0
    longest = max(len(a), len(b))
    if not a or not b:
        return 1.0
    if len(a) * len(b) > _EXACT_DISTANCE_CELLS:
        matched = sum(
            m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
        )
        return 1.0 - matched / longest
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1] / longest


def classify(new_text: str, old_text: str, current: str, undone_in_one: bool = False) -> tuple[str, float]:
    """(status, normalised distance from what was inserted) of a region whose text is `current`."""
    distance = normalised_distance(new_text, current)
    if current == new_text:
        return "unchanged", 0.0
    if current == old_text and (old_text or undone_in_one):
        return "reverted", distance
    if not current.strip():
        return "removed", distance
    if distance < MOSTLY_UNCHANGED_BELOW:
        return "mostly_unchanged", distance
    return "modified", distance


class EditTracker:
    """Regions of edits under watch, per document; not thread-safe (the event loop owns it)."""

    def __init__(
        self,
        checkpoints_s: Iterable[float] = (30.0, 120.0, 300.0, 600.0),
        clock: Callable[[], float] = time.monotonic,
        utf16: bool = True,
        expect_for_s: float = 5.0,
    ):
        self.checkpoints_s = sorted(checkpoints_s)
        self.clock = clock
        self.utf16 = utf16
        self.expect_for_s = expect_for_s
        self._docs: dict[str, _Document] = {}

    # -- what to watch -------------------------------------------------------------------------

    def track(
        self, episode_id: str, uri: str, start: Pos, end: Pos, new_text: str, old_text: str, text: str
    ) -> Region:
        """Watch [start, end) of `uri`, whose current full text is `text`, holding `new_text`."""
        doc = self._docs.setdefault(uri, _Document(text))
        doc.text, doc.closed = text, False
        region = Region(
            uuid.uuid4().hex,
            episode_id,
            uri,
            start,
            end,
            new_text,
            old_text,
            self.clock(),
            list(self.checkpoints_s),
        )
        doc.regions.append(region)
        return region

    def track_edit(
        self, episode_id: str, uri: str, near: Pos, new_text: str, old_text: str, text: str
    ) -> Region | None:
        """Watch an accepted insertion or applied edit: found in `text` at or near `near`, or
        expected in a change soon (None then).

        Clients apply an edit and report it (didChange) or run the accept command in either order,
        so `new_text` may be in the document already, or arrive in the next didChange.
        """
        if not new_text:
            return self.track(episode_id, uri, near, near, new_text, old_text, text)
        origin = _offset(text, _line_starts(text), near, self.utf16)
        applied = text.startswith(new_text, origin)
        pending = bool(old_text) and text.startswith(old_text, origin)
        hit: int | None = None
        if applied and not (pending and len(old_text) > len(new_text)):
            hit = origin
        elif not pending:
            hits = [
                m.start() for m in re.finditer(re.escape(new_text), text) if abs(m.start() - origin) <= 2000
            ]
            hit = min(hits, key=lambda h: abs(h - origin)) if hits else None
        if hit is not None:
            start = _position_of(text, hit, self.utf16)
            end = _position_of(text, hit + len(new_text), self.utf16)
            return self.track(episode_id, uri, start, end, new_text, old_text, text)
        doc = self._docs.setdefault(uri, _Document(text))
        doc.expected.append(
            _Expectation(episode_id, near, new_text, old_text, self.clock() + self.expect_for_s)
        )
        return None

    # -- editor events (the hot path) -----------------------------------------------------------

    def apply_changes(self, uri: str, changes: list[TextChange], text_after: str) -> list[Region]:
        """Move the regions of `uri` through one didChange; returns regions that expectations created."""
        doc = self._docs.get(uri)
        if doc is None:
            return []
        created: list[Region] = []
        if any(change.start is None for change in changes):
            changes = self._as_range_changes(doc.text, text_after)
        for change in changes:
            s, e = change.start, change.end
            for region in doc.regions:
                _move(region, s, e, change.text, self.utf16)
            if doc.expected:
                created += self._meet_expectations(doc, uri, change, text_after)
        doc.text = text_after
        return created

    def _as_range_changes(self, before: str, after: str) -> list[TextChange]:
        """A whole-text replacement as the line range changes it amounts to, last first (so that
        each applies to the text the previous one left)."""
        old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
        changes = []
        for tag, i1, i2, j1, j2 in reversed(matcher.get_opcodes()):
            if tag != "equal":
                changes.append(TextChange((i1, 0), (i2, 0), "".join(new_lines[j1:j2])))
        return changes

    def _meet_expectations(
        self, doc: _Document, uri: str, change: TextChange, text_after: str
    ) -> list[Region]:
        now = self.clock()
        doc.expected = [x for x in doc.expected if x.deadline >= now]
        created = []
        for expectation in list(doc.expected):
            where = change.text.find(expectation.text)
            if where < 0 or change.start is None:
                continue
            doc.expected.remove(expectation)
            start = _map_after(
                change.start, change.start, change.start, _span_shape(change.text[:where], self.utf16)
            )
            end = _map_after(start, start, start, _span_shape(expectation.text, self.utf16))
            region = Region(
                uuid.uuid4().hex,
                expectation.episode_id,
                uri,
                start,
                end,
                expectation.text,
                expectation.old_text,
                now,
                list(self.checkpoints_s),
            )
            doc.regions.append(region)
            created.append(region)
        return created

    def close(self, uri: str) -> None:
        """The document was closed: keep each region's text as it was, to judge it later."""
        doc = self._docs.get(uri)
        if doc is None:
            return
        for region in doc.regions:
            region.snapshot = self._current_text(doc, region)
        doc.closed, doc.expected = True, []

    def reopen(self, uri: str, text: str) -> bool:
        """A closed document opened again: resume its regions if its text is the one closed."""
        doc = self._docs.get(uri)
        if doc is None or not doc.closed or doc.text != text:
            return False
        doc.closed = False
        for region in doc.regions:
            region.snapshot = None
        return True

    def rename(self, old_uri: str, new_uri: str) -> None:
        doc = self._docs.pop(old_uri, None)
        if doc is None:
            return
        for region in doc.regions:
            region.uri = new_uri
        target = self._docs.get(new_uri)
        if target is None:
            self._docs[new_uri] = doc
        else:
            target.regions += doc.regions

    # -- checkpoints ---------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """The clock time of the earliest pending checkpoint, None when nothing is tracked."""
        times = [r.created + r.pending[0] for d in self._docs.values() for r in d.regions if r.pending]
        return min(times, default=None)

    def due(self, now: float | None = None) -> list[Observation]:
        """Judge every region whose next checkpoints have passed; forget regions with none left."""
        now = self.clock() if now is None else now
        observations = []
        for uri, doc in list(self._docs.items()):
            for region in doc.regions:
                if not region.pending or region.created + region.pending[0] > now:
                    continue
                text = self._current_text(doc, region)
                status, distance = classify(region.new_text, region.old_text, text, region.undone_in_one)
                while region.pending and region.created + region.pending[0] <= now:
                    checkpoint = region.pending.pop(0)
                    observations.append(
                        Observation(
                            region.id,
                            region.episode_id,
                            checkpoint,
                            status,
                            distance,
                            text,
                            "closed" if doc.closed else "open",
                            uri,
                            region.new_text,
                            region.old_text,
                            not region.pending,
                        )
                    )
            doc.regions = [r for r in doc.regions if r.pending]
            if not doc.regions and not doc.expected:
                del self._docs[uri]
        return observations

    def _current_text(self, doc: _Document, region: Region) -> str:
        if region.snapshot is not None:
            return region.snapshot
        text = region_text(doc.text, region.start, region.end, self.utf16)
        if region.coarse and region.new_text and region.new_text in text:
            # A replacement swallowed the region (a formatter, a paste): find the edit inside it.
            where = doc.text.find(
                region.new_text, _offset(doc.text, _line_starts(doc.text), region.start, self.utf16)
            )
            if where >= 0:
                region.start = _position_of(doc.text, where, self.utf16)
                region.end = _position_of(doc.text, where + len(region.new_text), self.utf16)
                region.coarse = False
            return region.new_text
        return text

    def follows(self, uri: str) -> bool:
        """Whether changes of `uri` matter (it has regions or expected insertions)."""
        return uri in self._docs

    def tracked(self, uri: str | None = None) -> list[Region]:
        docs = (
            [self._docs[uri]]
            if uri is not None and uri in self._docs
            else ([] if uri is not None else list(self._docs.values()))
        )
        return [r for d in docs for r in d.regions]
