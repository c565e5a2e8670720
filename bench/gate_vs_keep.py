"""Does the promotion gate's held-out reward predict what the simulated user keeps? (issue 26 item 5)

Reads the learning-loop reports in bench/results (`bench/learning_loop.py`'s JSON, one run each) and,
for every promoted round, pairs the change of the gate's held-out reward (the reward of the new
adapter's answers on held-out episodes against the adapter it replaces, from the gate's message)
with the change of the held-out keep rate the loop measured afterwards (the user's real verdict on
files never trained on). Prints the pairs, Pearson's r and how often the two move the same way; and
the same for the gate's estimate of what the user keeps (`feedback.train.gate.keep_estimate`), in
rounds whose gate measured it (`gate.keep.gain`).

    python bench/gate_vs_keep.py [REPORT.json ...]
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_GATE = re.compile(r"held-out reward ([\d.]+) \(was ([\d.]+)\)")


def pairs(report: dict) -> list[tuple[int, float, float, float | None]]:
    """(round, gate reward change, held-out keep change, the gate's estimated keep gain or None) of
    each promoted round of one run."""
    keep = {entry.get("adapter"): entry.get("keep_rate") for entry in report.get("held_out") or []}
    before = keep.get(None)
    out = []
    for round_ in report.get("rounds") or []:
        train = round_.get("train") or {}
        found = _GATE.search(train.get("message", ""))
        after = keep.get(train.get("adapter"))
        if train.get("state") != "promoted" or not found or after is None or before is None:
            continue
        estimated = ((round_.get("gate") or {}).get("keep") or {}).get("gain")
        gate = float(found.group(1)) - float(found.group(2))
        out.append((round_["round"], gate, after - before, estimated))
        before = after
    return out


def main(paths: list[str]) -> int:
    rows = []
    for path in paths or sorted(glob.glob(str(RESULTS / "learning-loop-*.json"))):
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report.get("held_out"), list):  # one run (a matrix's own file holds "runs")
            rows += [(Path(path).name, *row) for row in pairs(report)]
    for name, round_, gate, keep, estimated in rows:
        also = "" if estimated is None else f", estimated keep {estimated:+.3f}"
        print(f"{name:60} round {round_}: gate reward {gate:+.3f}{also}, "
              f"held-out keep {100 * keep:+.1f} points")
    if len(rows) < 3:
        print("fewer than 3 promoted rounds: nothing to correlate")
        return 1
    print()
    _correlate("the gate's held-out reward", [(r[2], r[3]) for r in rows])
    _correlate("the gate's estimate of what is kept", [(r[4], r[3]) for r in rows if r[4] is not None])
    return 0


def _correlate(what: str, pairs_: list[tuple[float, float]]) -> None:
    if len(pairs_) < 3:
        print(f"{what}: {len(pairs_)} promoted rounds measured it, fewer than 3: nothing to correlate")
        return
    gates, keeps = [p[0] for p in pairs_], [p[1] for p in pairs_]
    r = statistics.correlation(gates, keeps) if len(set(gates)) > 1 and len(set(keeps)) > 1 else float("nan")
    moved = [(g, k) for g, k in zip(gates, keeps, strict=True) if k != 0]
    same = sum((g > 0) == (k > 0) for g, k in moved)
    print(f"{what}, {len(pairs_)} promoted rounds: Pearson r = {r:+.2f}; it and the held-out keep rate moved "
          f"the same way in {same} of {len(moved)} rounds whose keep rate changed")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
