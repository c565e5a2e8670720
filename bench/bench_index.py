#!/usr/bin/env python
"""Repository index benchmark (issue 3), on a copy of the running interpreter's standard library.

Measures, in one run:
  1. full index wall time into a fresh database (in a fresh subprocess, median of --runs), next to
     `ctags -R` (universal-ctags) on the same tree, as a ratio;
  2. peak RSS (VmHWM) of the indexing process, and the largest parse worker's peak;
  3. incremental no-op re-index time (nothing changed);
  4. search latency p50/p95 per mode over the labelled queries (tests/data/stdlib_queries.json),
     several passes, and recall@5 / MRR@10 per mode;
  5. repo map render time for one focus file;
  6. watcher latency p50/p95: a file is saved --saves times; time from the write to the change
     being searchable, observed from IndexWatcher's after-commit callback.

The copy leaves out site-packages, the stdlib's own test suite, compiled modules and caches (the
same tree tests/unit/index/test_stdlib_recall.py indexes).

Usage: python bench/bench_index.py [--runs N] [--passes N] [--saves N] [--json] [--save FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench_foundation import loadavg, machine_info, median, percentile, proc_status_kb  # noqa: E402

from context.index.indexer import Indexer  # noqa: E402
from context.index.repomap import render_repo_map  # noqa: E402
from context.index.retrieval import MODES, search  # noqa: E402
from context.index.store import IndexStore  # noqa: E402
from context.index.watcher import IndexWatcher  # noqa: E402
from tests.unit.index.test_stdlib_recall import copy_stdlib, evaluate, load_queries  # noqa: E402

# The lexical modes; bench/bench_index_embed.py measures the semantic ranker.
MODES = tuple(m for m in MODES if m != "semantic")
WATCH_FILE = "bench_watch_target.py"
REPO_MAP_FOCUS = "json/decoder.py"


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the indexing child (a fresh interpreter per full pass, so VmHWM is the pass's own) -----------


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child_index(root: Path, db: Path, out: Path, noop_runs: int) -> None:
    started = time.perf_counter()
    store = IndexStore(db)
    report = Indexer([root], store).index_all()
    full_s = time.perf_counter() - started
    # CPU seconds of the pass, parse workers included: steadier than wall time on a shared machine.
    full_cpu_s = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)
    noop = []
    for _ in range(noop_runs):
        t0 = time.perf_counter()
        again = Indexer([root], store).index_all()
        noop.append(time.perf_counter() - t0)
        assert again.parsed == 0, again
    stats = store.stats()
    store.close()
    result = {
        "full_s": full_s,
        "full_cpu_s": full_cpu_s,
        "noop_s": noop,
        "report": {
            "files": report.files,
            "chunks": report.chunks,
            "symbols": report.symbols,
            "parsed": report.parsed,
            "skipped": dict(report.skipped),
        },
        "stats": stats,
        "status_kb": proc_status_kb(),
        # ru_maxrss of waited-for children: the largest parse worker's peak, in KiB on Linux.
        "children_maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "db_bytes": sum(p.stat().st_size for p in db.parent.glob(db.name + "*")),
    }
    out.write_text(json.dumps(result))


def run_index_child(root: Path, db: Path, noop_runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="squid-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child-index",
            str(root),
            str(db),
            str(out),
            str(noop_runs),
        ]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - started
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"index child failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    return result


def time_ctags(root: Path, tags: Path) -> tuple[float, float]:
    """Wall and CPU seconds of `ctags -R` over `root`."""
    cpu_before = _cpu_s(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["ctags", "-R", "-f", str(tags), str(root)], check=True, capture_output=True)
    return time.perf_counter() - started, _cpu_s(resource.RUSAGE_CHILDREN) - cpu_before


# --- measurements in this process -----------------------------------------------------------------


def search_latency(store: IndexStore, queries: list[dict], passes: int) -> dict:
    for q in queries:  # warm the page cache and SQLite's
        search(store, q["query"], 10)
    out = {}
    for mode in MODES:
        times = []
        for _ in range(passes):
            for q in queries:
                t0 = time.perf_counter()
                search(store, q["query"], 10, mode=mode)
                times.append((time.perf_counter() - t0) * 1000)
        out[mode] = {
            "p50_ms": percentile(times, 50),
            "p95_ms": percentile(times, 95),
            "max_ms": max(times),
            "n": len(times),
        }
    return out


def repo_map_time(store: IndexStore, runs: int = 3) -> dict:
    """The first call builds the reference graph; later calls reuse it until the index changes."""
    times, text = [], ""
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        text = render_repo_map(store, focus=REPO_MAP_FOCUS, token_budget=1024)
        times.append(time.perf_counter() - t0)
    return {
        "first_s": times[0],
        "median_s": median(times[1:]),
        "focus": REPO_MAP_FOCUS,
        "chars": len(text),
        "first_lines": text.splitlines()[:6],
    }


def watcher_latency(root: Path, store: IndexStore, saves: int) -> dict:
    """Save a file `saves` times; each time, how long until its new definition is searchable."""
    target = root / WATCH_FILE
    target.write_text("def bench_marker_start():\n    return 0\n", encoding="utf-8")
    indexer = Indexer([root], store)
    indexer.update_paths([target])
    searchable = threading.Event()
    wanted: list[str] = []

    def on_batch(_report) -> None:
        if wanted and store.symbols_named([wanted[0]], 1):
            searchable.set()

    watcher = IndexWatcher(indexer, on_batch=on_batch)
    latencies = []
    with watcher:
        time.sleep(0.5)  # let the observer's inotify watches settle
        for i in range(saves):
            marker = f"bench_marker_{i}_{time.monotonic_ns()}"
            searchable.clear()
            wanted[:] = [marker]
            t0 = time.perf_counter()
            target.write_text(f"def {marker}():\n    return {i}\n", encoding="utf-8")
            if not searchable.wait(10):
                raise RuntimeError(f"save {i} was not searchable within 10 s")
            latencies.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.2)
    target.unlink()
    return {
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "max_ms": max(latencies),
        "n": len(latencies),
        "debounce_s": watcher.debounce_s,
    }


# --- the run ----------------------------------------------------------------------------------------


def _quality(store: IndexStore, queries: list[dict]) -> dict:
    """recall@5 / MRR per mode, over all queries and per split (dev: tuned on; holdout: not)."""
    out = {}
    for mode in MODES:
        out[mode] = {"all": evaluate(store, queries, mode)}
        for split in ("dev", "holdout"):
            out[mode][split] = evaluate(store, [q for q in queries if q["split"] == split], mode)
    return out


def _index_phase(root: Path, work: Path, runs: int) -> tuple[dict, Path]:
    full, ctags, ctags_cpu = [], [], []
    db = work / "index-0.db"
    for i in range(runs):
        db = work / f"index-{i}.db"
        progress(f"full index {i + 1}/{runs} (fresh database, fresh process)")
        full.append(run_index_child(root, db, noop_runs=3 if i == 0 else 0))
        progress(f"ctags -R {i + 1}/{runs}")
        wall, cpu = time_ctags(root, work / f"tags-{i}")
        ctags.append(wall)
        ctags_cpu.append(cpu)
    full_s = median([r["full_s"] for r in full])
    first = full[0]
    return {
        "full_index_s": [r["full_s"] for r in full],
        "full_index_median_s": full_s,
        "ctags_s": ctags,
        "ctags_median_s": median(ctags),
        "ratio_index_to_ctags": full_s / median(ctags),
        "full_index_cpu_s": [r["full_cpu_s"] for r in full],
        "ctags_cpu_s": ctags_cpu,
        "ratio_cpu_index_to_ctags": median([r["full_cpu_s"] for r in full]) / median(ctags_cpu),
        "ctags_tags": sum(1 for line in (work / "tags-0").open(errors="replace") if not line.startswith("!")),
        "noop_reindex_s": first["noop_s"],
        "noop_reindex_median_s": median(first["noop_s"]),
        "peak_rss_mib": median([r["status_kb"]["VmHWM"] for r in full]) / 1024,
        "worker_peak_rss_mib": median([r["children_maxrss_kb"] for r in full]) / 1024,
        "report": first["report"],
        "stats": first["stats"],
        "db_mib": first["db_bytes"] / 2**20,
    }, db


def run_benchmark(runs: int, passes: int, saves: int) -> dict:
    report = {"machine": machine_info(), "load_before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="squid-bench-index-") as tmp:
        work = Path(tmp)
        root = copy_stdlib(work / "python3")
        report["tree"] = {
            "files": sum(1 for p in root.rglob("*") if p.is_file()),
            "py_files": sum(1 for _ in root.rglob("*.py")),
        }
        report["index"], db = _index_phase(root, work, runs)
        queries = load_queries()
        with IndexStore(db) as store:
            progress(f"search latency, {passes} passes x {len(queries)} queries x {len(MODES)} modes")
            report["search"] = search_latency(store, queries, passes)
            report["quality"] = _quality(store, queries)
            progress("repo map")
            report["repo_map"] = repo_map_time(store)
            progress(f"watcher latency, {saves} saves")
            report["watcher"] = watcher_latency(root, store, saves)
    report["load_after"] = loadavg()
    return report


def print_table(report: dict) -> None:
    m, ix, s, w = report["machine"], report["index"], report["search"], report["watcher"]
    print(f"{m['date']} | {m['nproc']} CPUs {m['cpu_model']} | Python {m['python']}")
    print(f"load before {report['load_before']}, after {report['load_after']}")
    print(
        f"tree: {report['tree']['files']} files ({report['tree']['py_files']} .py); index: {ix['stats']}; "
        f"skipped {ix['report']['skipped']}; database {ix['db_mib']:.1f} MiB"
    )
    rows = [
        ("Full index, fresh DB (median)", f"{ix['full_index_median_s']:.2f} s  {_fmt(ix['full_index_s'])}"),
        (
            "ctags -R (median)",
            f"{ix['ctags_median_s']:.2f} s  {_fmt(ix['ctags_s'])}; {ix['ctags_tags']} tags",
        ),
        ("Ratio index / ctags, wall", f"{ix['ratio_index_to_ctags']:.1f}x"),
        (
            "CPU: index (workers incl.) / ctags",
            f"{median(ix['full_index_cpu_s']):.2f} s / {median(ix['ctags_cpu_s']):.2f} s = "
            f"{ix['ratio_cpu_index_to_ctags']:.1f}x",
        ),
        ("No-op re-index (median of 3)", f"{ix['noop_reindex_median_s'] * 1000:.0f} ms"),
        ("Peak RSS, indexing process (VmHWM)", f"{ix['peak_rss_mib']:.0f} MiB"),
        ("Peak RSS, largest parse worker", f"{ix['worker_peak_rss_mib']:.0f} MiB"),
    ]
    for mode in MODES:
        rows.append(
            (
                f"Search {mode}: p50 / p95",
                f"{s[mode]['p50_ms']:.1f} / {s[mode]['p95_ms']:.1f} ms (n={s[mode]['n']})",
            )
        )
    for mode in MODES:
        q = report["quality"][mode]
        cells = [f"{q[split]['recall@5']:.3f} / {q[split]['mrr']:.3f}" for split in ("all", "dev", "holdout")]
        rows.append((f"Quality {mode}: recall@5 / MRR@10", "  ".join(cells) + "  (all / dev / holdout)"))
    rows.append(("Repo map, 1024 tokens, first call (builds the graph)",
                 f"{report['repo_map']['first_s'] * 1000:.0f} ms"))
    rows.append(("Repo map, 1024 tokens, later calls (median of 3)",
                 f"{report['repo_map']['median_s'] * 1000:.0f} ms"))
    rows.append(
        (
            "Watcher: write -> searchable p50 / p95",
            f"{w['p50_ms']:.0f} / {w['p95_ms']:.0f} ms "
            f"(n={w['n']}, debounce {w['debounce_s'] * 1000:.0f} ms)",
        )
    )
    for label, value in rows:
        print(f"  {label:42s} {value}")
    print("  fused misses at 5:", report["quality"]["fused"]["all"]["missed"])


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="full index / ctags runs (default 3)")
    parser.add_argument("--passes", type=int, default=5, help="passes over the queries (default 5)")
    parser.add_argument("--saves", type=int, default=20, help="watched saves (default 20)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--save", type=Path, metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--child-index", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_index:
        root, db, out, noop = args.child_index
        child_index(Path(root), Path(db), Path(out), int(noop))
        return 0
    if shutil.which("ctags") is None:
        parser.error("ctags not found: apt-get install -y universal-ctags")
    started = time.perf_counter()
    report = run_benchmark(args.runs, args.passes, args.saves)
    report["bench_wall_s"] = time.perf_counter() - started
    report["command"] = " ".join(["python", "bench/bench_index.py", *sys.argv[1:]])
    if args.save:
        args.save.write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
        print(f"\n(benchmark took {report['bench_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
