"""Connections ended at random moments: does `squidcode serve` always exit cleanly?

Each connection starts a fresh server on a fresh copy of the standard library's `email` package
(Squid and the index on), brings it to a moment drawn at random (the model load, the first index
pass, a completion, the pre-encoding of references, idle) and ends it after a random delay: with
`shutdown` + `exit`, with `exit` alone, or by closing the pipe as a client that dies would. A clean
end is the exit code LSP asks for and no failure line in stderr (tests/e2e/connection_ends.py).

    python bench/bench_shutdown.py --connections 200 --seed 0 --jobs 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from context.progress import progress  # noqa: E402
from tests.e2e.connection_ends import Outcome, random_ends, run_connection  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarise(outcomes: list[Outcome]) -> dict:
    abnormal = [o for o in outcomes if o.exit_code is None or o.exit_code < 0]
    unclean = [o for o in outcomes if not o.clean]
    exits = [o.exit_s for o in outcomes]
    by = Counter((o.end.moment, o.end.ending) for o in outcomes)
    return {
        "connections": len(outcomes),
        "clean": len(outcomes) - len(unclean),
        "abnormal_exits": len(abnormal),  # killed by a signal, or never exited
        "wrong_code_or_failure_lines": len(unclean) - len(abnormal),
        "exit_s_p50": round(statistics.median(exits), 2) if exits else None,
        "exit_s_p95": round(_percentile(exits, 0.95), 2),
        "exit_s_max": round(max(exits), 2) if exits else None,
        "by_moment_and_ending": {f"{m}/{e}": n for (m, e), n in sorted(by.items())},
        "unclean": [{"end": asdict(o.end), "exit_code": o.exit_code, "failures": o.failures[:5]}
                    for o in unclean],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="servers running at once")
    parser.add_argument("--max-delay", type=float, default=4.0, help="longest delay after a moment (s)")
    parser.add_argument("--json", type=Path, help="write the summary and every outcome here")
    args = parser.parse_args(argv)

    ends = random_ends(args.connections, args.seed, args.max_delay)
    root = Path(tempfile.mkdtemp(prefix="squidcode-bench-shutdown-"))
    started = time.monotonic()
    outcomes: list[Outcome] = []
    with progress(len(ends), "connections", unit="conn") as shown, ThreadPoolExecutor(args.jobs) as pool:
        for outcome in pool.map(lambda ie: run_connection(ie[1], root / f"c{ie[0]:04d}"), enumerate(ends)):
            outcomes.append(outcome)
            shown.update(1, unclean=sum(not o.clean for o in outcomes))
    summary = summarise(outcomes)
    summary.update(seed=args.seed, jobs=args.jobs, seconds=round(time.monotonic() - started, 1))
    print(json.dumps({k: v for k, v in summary.items() if k != "unclean"}, indent=2))
    for bad in summary["unclean"]:
        print("UNCLEAN", json.dumps(bad))
    if args.json:
        args.json.write_text(json.dumps(
            summary | {"outcomes": [asdict(o.end) | {"exit_code": o.exit_code, "exit_s": o.exit_s}
                                    for o in outcomes]}, indent=1))
    return 0 if summary["clean"] == summary["connections"] else 1


if __name__ == "__main__":
    sys.exit(main())
