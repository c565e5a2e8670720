"""The agent's task suite: pass@1, pass@4, pass@8 of the whole loop with a model backend.

Each task in tests/data/agent_tasks/ is a tiny repository with a failing test, an instruction and
a reference fix. For every task the repository is copied to a temporary folder and one episode runs
with K candidates: the loop's greedy steps until the model proposes an edit, then K candidates for
that edit (candidate 0 greedy, the others sampled at agent.temperature), each verified by format,
applying, parsing, lint and the task's tests. Reported per task, from the first candidate round:

  pass@1  candidate 0 (the greedy edit) is verified (its tests pass)
  pass@4  one of candidates 0-3 is verified
  pass@8  one of candidates 0-7 is verified

plus the share of candidates that followed the format, applied, parsed, linted clean and passed.
`--check-suite` instead verifies each task's reference fix (the suite itself must be sound).

    python bench/bench_agent.py --k 8 --threads 2 [--tasks a,b] [--json out.json]
    python bench/bench_agent.py --backend openai --base-url http://127.0.0.1:8765/v1 \
        [--model NAME] [--tool-protocol text] ...     # a model behind an OpenAI-compatible server
    python bench/bench_agent.py --check-suite
    python bench/bench_agent.py --language-servers off,on ...   # both arms, task by task, one run
    python bench/bench_agent.py --language-servers off,ty,basedpyright ...   # each type checker

`--language-servers off,on` runs every task once without and once with the language-server tools
(`agent.language_servers`: the type checker's and ruff's diagnostics in the edit gate, definition,
references, hover), one after the other on the same copy of the task, and reports each arm apart
(issue 25 item 5). An arm named for a type checker (ty, basedpyright) is "on" with that checker
(`agent.type_checker`); "on" is the checker "auto" picks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.best_of_k import verify_candidate  # noqa: E402
from agent.loop import AgentLoop, AgentRequest  # noqa: E402
from agent.overlay import Overlay  # noqa: E402
from agent.protocol import ToolCall  # noqa: E402
from agent.sandbox import Workspace  # noqa: E402
from agent.tools import ToolContext  # noqa: E402
from context.config import AgentConfig  # noqa: E402

TASKS = REPO / "tests" / "data" / "agent_tasks"


def load_tasks(names: list[str] | None) -> list[tuple[str, dict]]:
    tasks = []
    for folder in sorted(TASKS.iterdir()):
        if folder.is_dir() and (not names or folder.name in names):
            tasks.append((folder.name, json.loads((folder / "task.json").read_text())))
    return tasks


def copy_repo(name: str, tmp: Path) -> Path:
    root = tmp / name
    shutil.copytree(TASKS / name / "repo", root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def check_suite() -> int:
    bad = 0
    for name, spec in load_tasks(None):
        with tempfile.TemporaryDirectory() as tmp:
            root = copy_repo(name, Path(tmp))
            workspace = Workspace([root])
            ctx = ToolContext(workspace, Overlay(workspace), AgentConfig())
            broken = verify_candidate(
                ctx,
                ToolCall(
                    "edit",
                    {
                        "path": spec["path"],
                        "blocks": [
                            {
                                "search": spec["reference_fix"]["search"],
                                "replace": spec["reference_fix"]["search"] + "\n",
                            }
                        ],
                    },
                ),
                "",
                0.0,
            )
            fixed = verify_candidate(
                ctx, ToolCall("edit", {"path": spec["path"], "blocks": [spec["reference_fix"]]}), "", 0.0
            )
        ok = broken.checks["tests"] is False and fixed.verified
        bad += not ok
        print(
            f"{name:32} unfixed tests fail: {broken.checks['tests'] is False}  reference fix verified: "
            f"{fixed.verified}"
        )
    return 1 if bad else 0


def first_round(result, k: int) -> list:
    return result.candidates[:k]


def run_task(backend, name: str, spec: dict, config: AgentConfig, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = copy_repo(name, Path(tmp))
        started = time.monotonic()
        result = AgentLoop(backend, Workspace([root]), config).run(
            AgentRequest(spec["instruction"], root / spec["path"], k=k)
        )
        seconds = time.monotonic() - started
    round_one = first_round(result, k)
    verified = [c.verified and c.checks["tests"] is True for c in round_one]
    return {
        "task": name,
        "seconds": round(seconds, 1),
        "stop_reason": result.stop_reason,
        "tokens": result.tokens,
        "steps": [s.to_json() for s in result.steps],
        "chosen": result.chosen,
        "candidates": [
            {"checks": c.checks, "verified": c.verified, "logprob": c.logprob, "answer": c.text[:400]}
            for c in result.candidates
        ],
        "pass@1": bool(verified[:1] and verified[0]),
        "pass@4": any(verified[:4]),
        "pass@8": any(verified[:8]),
        "solved_by_episode": result.chosen is not None,
    }


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    cands = [c for r in rows for c in r["candidates"]]
    share = {
        check: round(sum(bool(c["checks"].get(check)) for c in cands) / max(len(cands), 1), 3)
        for check in ("format", "applies", "parse", "lint", "tests")
    }
    return {
        "tasks": n,
        "pass@1": sum(r["pass@1"] for r in rows) / max(n, 1),
        "pass@4": sum(r["pass@4"] for r in rows) / max(n, 1),
        "pass@8": sum(r["pass@8"] for r in rows) / max(n, 1),
        "episode_solved": sum(r["solved_by_episode"] for r in rows) / max(n, 1),
        "candidates": len(cands),
        "candidate_checks_passed": share,
        "seconds_per_task": round(sum(r["seconds"] for r in rows) / max(n, 1), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tasks", help="comma-separated task names (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--max-step-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--no-squid", action="store_true",
                        help="documents in the prompt text instead of Squid-composed caches (the default)")
    parser.add_argument("--backend", choices=("local", "openai"), default="local")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1",
                        help="for --backend openai: the server's /v1 address")
    parser.add_argument("--model", default="", help="for --backend openai; default: the one the server lists")
    parser.add_argument("--tool-protocol", choices=("native", "text"), default="native",
                        help="for --backend openai: function calls, or the local model's fenced blocks")
    parser.add_argument("--seed", type=int, default=0, help="agent.seed: the sampled candidates' seed")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument("--check-suite", action="store_true")
    parser.add_argument("--language-servers", default="off",
                        help="agent.language_servers per arm, comma-separated: off, on, ty, basedpyright "
                             "(on with that type checker), e.g. off,on or off,ty,basedpyright")
    args = parser.parse_args()
    if args.check_suite:
        return check_suite()
    from agent.backends import LocalBackend
    from agent.session import make_backend
    from context.config import ModelConfig, SquidCacheConfig
    from context.runtime import get_runtime

    config = replace(
        AgentConfig(),
        backend=args.backend,
        base_url=args.base_url,
        model=args.model,
        tool_protocol=args.tool_protocol,
        max_steps=args.max_steps,
        max_step_tokens=args.max_step_tokens,
        temperature=args.temperature,
        k=args.k,
        seed=args.seed,
        context_tokens=600,
        memory=False,
        token_budget=args.max_step_tokens * (args.k + args.max_steps + 2),
    )
    if args.backend == "openai":
        served = make_backend(config, load_runtime=lambda: None)
        print(f"backend: {served.base_url}, model {served.model!r}, {args.tool_protocol} tools", flush=True)
    else:
        runtime = get_runtime(ModelConfig(threads=args.threads))
    arms = [arm.strip() for arm in args.language_servers.split(",")]
    if not arms or set(arms) - set(ARMS):
        parser.error(f"--language-servers takes a comma-separated list of {', '.join(ARMS)}")
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    for name, spec in load_tasks(args.tasks.split(",") if args.tasks else None):
        for arm in arms:
            # Squid's cache lives in memory for the run (no disk tier): each task's documents are new.
            backend = served if args.backend == "openai" else LocalBackend(
                runtime, squid=None if args.no_squid else SquidCacheConfig()
            )
            row = run_task(backend, name, spec, replace(config, **ARMS[arm]), args.k)
            rows[arm].append(row)
            print(
                f"{name:32} servers {arm:12} pass@1 {row['pass@1']!s:5} pass@4 {row['pass@4']!s:5} "
                f"pass@8 {row['pass@8']!s:5} {row['stop_reason']:12} {row['seconds']:7.1f}s",
                flush=True,
            )
            if args.json:
                record = {arm: {"summary": summarise(r), "tasks": r} for arm, r in rows.items()}
                args.json.write_text(json.dumps(record if len(arms) > 1 else record[arms[0]], indent=1))
    for arm, arm_rows in rows.items():
        print(f"language servers {arm}: " + json.dumps(summarise(arm_rows), indent=1))
    return 0


# Each `--language-servers` arm: the agent settings it runs with.
ARMS = {
    "off": {"language_servers": False},
    "on": {"language_servers": True, "type_checker": "auto"},
    "ty": {"language_servers": True, "type_checker": "ty"},
    "basedpyright": {"language_servers": True, "type_checker": "basedpyright"},
}


if __name__ == "__main__":
    raise SystemExit(main())
