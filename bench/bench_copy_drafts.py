#!/usr/bin/env python
"""The agent's edit fallback with and without prompt-lookup drafts, side by side.

When the local model's answer does not parse, the agent answers the same turn again as an edit of
the file (`agent.loop`'s edit fallback) and decodes the search text as a copy of the file
(`agent.copy_search`). The copy is what prompt lookup drafts best (the file is in the prompt), yet
a constrained generation used to run without drafts. Now a draft is kept as far as the
constraint's masked argmax picks it, so the text is the same; this measures what that saves.

Requests: functions of a package installed in this venv (`click` by default), drawn with a fixed
seed, each asked as "Fix the bug in `f`" through the agent's own first conversation (instructions,
tools, the file's window; no test run), opened as the fallback opens it. At each function the two
settings take turns (`--rounds` each, the order alternating); the prompt stays cached, so the
timings are the step's decoding. Reported: decode tokens per second of each, their ratio (median
over functions), drafted and accepted tokens, and how many answers were identical.

    python bench/bench_copy_drafts.py [--package click] [--functions 8] [--rounds 3] [--seed 0]
        [--threads 2] [--max-tokens N] [--json FILE]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import bench_completion as bc  # noqa: E402
from bench.bench_foundation import cpu_info, loadavg  # noqa: E402


def functions(files: dict[str, str], count: int, seed: int) -> list[tuple[str, str, tuple[int, int]]]:
    """(path, function name, its line span) of `count` functions of 4-30 lines, drawn with `seed`."""
    found = []
    for path, text in files.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 4 <= (node.end_lineno or 0) - node.lineno <= 30:
                found.append((path, node.name, (node.lineno, node.end_lineno)))
    random.Random(seed).shuffle(found)
    return found[:count]


def measure(args) -> dict:
    from agent.backends import LocalBackend
    from agent.loop import AgentLoop, AgentRequest
    from agent.sandbox import Workspace
    from context.config import AgentConfig, ModelConfig
    from context.runtime import get_runtime

    runtime = get_runtime(ModelConfig(threads=args.threads))
    tuned = runtime.settings.draft_tokens
    drafts = args.draft_tokens or tuned or 10
    config = AgentConfig(memory=False, pretest=False)
    backend = LocalBackend(runtime)
    rows = []
    with tempfile.TemporaryDirectory(prefix="squid-bench-copy-") as tmp:
        workspace = Path(tmp)
        files = bc.copy_package(args.package, workspace)
        loop = AgentLoop(backend, Workspace([workspace]), config)
        for path, name, span in functions(files, args.functions, args.seed):
            conversation = loop.first_conversation(
                AgentRequest(f"Fix the bug in `{name}` in {path}.", workspace / path, line_range=span))
            conversation.prefill = f"edit {path}\n<<<<<<< SEARCH\n"  # as `AgentLoop._open_edit` opens it
            conversation.copy_from = files[path]
            runs = {0: [], drafts: []}
            for turn in range(2 * args.rounds):
                setting = (0, drafts)[(turn + args.rounds * len(rows)) % 2]
                runtime.config = dataclasses.replace(runtime.config, draft_tokens=setting)
                (sample,) = backend.sample(conversation, 1, temperature=0.0,
                                           max_tokens=args.max_tokens or config.max_step_tokens)
                result = backend.last_results[0]
                runs[setting].append({"text": sample.text, "tokens": result.new_tokens,
                                      "decode_s": result.decode_s, "drafted": result.drafted_tokens,
                                      "accepted": result.accepted_tokens})
            speed = {setting: statistics.median(r["tokens"] / r["decode_s"] for r in done)
                     for setting, done in runs.items()}
            row = {"path": path, "function": name, "tokens": runs[drafts][0]["tokens"],
                   "plain_tok_s": round(speed[0], 1), "drafted_tok_s": round(speed[drafts], 1),
                   "ratio": round(speed[drafts] / speed[0], 2),
                   "drafted": runs[drafts][0]["drafted"], "accepted": runs[drafts][0]["accepted"],
                   "identical": len({r["text"] for done in runs.values() for r in done}) == 1}
            rows.append(row)
            print(f"{path}:{name}: {row['tokens']} tokens, {row['plain_tok_s']} -> "
                  f"{row['drafted_tok_s']} tok/s ({row['ratio']}x), accepted {row['accepted']}/"
                  f"{row['drafted']}, identical {row['identical']}", flush=True)
    return {
        "package": args.package, "functions": len(rows), "rounds": args.rounds, "seed": args.seed,
        "draft_tokens": drafts, "tuned_draft_tokens": tuned, "threads": args.threads,
        "median_ratio": round(statistics.median(r["ratio"] for r in rows), 2) if rows else None,
        "ratios": sorted(r["ratio"] for r in rows),
        "identical": sum(r["identical"] for r in rows),
        "cpu": cpu_info(), "loadavg": loadavg(), "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="click")
    parser.add_argument("--functions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting at each function")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-tokens", type=int, default=0, help="drafts when on (default: as tuned)")
    parser.add_argument("--max-tokens", type=int, default=0, help="a step's tokens (default: the agent's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = measure(args)
    print(f"\n{report['functions']} functions of {args.package}: drafts ({report['draft_tokens']} tokens) "
          f"against none, decode speed ratio median {report['median_ratio']}x "
          f"(range {report['ratios'][:1]}..{report['ratios'][-1:]}), identical answers "
          f"{report['identical']}/{report['functions']}; load {report['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
