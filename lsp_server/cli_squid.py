"""`squidcode bench squid`: Squid attention's speed and quality against full prefill, side by side."""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["add_bench_parser", "run_bench_command"]


def _curve(value: str) -> tuple[int, ...]:
    try:
        points = tuple(int(v) for v in value.split(",") if v)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4,8,16, got {value!r}") from exc
    if not points or min(points) < 1:
        raise argparse.ArgumentTypeError("curve points count documents: 1 or more")
    return points


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (squid: composed KV caches against full prefill)")
    kinds = bench.add_subparsers(dest="bench", required=True)
    squid = kinds.add_parser("squid", help="time to first token, swap cost, quality and tier bandwidth")
    squid.add_argument("--docs", type=int, default=8, help="documents per request (default 8)")
    squid.add_argument("--doc-tokens", type=int, default=512, help="tokens per document (default 512)")
    squid.add_argument("--queries", type=int, default=20, help="queries for the quality figures (default 20)")
    squid.add_argument("--runs", type=int, default=3, help="timing runs per figure, median (default 3)")
    squid.add_argument("--curve", type=_curve, default=(), metavar="N,N,...",
                       help="also measure time to first token for these document counts")
    squid.add_argument("--curve-runs", type=int, default=1, help="timing runs per curve point (default 1)")
    squid.add_argument("--threads", type=int, default=1,
                       help="torch CPU threads (default 1: steadiest on a shared machine)")
    squid.add_argument("--source", metavar="DIR",
                       help="documents and queries from the Python files under DIR (a package) instead of "
                            "the standard library")
    squid.add_argument("--seed", type=int, default=0, help="which documents and queries (default 0)")
    squid.add_argument("--reader", metavar="DIR",
                       help="also measure these compositions read by a Squid reader adapter "
                            "(squidcode train reader)")
    squid.add_argument("--reader-only", action="store_true",
                       help="with --reader: only the compositions the reader reads (squid, squid_first16, "
                            "squid_first32), with and without it")
    squid.add_argument("--json", action="store_true", help="print one JSON object")


def _print_table(result: dict) -> None:
    print(f"{result['docs']} documents x {result['doc_tokens']} tokens, {result['queries']} queries")
    print(f"{'variant':<24}{'ttft s':>9}{'speedup':>9}{'top-1':>8}{'KL':>8}{'recomp':>8}")
    for v in result["variants"]:
        print(f"{v['name']:<24}{v['ttft_s']:>9.3f}{v['speedup_vs_full']:>8.1f}x{v['top1_agreement']:>8.3f}"
              f"{v['mean_kl']:>8.3f}{v['recomputed_fraction']:>8.3f}")
    swap = result["swap"]
    print(f"swap the middle document: squid {swap['squid_s']:.3f}s (re-rotation only "
          f"{swap['plain_squid_s']:.3f}s), prefix cache {swap['prefix_cache_s']:.3f}s, "
          f"one encode {swap['encode_one_s']:.3f}s")
    tiers = result["tiers"]
    print(f"disk tier load {tiers['disk_load_MBps']:.0f} MB/s (plain file copy "
          f"{tiers['plain_file_copy_MBps']:.0f} MB/s); CPU -> device {tiers['cpu_to_device_MBps']:.0f} MB/s")
    for point in result.get("curve", []):
        print(f"N={point['n']:>2}: full {point['full_s']:.3f}s, prefix cache {point['prefix_cache_s']:.3f}s, "
              f"squid {point['squid_s']:.3f}s, squid default {point['squid_default_s']:.3f}s, "
              f"swap {point['swap']['squid_s']:.3f}s vs {point['swap']['prefix_cache_s']:.3f}s")


def run_bench_command(args) -> int:
    from context.config import load_file_config
    from context.errors import SquidcodeError
    from context.runtime import get_runtime
    from context.squid.bench import BenchSettings, run_bench
    from context.squid.service import recovery_from_config

    if args.reader_only and not args.reader:
        print("squidcode: --reader-only needs --reader DIR", file=sys.stderr)
        return 2
    if args.docs < 1 or args.doc_tokens < 8 or args.queries < 1 or args.runs < 1:
        print("squidcode: --docs, --queries and --runs must be >= 1, --doc-tokens >= 8", file=sys.stderr)
        return 2
    config, problems = load_file_config([])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    import torch

    torch.set_num_threads(max(1, args.threads))
    try:
        runtime = get_runtime(config.model, config.resolved_cache_dir())
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    settings = BenchSettings(docs=args.docs, doc_tokens=args.doc_tokens, queries=args.queries, runs=args.runs,
                             curve=args.curve, curve_runs=max(1, args.curve_runs),
                             default=recovery_from_config(config.squid), seed=args.seed,
                             source=args.source, reader=args.reader, reader_only=args.reader_only)
    load = os.getloadavg()[0]
    try:
        result = run_bench(runtime, settings)
    except (RuntimeError, SquidcodeError) as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    print(f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0
