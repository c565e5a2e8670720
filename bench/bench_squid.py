"""Squid attention benchmark (issue 4): `squidcode bench squid` with its figures saved as JSON.

    python bench/bench_squid.py --docs 8 --doc-tokens 512 --queries 20 --curve 1,2,4,8,16 \
        --save bench/results/squid-DATE.json

Every option of `squidcode bench squid` is accepted; the result (plus the date and the load average
before and after) is printed and, with --save, written to a file. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lsp_server.cli_squid import add_bench_parser  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", type=Path, help="write the result JSON here")
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    own, rest = parser.parse_known_args()
    args = parser.parse_args(["bench", "squid", *rest])
    import torch

    from context.config import load_file_config
    from context.runtime import get_runtime
    from context.squid.bench import BenchSettings, run_bench
    from context.squid.service import recovery_from_config

    torch.set_num_threads(max(1, args.threads))
    config, _ = load_file_config([])
    runtime = get_runtime(config.model, config.resolved_cache_dir())
    before = os.getloadavg()[0]
    result = run_bench(runtime, BenchSettings(
        docs=args.docs, doc_tokens=args.doc_tokens, queries=args.queries, runs=args.runs, curve=args.curve,
        curve_runs=args.curve_runs, default=recovery_from_config(config.squid)))
    result["machine"] = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
                         "load_before": before, "load_after": os.getloadavg()[0], "threads": args.threads,
                         "cpus": os.cpu_count()}
    text = json.dumps(result, indent=1)
    print(text)
    if own.save:
        own.save.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
