"""The typing benchmark's pure parts (`bench/bench_preencode_typing.py`): the gaps a user leaves
between keystrokes, and what a mode's sites add up to. No model."""

from __future__ import annotations

from bench.bench_preencode_typing import gaps, summarise


def test_gaps_are_the_same_for_a_seed_and_mix_typing_with_pauses():
    drawn = gaps(3, 400, 0.2)
    assert drawn == gaps(3, 400, 0.2) and drawn != gaps(4, 400, 0.2)
    typing = [g for g in drawn if g <= 0.35]
    pauses = [g for g in drawn if g >= 0.8]
    assert len(typing) + len(pauses) == 400 and all(0.15 <= g for g in typing) and max(pauses) <= 2.0
    assert 0.12 < len(pauses) / 400 < 0.28
    assert all(g <= 0.35 for g in gaps(3, 50, 0.0))


def _row(keystroke: int, at: float, latency: float, tokens: int) -> dict:
    return {"keystroke": keystroke, "at_s": at, "latency_s": latency, "reference_tokens": tokens,
            "references": 1 if tokens else 0}


def test_summarise_counts_when_references_first_reached_each_site():
    sites = [
        {"rows": [_row(1, 0.0, 0.4, 0), _row(2, 0.8, 0.5, 0), _row(3, 1.6, 0.9, 300)],
         "encoded": 2, "resumed_tokens": 96, "thrown_away": 0},
        {"rows": [_row(1, 0.0, 0.3, 0), _row(2, 0.7, 0.4, 0), _row(3, 1.2, 0.4, 0)],
         "encoded": 0, "resumed_tokens": 0, "thrown_away": 448},
        {"rows": [_row(1, 0.0, 0.4, 0), _row(2, 0.6, 0.6, 120), _row(3, 1.1, 0.4, 120)],
         "encoded": 1, "resumed_tokens": 32, "thrown_away": 64},
    ]
    got = summarise(sites)
    assert got["keystrokes"] == 9 and got["with_references"] == 3 and got["sites_reached"] == 2
    assert got["first_referenced_keystroke_median"] == 2.5 and got["first_referenced_s_median"] == 1.1
    assert got["latency_p50_s"] == 0.4 and got["reference_tokens_median"] == 0
    assert (got["documents_encoded"], got["tokens_resumed"], got["tokens_thrown_away"]) == (3, 128, 512)
