"""bench/reward_agreement.py: pairs of one prompt's answers are counted the user's way or the other,
and an episode's spot is found again in the standard library's module."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.reward_agreement import agreement, stdlib_spot  # noqa: E402


def row(example: str, decision: str, reward: float, p: float | None = 0.5) -> dict:
    return {"example": example, "decision": decision, "reward": reward, "p_kept": p}


def test_pairs_judged_differently_are_counted_by_the_order_the_reward_gives_them():
    rows = [row("a", "keep", 0.8, 0.9), row("a", "modify", 0.5, 0.3), row("a", "revert", 0.6, 0.2),
            row("a", "none", 0.0, None), row("b", "keep", 0.1), row("b", "keep", 0.9)]
    summary = agreement(rows)
    # a: keep>modify, keep>revert, keep>none, modify>revert (reward says no), modify>none; revert ~ none
    # is no pair (the user judges them alike); b: two keeps are no pair either.
    assert summary["pairs"] == {"same_order": 4, "opposite": 1, "agreement": 0.8}
    assert summary["keep"] == {"answers": 3, "reward": 0.6, "p_kept": 0.633}
    assert summary["none"]["p_kept"] is None


def test_an_episodes_spot_is_the_named_function_followed_by_the_lines_the_server_saw():
    spot = stdlib_spot("file:///tmp/w/textwrap.py#dedent", ())
    assert spot is not None and spot.name == "dedent" and spot.path == "textwrap.py"
    following = tuple(spot.after.split("\n")[:3])
    assert stdlib_spot("file:///tmp/w/textwrap.py#dedent", following) == spot
    assert stdlib_spot("file:///tmp/w/textwrap.py#no_such_function", ()) is None
    assert stdlib_spot("file:///tmp/w/textwrap.py", ()) is None
