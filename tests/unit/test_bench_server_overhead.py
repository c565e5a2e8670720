"""The server-overhead benchmark's summary (`bench/bench_server_overhead.py`): per-position medians
of the two sides, then their difference's median. No model, no server."""

from __future__ import annotations

import pytest

from bench.bench_server_overhead import summarise


def _rows(key: str, server: list[float], local: list[float]) -> list[dict]:
    return ([{"position": key, "side": "server", "latency_s": v} for v in server]
            + [{"position": key, "side": "in_process", "latency_s": v} for v in local])


def test_the_difference_is_taken_position_by_position():
    # A slow position on both sides must not make the server look slow: 0.01 s at each position.
    rows = (_rows("a", [0.31, 0.30, 0.90], [0.29, 0.30, 0.30])
            + _rows("b", [0.61, 0.60, 0.62], [0.60, 0.59, 0.61]))
    got = summarise(rows)
    assert got["positions"] == 2 and got["requests_per_side"] == 6
    assert got["server_minus_in_process_s"] == pytest.approx(0.01)
    assert got["server_p50_s"] == pytest.approx(0.605) and got["in_process_p50_s"] == pytest.approx(0.445)


def test_a_position_one_side_never_answered_is_left_out():
    rows = _rows("a", [0.4], [0.3]) + _rows("b", [0.5], [])
    got = summarise(rows)
    assert got["positions"] == 1 and got["server_minus_in_process_s"] == pytest.approx(0.1)
