"""Prompt-lookup drafts for speculative decoding: guess the next tokens from earlier text.

Code that an edit or a completion writes often repeats text already in the prompt (an agent edit
rewrites most of the original lines; a call repeats a signature). When the last few tokens occurred
before, the tokens that followed them then are a cheap draft; the model checks a whole draft in one
forward pass and keeps the part it agrees with, so the output is the greedy output either way.

An edit that renames something writes a new token where the earlier text had another one; the
n-grams ending in it occurred nowhere before, so an exact lookup would find nothing until n tokens
later. The lookup therefore follows the text it is copying: when no n-gram matches, the newest
token is taken to have replaced the one the copy expected, and the draft goes on after that one.
A few such misses in a row end the copy (the output is new text, not an edit).

How long a draft to check is `DraftLengths`' call: a verify pass costs more per drafted token, and
drafts from different sources (a 4-gram match, a 2-gram match, a guessed substitution) come true at
very different rates, so it keeps a length and a rate per source over the generation so far, and a
source whose drafts come true less often than a drafted token costs drafts nothing.
"""

from __future__ import annotations

__all__ = ["DraftLengths", "PromptLookup"]

MAX_SUBSTITUTIONS = 2  # consecutive tokens that differ from the copied text before the copy ends
SUBSTITUTION = 0  # `PromptLookup.source` of a draft that follows a guessed substitution


class PromptLookup:
    """An n-gram index over the tokens so far, answering "what followed this suffix last time?"."""

    def __init__(self, ids: list[int], ngram_sizes: tuple[int, ...] = (4, 3, 2), max_draft: int = 8):
        self.history: list[int] = []
        self.sizes = tuple(sorted(ngram_sizes, reverse=True))
        self.max_draft = max_draft
        # n -> {n-gram: the position right after its latest occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._follow: int | None = None  # where the text being copied goes on (the next draft)
        self.source: int | None = None  # what found it: the n of the n-gram, or SUBSTITUTION
        self._misses = 0
        for token in ids:
            self.append(token)

    def append(self, token: int) -> None:
        """Add the next token; the n-grams ending just before it now point at it."""
        history = self.history
        end = len(history)
        for n in self.sizes:
            if end >= n:
                self._index[n][tuple(history[end - n :])] = end
        history.append(token)
        self._follow = self._next_follow(token)

    def _next_follow(self, token: int) -> int | None:
        history = self.history
        # The suffix ending in the new token is not indexed yet: what is found is an earlier occurrence.
        for n in self.sizes:
            if len(history) > n:
                follow = self._index[n].get(tuple(history[-n:]))
                if follow is not None:
                    self._misses = 0
                    self.source = n
                    return follow
        self.source = SUBSTITUTION
        if self._follow is None:
            return None
        # No earlier text ends like this: the token took the place of the one the copy expected.
        self._misses = self._misses + 1 if history[self._follow] != token else 0
        follow = self._follow + 1
        if self._misses > MAX_SUBSTITUTIONS or follow >= len(history) - 1:
            return None
        return follow

    def draft(self, limit: int | None = None) -> list[int]:
        """Tokens that followed the longest earlier occurrence of the current suffix, or, after a
        replaced token, those after the token it replaced in the text being copied ([] if none)."""
        limit = self.max_draft if limit is None else min(limit, self.max_draft)
        if limit <= 0 or self._follow is None:
            return []
        draft = self.history[self._follow : self._follow + limit]
        # A copy that reaches the present goes on into itself, as an overlapping LZ77 copy does:
        # text repeating with a short period ("\n#\n#") drafts whole runs, not one period.
        period = len(self.history) - self._follow
        while len(draft) < limit:
            draft.append(draft[len(draft) - period])
        return draft


class DraftLengths:
    """How many tokens to draft next, per draft source (`PromptLookup.source`).

    A verify pass of k drafted tokens costs about 1 + `token_cost` * k single decoding steps (the
    fused CPU step and its head here: about 10 ms for one token and 1.5-1.8 ms more per drafted
    token, so 0.15-0.2), so a draft pays only where its tokens come true more often than that: a
    source whose rate so far (tokens confirmed against tokens rejected; those after the first
    rejected one are never judged) is at most `token_cost` drafts nothing. Otherwise each source's
    length follows the schedule of transformers' assisted decoding: two more after a draft
    confirmed whole, one fewer after any other.
    """

    def __init__(self, max_draft: int, token_cost: float = 0.2, prior: tuple[float, float] = (2.0, 1.0)):
        self.max_draft = max_draft
        self.token_cost = token_cost
        self.prior = prior  # (confirmed, rejected) tokens assumed before any draft is checked
        self._counts: dict[int | None, list[float]] = {}
        self._lengths: dict[int | None, int] = {}

    def rate(self, source: int | None) -> float:
        confirmed, rejected = self._counts.get(source, self.prior)
        return confirmed / (confirmed + rejected)

    def length(self, source: int | None, limit: int) -> int:
        if self.rate(source) <= self.token_cost:
            return 0
        return max(0, min(self._lengths.get(source, max(1, self.max_draft // 2)), limit))

    def record(self, source: int | None, drafted: int, accepted: int) -> None:
        counts = self._counts.setdefault(source, list(self.prior))
        counts[0] += accepted
        counts[1] += 1 if accepted < drafted else 0
        length = self._lengths.get(source, max(1, self.max_draft // 2))
        self._lengths[source] = min(length + 2, self.max_draft) if accepted == drafted else max(1, length - 1)
