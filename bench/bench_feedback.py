#!/usr/bin/env python
"""Feedback recording overhead (issue 7).

1. didChange path: one document with 50 tracked regions; each incremental change (a keystroke at a
   random line: before, inside and after regions) goes through what the server's hook does
   (`to_text_changes` of a real lsprotocol params object, then `FeedbackRecorder.on_did_change`).
   Side by side, pygls applying the same change to its own TextDocument (the work the server does
   anyway), so the overhead shows as a ratio. Target: p95 < 1 ms.
2. Burst: 10,000 completion episodes recorded back to back from the editor's thread (10,000
   `shown` events + 10,000 episodes + supersede events), with didChange calls interleaved. Reports
   the slowest caller-side call (the editor path never waits for the disk), the time until
   everything is committed, and checks that every event is in the database.

The slowest calls of a burst are the process's full garbage collections (they traverse every
object, start-up imports included), not waits on the writer; `--gc-freeze` shows the difference.

Usage: python bench/bench_feedback.py [--changes N] [--burst N] [--runs N] [--json] [--gc-freeze]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lsprotocol import types  # noqa: E402
from pygls.workspace import TextDocument  # noqa: E402

from context.config import FeedbackConfig  # noqa: E402
from feedback.recorder import FeedbackRecorder  # noqa: E402
from feedback.store import FeedbackStore  # noqa: E402
from lsp_server.features.edit_tracking import to_text_changes  # noqa: E402

URI = "file:///bench/module.py"
REGIONS = 50


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def document(lines: int = 2000) -> str:
    return "".join(f"    value_{i} = compute(value_{i - 1}, {i})  # line {i}\n" for i in range(lines))


def did_change_run(changes: int, seed: int) -> dict:
    rng = random.Random(seed)
    text = document()
    tmp = tempfile.mkdtemp()
    recorder = FeedbackRecorder(FeedbackConfig(checkpoints_s=(3600.0,)), db_path=Path(tmp) / "f.db")
    pygls_doc = TextDocument(URI, text, version=1)
    for i in range(REGIONS):
        line = 20 + i * 38
        recorder.tracker.track(f"ep{i}", URI, (line, 4), (line + 2, 10), "x", "", text)
    hook, baseline = [], []
    for version in range(2, changes + 2):
        line = rng.randrange(0, 1990)
        col = rng.randrange(0, 30)
        insert = rng.choice(["a", "b", "\n", "", "xy"])
        end = (line, col + 1) if insert == "" else (line, col)
        change = types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line, col), end=types.Position(*end)), text=insert
        )
        params = types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=version),
            content_changes=[change],
        )
        started = time.perf_counter()
        pygls_doc.apply_change(change)
        after = pygls_doc.source
        baseline.append(time.perf_counter() - started)
        started = time.perf_counter()
        recorder.on_did_change(URI, to_text_changes(params), after)
        hook.append(time.perf_counter() - started)
    assert len(recorder.tracker.tracked(URI)) == REGIONS
    recorder.close()
    return {
        "hook_p50_ms": statistics.median(hook) * 1e3,
        "hook_p95_ms": percentile(hook, 0.95) * 1e3,
        "hook_p99_ms": percentile(hook, 0.99) * 1e3,
        "hook_max_ms": max(hook) * 1e3,
        "pygls_apply_p50_ms": statistics.median(baseline) * 1e3,
        "pygls_apply_p95_ms": percentile(baseline, 0.95) * 1e3,
    }


def burst_run(events: int) -> dict:
    tmp = tempfile.mkdtemp()
    recorder = FeedbackRecorder(FeedbackConfig(dismiss_after_s=3600.0), db_path=Path(tmp) / "f.db")
    text = document(200)
    recorder.tracker.track("ep", URI, (10, 0), (12, 0), "x", "", text)
    calls, changes, noise = [], [], []
    for _ in range(events):  # the same loop shape without recording: what the machine's load costs
        t0 = time.perf_counter()
        _ = [f"file:///bench/f{j}.py" for j in range(3)]
        noise.append(time.perf_counter() - t0)
    started = time.perf_counter()
    for i in range(events):
        t0 = time.perf_counter()
        recorder.record_completion_episode(
            uri=f"file:///bench/f{i % 500}.py",
            position=(i % 80, 4),
            output=f"return value_{i}",
            prompt_text="def f():\n" * 40,
            model_id="bench",
        )
        calls.append(time.perf_counter() - t0)
        if i % 10 == 0:
            t0 = time.perf_counter()
            recorder.on_did_change(
                URI,
                [
                    to_text_changes(
                        types.DidChangeTextDocumentParams(
                            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=i + 2),
                            content_changes=[
                                types.TextDocumentContentChangePartial(
                                    range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)),
                                    text="",
                                )
                            ],
                        )
                    )[0]
                ],
                text,
            )
            changes.append(time.perf_counter() - t0)
    submitted = time.perf_counter() - started
    assert recorder.flush(timeout=300)
    committed = time.perf_counter() - started
    recorder.close()
    store = FeedbackStore(Path(tmp) / "f.db")
    shown = store.db.execute("SELECT COUNT(*) FROM events WHERE kind = 'shown'").fetchone()[0]
    episodes = store.count("episodes")
    integrity = store.db.execute("PRAGMA integrity_check").fetchone()[0]
    return {
        "events": events,
        "shown_events_stored": shown,
        "episodes_stored": episodes,
        "rows_stored": store.count("events") + episodes,
        "lost": events - shown,
        "integrity": integrity,
        "submit_s": submitted,
        "commit_s": committed,
        "call_p50_us": statistics.median(calls) * 1e6,
        "call_p99_us": percentile(calls, 0.99) * 1e6,
        "call_max_ms": max(calls) * 1e3,
        "calls_over_5ms": sum(c > 0.005 for c in calls),
        "noise_max_ms": max(noise) * 1e3,
        "noise_over_5ms": sum(c > 0.005 for c in noise),
        "did_change_during_burst_p95_ms": percentile(changes, 0.95) * 1e3,
        "did_change_during_burst_max_ms": max(changes) * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=5000)
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after the imports, as a server could after start-up: full "
                             "collections then skip the start-up heap")
    args = parser.parse_args()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    load_before = os.getloadavg()
    did_change = [did_change_run(args.changes, seed) for seed in range(args.runs)]
    burst = [burst_run(args.burst) for _ in range(args.runs)]
    median = {key: statistics.median(run[key] for run in did_change) for key in did_change[0]}
    result = {
        "machine": f"{os.cpu_count()} cores",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "did_change_median_of_runs": median,
        "hook_over_pygls_apply_p50": median["hook_p50_ms"] / median["pygls_apply_p50_ms"],
        "burst_runs": burst,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"load average before {load_before}, after {result['load_after']}; commit {result['commit']}")
    m, r = median, result
    print(
        f"didChange hook with {REGIONS} regions ({args.changes} changes, median of {args.runs} runs): "
        f"p50 {m['hook_p50_ms']:.3f} ms, p95 {m['hook_p95_ms']:.3f} ms, "
        f"p99 {m['hook_p99_ms']:.3f} ms, max {m['hook_max_ms']:.2f} ms; "
        f"pygls apply p50 {m['pygls_apply_p50_ms']:.3f} ms "
        f"(hook/pygls {r['hook_over_pygls_apply_p50']:.2f})"
    )
    for b in burst:
        print(
            f"burst of {b['events']}: stored {b['shown_events_stored']} shown events (lost {b['lost']}), "
            f"{b['rows_stored']} rows, integrity {b['integrity']}; submitted in {b['submit_s']:.2f} s, "
            f"committed after {b['commit_s']:.2f} s; call p50 {b['call_p50_us']:.0f} us, "
            f"p99 {b['call_p99_us']:.0f} us, max {b['call_max_ms']:.2f} ms "
            f"({b['calls_over_5ms']} over 5 ms; idle loop max {b['noise_max_ms']:.2f} ms, "
            f"{b['noise_over_5ms']} over 5 ms); didChange during burst "
            f"p95 {b['did_change_during_burst_p95_ms']:.3f} ms, "
            f"max {b['did_change_during_burst_max_ms']:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
