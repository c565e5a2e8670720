"""The team collector under load (issue 27): N concurrent uploaders, each sending its episodes in
batches of 100 to one `squidcode collector serve` process, as members' servers do.

    python bench/bench_collector.py [--uploaders 20] [--episodes 1000] [--db postgresql://...]

Per batch: the request's wall time (p50/p95/max over every batch of every uploader); then what
the store holds (every episode, none twice). The collector's SQLite file by default; a
PostgreSQL URL to measure that store instead. Each batch's JSON body is encoded before the clock
starts: the uploaders share these cores with the collector (and the database server), and members
encode their batches on their own machines, so only the sending is load here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import cpu_info  # noqa: E402
from feedback.redact import RULES_VERSION  # noqa: E402
from tests.unit.feedback.test_upload import TOKEN, Collector, free_port  # noqa: E402


def upload(url: str, uploader: int, episodes: int, times: list[float], lock: threading.Lock) -> None:
    rows = [{"id": f"u{uploader}-e{i}", "table": "episodes",
             "row": {"id": f"u{uploader}-e{i}", "kind": "completion", "ts": float(i), "output": "x" * 200}}
            for i in range(episodes)]
    # As the uploader sends them: naming the redaction rules its rows were redacted under.
    bodies = [json.dumps({"events": rows[start : start + 100], "redaction_rules": RULES_VERSION}).encode()
              for start in range(0, episodes, 100)]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as client:
        for body in bodies:
            began = time.perf_counter()
            answer = client.post(f"{url}/v1/events", content=body, headers=headers)
            answer.raise_for_status()
            with lock:
                times.append(time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploaders", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--db", default=None, help="a postgresql:// URL (default: a SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="squid-bench-collector-") as tmp:
        collector = Collector(Path(tmp), free_port(), db=args.db).start()
        times: list[float] = []
        lock = threading.Lock()
        try:
            threads = [threading.Thread(target=upload, args=(collector.url, n, args.episodes, times, lock))
                       for n in range(args.uploaders)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - began
            stored = collector.stats()["events"]
        finally:
            collector.stop()
    ordered = sorted(times)
    result = {
        "cpu": cpu_info(), "store": "postgresql" if args.db else "sqlite", "uploaders": args.uploaders,
        "episodes_each": args.episodes, "batches": len(times), "wall_s": round(wall, 2),
        "batch_p50_ms": round(1000 * statistics.median(ordered), 1),
        "batch_p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1),
        "batch_max_ms": round(1000 * ordered[-1], 1),
        "stored": stored, "expected": args.uploaders * args.episodes,
    }
    print(json.dumps(result, indent=1))
    return 0 if stored == result["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
