"""The next-edit benchmark's delta-chrF (bench/bench_next_edit.py): the measure Zed reports for edit
prediction, on small hand-checked changes."""

from __future__ import annotations

import pytest

from bench.bench_next_edit import delta_chrf

ORIGINAL = "total = price * count\nreturn total\n"
EXPECTED = "subtotal = price * count\nreturn total\n"


def test_the_same_change_scores_100_and_no_change_0():
    assert delta_chrf(ORIGINAL, EXPECTED, EXPECTED) == 100.0
    assert delta_chrf(ORIGINAL, EXPECTED, ORIGINAL) == 0.0
    assert delta_chrf(ORIGINAL, ORIGINAL, ORIGINAL) == 100.0  # nothing to do, nothing done


def test_a_near_change_scores_between_and_the_undo_direction_does_not_match():
    # Character n-grams do not know where a change is: the same word changed on the next line
    # scores high, a near spelling lower (fewer of its n-grams are the ones the hunk adds).
    near = delta_chrf(ORIGINAL, EXPECTED, "sub_total = price * count\nreturn total\n")
    elsewhere = delta_chrf(ORIGINAL, EXPECTED, "total = price * count\nreturn subtotal\n")
    assert 25.0 < near < elsewhere < 100.0
    # Removing what the expected change adds is not half right: added and removed never match.
    removal = delta_chrf(EXPECTED, ORIGINAL, ORIGINAL.replace("total =", "subsubtotal ="))
    assert removal == pytest.approx(0.0)


def test_whitespace_is_ignored():
    assert delta_chrf(ORIGINAL, EXPECTED, "subtotal  =  price * count\nreturn total\n") == 100.0
