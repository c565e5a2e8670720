"""bench/gate_vs_keep.py pairs each promoted round's gate reward change with the held-out keep change
that followed it, from a learning-loop report; refused rounds pair with nothing."""

from __future__ import annotations

import pytest

from bench.gate_vs_keep import pairs

REPORT = {
    "held_out": [{"adapter": None, "keep_rate": 0.225}, {"adapter": "v0001", "keep_rate": 0.175},
                 {"adapter": "v0002", "keep_rate": 0.325}],
    "rounds": [
        {"round": 1, "train": {"state": "promoted", "adapter": "v0001",
                               "message": "promoted v0001: held-out reward 0.488 (was 0.352)"}},
        {"round": 2, "train": {"state": "promoted", "adapter": "v0002",
                               "message": "promoted v0002: held-out reward 0.391 (was 0.409)"}},
        {"round": 3, "train": {"state": "rejected", "adapter": None, "message":
                               "kept v0002; v0003 rejected: regression reward 0.309 < 0.396 - 0.02"}},
    ],
}


def test_each_promoted_round_pairs_its_gate_change_with_the_keep_change_after_it():
    found = pairs(REPORT)
    assert [r[0] for r in found] == [1, 2]
    assert found[0][1:3] == pytest.approx((0.136, -0.05)) and found[1][1:3] == pytest.approx((-0.018, 0.15))
    assert found[0][3] is None  # a gate that did not estimate what is kept
    assert pairs({"held_out": [], "rounds": REPORT["rounds"]}) == []


def test_a_gate_that_estimated_what_is_kept_pairs_that_gain_too():
    rounds = [dict(REPORT["rounds"][0], gate={"keep": {"gain": 0.12, "se": 0.04}}), *REPORT["rounds"][1:]]
    found = pairs({**REPORT, "rounds": rounds})
    assert found[0][3] == 0.12 and found[1][3] is None
