"""An edit block's search text decoded as a copy of the file (the local model's edit fallback, and
with `agent.copy_search` any edit block it opens for the file asked about: `EditCopy`).

A small model asked to quote the lines it replaces writes lines that are not in the file, or copies
the protocol's own example: its edit then never applies. When the agent opens an edit block for it
(`agent.loop`'s edit fallback), this constraint holds while it writes the SEARCH section: every
token it may pick keeps the text so far a piece of the file that starts at the start of a line (its
first line not a blank one), and once that is whole lines found at one place only it may also close
the section (`=======`). In the replacement it writes freely, except that a line starting with a
marker's character must be the closing `>>>>>>> REPLACE` (small models write `>>==` or a second
divider, and the block never parses). The model still chooses which lines, and what replaces
them; it can no longer choose lines that are not there. When the request names lines of the file
(an editor's selection, a function), the search text starts among them, as an editor's edit of a
selection rewrites that selection: a small model otherwise quotes a line of another function.
"""

from __future__ import annotations

from collections.abc import Sequence

from .protocol import PATH_PLACEHOLDER

__all__ = ["CopySearch", "DIVIDER", "EditCopy", "OPEN", "copy_vocabulary"]

OPEN = "<<<<<<< SEARCH\n"
DIVIDER = "======="
CLOSE = ">>>>>>> REPLACE"
_MARKS = ("=", "<", ">")
_MAX_TOKEN_CHARS = 48
_MEMO = 4096  # texts whose matching line starts are remembered (a batch's rows grow their own)


def copy_vocabulary(token_texts: Sequence[str]) -> dict[str, list[int]]:
    """Token ids by their text (what `CopySearch` looks continuations up in); build once per model."""
    by_text: dict[str, list[int]] = {}
    for token, text in enumerate(token_texts):
        if text and len(text) <= _MAX_TOKEN_CHARS:
            by_text.setdefault(text, []).append(token)
    return by_text


class CopySearch:
    """`context.generation.Constrain` for the text after an opened `<<<<<<< SEARCH` line: the
    token ids that continue `source` from a line start (one of `lines`, 1-based and inclusive,
    when given), or close the section at a line end where the text is found once in `source`."""

    def __init__(self, source: str, vocabulary: dict[str, list[int]], lines: tuple[int, int] | None = None):
        self.source = source
        self.vocabulary = vocabulary
        self.longest = max((len(text) for text in vocabulary), default=1)
        line_starts = [0] + [i + 1 for i, char in enumerate(source) if char == "\n" and i + 1 < len(source)]
        self._memo: dict[str, list[int]] = {"": line_starts}
        self._line_free: set[int] | None = None  # tokens a replacement line may start with
        self._opening = self._openings(line_starts, lines)

    def __call__(self, text: str) -> set[int] | None:
        _, divided, replacement = ("\n" + text).partition(f"\n{DIVIDER}\n")
        if divided:
            return self._replacement(replacement)
        allowed: set[int] = set()
        line_start = text.rfind("\n") + 1
        tail = text[line_start:]
        # Closing is allowed after whole lines found at one place only (an edit applies there).
        if line_start > 0 and DIVIDER.startswith(tail) and len(self._starts(text[:line_start])) == 1:
            allowed |= self._prefixes_of((DIVIDER + "\n")[len(tail):])
        starts = [start for start in self._starts(text) if start in self._opening]
        for start in starts:
            at = start + len(text)
            allowed |= self._prefixes_of(self.source[at : at + self.longest])
        return allowed or None  # nothing fits (the file's end): free rather than stuck

    def _openings(self, line_starts: list[int], lines: tuple[int, int] | None) -> set[int]:
        """Where a search text may start: lines with something in them, among `lines` when any
        of those has (else anywhere in the file)."""
        ends = [start - 1 for start in line_starts[1:]] + [len(self.source)]
        pairs = zip(line_starts, ends, strict=True)
        filled = {start for start, end in pairs if self.source[start:end].strip()}
        if lines is not None:
            first, last = lines
            chosen = {start for start in line_starts[max(first, 1) - 1 : last] if start in filled}
            if chosen:
                return chosen
        return filled

    def _replacement(self, rest: str) -> set[int] | None:
        """The replacement's constraint: a line that starts like a marker is the closing one."""
        if f"{CLOSE}" in rest:
            return None
        tail = rest[rest.rfind("\n") + 1:]
        if not tail:
            return self._line_start_tokens()
        if CLOSE.startswith(tail):
            return self._prefixes_of(f"{CLOSE}\n"[len(tail):])
        return None

    def _line_start_tokens(self) -> set[int]:
        if self._line_free is None:
            self._line_free = {i for text, ids in self.vocabulary.items() for i in ids
                               if not text.startswith(_MARKS)} | self._prefixes_of(f"{CLOSE}\n")
        return self._line_free

    def _starts(self, text: str) -> list[int]:
        """Line starts from which `source` begins with `text`."""
        found = self._memo.get(text)
        if found is not None:
            return found
        shorter = next((text[:n] for n in range(len(text) - 1, max(-1, len(text) - _MAX_TOKEN_CHARS - 1), -1)
                        if text[:n] in self._memo), "")
        found = [start for start in self._memo[shorter] if self.source.startswith(text, start)]
        if len(self._memo) >= _MEMO:
            self._memo = {"": self._memo[""]}
        self._memo[text] = found
        return found

    def _prefixes_of(self, rest: str) -> set[int]:
        """Tokens whose text starts `rest`."""
        ids: set[int] = set()
        for end in range(1, min(len(rest), self.longest) + 1):
            ids.update(self.vocabulary.get(rest[:end], ()))
        return ids


class EditCopy:
    """The copy for edit blocks the model opens itself (`agent.copy_search`): its answer is free
    until it opens an edit block of `path` (the block's header names that file, none, or the
    instructions' placeholder), whose search text is then decoded as a copy of `source`
    (`CopySearch`), and free again once the block is closed. Small models that do write edit
    blocks quote lines that are not in the file."""

    def __init__(self, path: str, source: str, vocabulary: dict[str, list[int]],
                 lines: tuple[int, int] | None = None):
        self.path = path
        self.copy = CopySearch(source, vocabulary, lines)

    def __call__(self, text: str) -> set[int] | None:
        at = text.rfind(OPEN)
        if at < 0 or not self._names_file(text[:at]):
            return None
        return self.copy(text[at + len(OPEN):])

    def _names_file(self, head: str) -> bool:
        first = head.partition("\n")[0].strip()
        if not first.startswith("edit"):
            return False
        named = first.removeprefix("edit").strip()
        return named in ("", PATH_PLACEHOLDER, self.path) or self.path.endswith("/" + named)
