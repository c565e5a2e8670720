#!/usr/bin/env python
"""Repo map latency, side by side: this checkout's `render_repo_map` against a baseline revision's
(default: the implementation before per-focus caching and numpy PageRank), on one index of the
standard library copy that tests/unit/index/test_stdlib_recall.py uses.

For each implementation, in one process and on the same database: the first call (builds the graph),
later calls with the same focus (median), and calls with a new focus each time (the graph reused,
the ranking not). Prints the medians and their ratios, and whether both render the same map.

Usage: python bench/bench_index_repomap.py [--baseline REV] [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench_foundation import loadavg, machine_info, median  # noqa: E402

from context.index import repomap as current  # noqa: E402
from context.index.indexer import Indexer  # noqa: E402
from context.index.store import IndexStore  # noqa: E402
from tests.unit.index.test_stdlib_recall import copy_stdlib  # noqa: E402

FOCUS = "json/decoder.py"
OTHER_FOCUSES = ["urllib/parse.py", "argparse.py", "logging/__init__.py", "email/message.py",
                 "http/client.py", "asyncio/tasks.py", "zipfile.py", "csv.py"]


def load_baseline(rev: str):
    """The repomap module as it was at `rev`, imported under another name."""
    source = subprocess.run(["git", "show", f"{rev}:context/index/repomap.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="squid-repomap-")) / "repomap_baseline.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("context.index.repomap_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def timed(fn) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def measure(module, store: IndexStore, runs: int) -> dict:
    module._GRAPH_CACHE.clear()
    first_ms, text = timed(lambda: module.render_repo_map(store, focus=FOCUS, token_budget=1024))
    same = [timed(lambda: module.render_repo_map(store, focus=FOCUS, token_budget=1024))[0]
            for _ in range(runs)]
    other = [timed(lambda f=f: module.render_repo_map(store, focus=f, token_budget=1024))[0]
             for f in OTHER_FOCUSES[:max(runs, 1)]]
    named = [timed(lambda i=i: module.render_repo_map(store, focus=FOCUS, names=[f"name{i}", "JSONDecoder"],
                                                      token_budget=1024))[0] for i in range(runs)]
    return {"first_ms": first_ms, "same_focus_ms": median(same), "new_focus_ms": median(other),
            "new_names_ms": median(named), "text": text}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="ec6a5b7", help="git revision of the baseline repomap.py")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    baseline = load_baseline(args.baseline)
    report = {"machine": machine_info(), "load_before": loadavg(), "baseline": args.baseline}
    with tempfile.TemporaryDirectory(prefix="squid-bench-map-") as tmp:
        root = copy_stdlib(Path(tmp) / "python3")
        with IndexStore(Path(tmp) / "index.db") as store:
            Indexer([root], store).index_all()
            # Interleaved, twice each, so neither side gets the quieter minute.
            rounds = [("baseline", baseline), ("current", current)] * 2
            results: dict[str, list[dict]] = {"baseline": [], "current": []}
            for name, module in rounds:
                results[name].append(measure(module, store, args.runs))
    report["load_after"] = loadavg()
    for name, rows in results.items():
        report[name] = {k: median([r[k] for r in rows]) for k in rows[0] if k != "text"}
    report["same_output"] = results["baseline"][0]["text"] == results["current"][0]["text"]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['machine']['date']} | load before {report['load_before']}, after {report['load_after']}")
    print(f"{'repo map, 1024 tokens, focus ' + FOCUS:46s} {'baseline':>10s} {'current':>10s} {'ratio':>7s}")
    labels = [("first_ms", "first call (builds the graph)"), ("same_focus_ms", "same focus again"),
              ("new_focus_ms", "new focus (graph reused)"), ("new_names_ms", "new names (graph reused)")]
    for key, label in labels:
        b, c = report["baseline"][key], report["current"][key]
        print(f"  {label:44s} {b:8.1f}ms {c:8.1f}ms {b / c:6.1f}x")
    print(f"  same map text: {report['same_output']}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
