"""Prompt-lookup drafts (`context.lookup.PromptLookup`) on token sequences."""

from __future__ import annotations

from context.lookup import SUBSTITUTION, DraftLengths, PromptLookup


def test_a_repeated_suffix_drafts_what_followed_it():
    lookup = PromptLookup([1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3], max_draft=3)
    assert lookup.draft() == [4, 5, 6]
    assert lookup.draft(limit=1) == [4]
    assert PromptLookup([1, 2, 3], max_draft=4).draft() == []


def test_the_longest_matching_ngram_wins():
    # (2, 3) last led to 9, but (1, 2, 3) led to 4.
    lookup = PromptLookup([1, 2, 3, 4, 8, 2, 3, 9, 5, 1, 2, 3], max_draft=2)
    assert lookup.draft() == [4, 8]


def test_a_renamed_token_resumes_after_the_token_it_replaced():
    # The original: 10 11 OLD 12 13 14 ... and the rewrite so far: 10 11 NEW.
    old, new = 50, 60
    original = [7, 10, 11, old, 12, 13, 14, 15]
    lookup = PromptLookup(original + [8, 7, 10, 11], max_draft=3)
    assert lookup.draft() == [old, 12, 13]  # exact: the copy goes on as the original did
    assert lookup.source == 3  # found by the 3-gram (7, 10, 11)
    lookup.append(new)
    assert lookup.draft() == [12, 13, 14]  # NEW replaced OLD: continue after it
    assert lookup.source == SUBSTITUTION
    lookup.append(12)
    assert lookup.draft() == [13, 14, 15]  # and the copy goes on


def test_nothing_to_copy_drafts_nothing():
    lookup = PromptLookup([1, 2, 3], max_draft=3)
    lookup.append(4)  # (2, 3) had no earlier occurrence: nothing to resume from
    assert lookup.draft() == []


def test_new_text_ends_the_copy():
    lookup = PromptLookup([7, 10, 11, 12, 13, 14, 15, 16, 8, 10, 11], max_draft=2)
    assert lookup.draft() == [12, 13]
    for token in (90, 91, 92):  # three tokens in a row that the copied text does not have
        lookup.append(token)
    assert lookup.draft() == []


def test_a_copy_that_reaches_the_present_repeats_its_period():
    # "# \n" lines a model writes in a run: (5, 6, 5) last led to 6, two tokens back; the draft
    # goes on as the repetition would, not just to the end of what exists.
    lookup = PromptLookup([1, 2, 5, 6, 5, 6, 5], max_draft=6)
    assert lookup.draft() == [6, 5, 6, 5, 6, 5]
    lookup = PromptLookup([9, 1, 2, 3, 1, 2, 3, 1, 2], max_draft=5)
    assert lookup.draft() == [3, 1, 2, 3, 1]


def test_draft_lengths_grow_while_confirmed_and_shrink_when_not():
    lengths = DraftLengths(max_draft=12)
    assert lengths.length(4, limit=100) == 6  # half the maximum to begin with
    lengths.record(4, 6, 6)
    assert lengths.length(4, limit=100) == 8
    assert lengths.length(4, limit=3) == 3  # never past what is left to generate
    lengths.record(4, 8, 5)
    assert lengths.length(4, limit=100) == 7
    assert lengths.length(2, limit=100) == 6  # each source keeps its own length


def test_a_source_whose_drafts_rarely_come_true_drafts_nothing():
    # A verify pass costs 1 + 0.2 k steps: tokens confirmed at a rate of 0.2 or less lose time.
    lengths = DraftLengths(max_draft=12, token_cost=0.2)
    for _ in range(4):
        lengths.record(SUBSTITUTION, 2, 0)
    assert lengths.rate(SUBSTITUTION) == 2 / 7  # the prior's 2 confirmed, 1 rejected, then 4 more
    assert lengths.length(SUBSTITUTION, limit=100) == 2  # 6, one fewer after each
    for _ in range(4):
        lengths.record(SUBSTITUTION, 1, 0)
    assert lengths.rate(SUBSTITUTION) <= 0.2
    assert lengths.length(SUBSTITUTION, limit=100) == 0
    assert lengths.length(4, limit=100) == 6  # other sources draft as before
