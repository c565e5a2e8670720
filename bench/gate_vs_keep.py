"""Does the promotion gate's held-out reward predict what the simulated user keeps? (issue 26 item 5)

Reads the learning-loop reports in bench/results (`bench/learning_loop.py`'s JSON, one run each) and,
for every promoted round, pairs the change of the gate's held-out reward (the reward of the new
adapter's answers on held-out episodes against the adapter it replaces, from the gate's message)
with the change of the held-out keep rate the loop measured afterwards (the user's real verdict on
files never trained on). Prints the pairs, Pearson's r and how often the two move the same way.

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


def pairs(report: dict) -> list[tuple[int, float, float]]:
    """(round, gate reward change, held-out keep change) of each promoted round of one run."""
    keep = {entry.get("adapter"): entry.get("keep_rate") for entry in report.get("held_out") or []}
    before = keep.get(None)
    out = []
    for round_ in report.get("rounds") or []:
        train = round_.get("train") or {}
        found = _GATE.search(train.get("message", ""))
        after = keep.get(train.get("adapter"))
        if train.get("state") != "promoted" or not found or after is None or before is None:
            continue
        out.append((round_["round"], float(found.group(1)) - float(found.group(2)), after - before))
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
    for name, round_, gate, keep in rows:
        print(f"{name:60} round {round_}: gate reward {gate:+.3f}, held-out keep {100 * keep:+.1f} points")
    if len(rows) < 3:
        print("fewer than 3 promoted rounds: nothing to correlate")
        return 1
    gates, keeps = [r[2] for r in rows], [r[3] for r in rows]
    r = statistics.correlation(gates, keeps)
    moved = [(g, k) for g, k in zip(gates, keeps, strict=True) if k != 0]
    same = sum((g > 0) == (k > 0) for g, k in moved)
    print(f"\n{len(rows)} promoted rounds: Pearson r = {r:+.2f}; the two moved the same way in {same} of "
          f"{len(moved)} rounds whose keep rate changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
