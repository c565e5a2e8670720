"""What containing the workspace's tests costs per test run (issue 25): the same command run
plainly and contained (`agent.contain`: bubblewrap, else unshare), alternated, medians and p95.

    python bench/bench_sandbox.py [--runs 30]

Two commands: `python -c pass` (the start-up cost alone) and a small pytest run (what the agent's
pre-test run and each candidate's test run are).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.contain import isolation  # noqa: E402
from agent.sandbox import run_command  # noqa: E402
from bench.bench_foundation import cpu_info  # noqa: E402

# The workload a contained test run times: one trivial test, so pytest's own start-up and the
# sandbox's are what is measured, not the test.
TEST = "def test_add():\n    assert 1 + 1 == 2\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    found = isolation()
    commands = {"python -c pass": ["python", "-c", "pass"],
                "pytest, one test": ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_add.py"]}
    out = {"isolation": found.kind, "detail": found.detail, "cpu": cpu_info(), "runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="squid-bench-sandbox-") as tmp:
        root = Path(tmp)
        (root / "test_add.py").write_text(TEST)
        for name, argv in commands.items():
            plain, contained = [], []
            env = {"PYTHONDONTWRITEBYTECODE": "1"}
            for _ in range(args.runs):
                plain.append(run_command(argv, root, timeout_s=60, env=env).seconds)
                contained.append(run_command(argv, root, timeout_s=60, env=env, contain=root).seconds)
            p50p, p50c = statistics.median(plain), statistics.median(contained)
            out[name] = {"plain_p50_s": round(p50p, 3), "contained_p50_s": round(p50c, 3),
                         "overhead_p50_s": round(p50c - p50p, 3),
                         "plain_p95_s": round(sorted(plain)[int(0.95 * (len(plain) - 1))], 3),
                         "contained_p95_s": round(sorted(contained)[int(0.95 * (len(contained) - 1))], 3),
                         "ratio": round(p50c / p50p, 2)}
            print(f"{name:18} plain p50 {p50p:.3f} s, contained p50 {p50c:.3f} s "
                  f"(+{p50c - p50p:.3f} s, {p50c / p50p:.2f}x)", flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
