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
    assert [r for r, _, _ in found] == [1, 2]
    assert found[0][1:] == pytest.approx((0.136, -0.05)) and found[1][1:] == pytest.approx((-0.018, 0.15))
    assert pairs({"held_out": [], "rounds": REPORT["rounds"]}) == []
