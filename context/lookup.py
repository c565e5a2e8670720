"""Prompt-lookup drafts for speculative decoding: guess the next tokens from earlier text.

Code that an edit or a completion writes often repeats text already in the prompt (an agent edit
rewrites most of the original lines; a call repeats a signature). When the last few tokens occurred
before, the tokens that followed them then are a cheap draft; the model checks a whole draft in one
forward pass and keeps the part it agrees with, so the output is the greedy output either way.
"""

from __future__ import annotations

__all__ = ["PromptLookup"]


class PromptLookup:
    """An n-gram index over the tokens so far, answering "what followed this suffix last time?"."""

    def __init__(self, ids: list[int], ngram_sizes: tuple[int, ...] = (4, 3, 2), max_draft: int = 8):
        self.history: list[int] = []
        self.sizes = tuple(sorted(ngram_sizes, reverse=True))
        self.max_draft = max_draft
        # n -> {n-gram: the position right after its latest occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
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

    def draft(self, limit: int | None = None) -> list[int]:
        """Tokens that followed the longest earlier occurrence of the current suffix ([] if none)."""
        limit = self.max_draft if limit is None else min(limit, self.max_draft)
        if limit <= 0:
            return []
        history = self.history
        for n in self.sizes:
            if len(history) < n:
                continue
            follow = self._index[n].get(tuple(history[-n:]))
            if follow is not None:
                return history[follow : follow + limit]
        return []
