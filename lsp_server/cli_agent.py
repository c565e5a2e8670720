"""The agent commands of the CLI: `squidcode agent PATH "instruction"` and `squidcode memory list|forget`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agent.episode import AgentResult, StepRecord
from agent.errors import AgentCancelled
from agent.loop import AgentLoop, AgentRequest
from agent.memory import MemoryStore, default_memory_path
from agent.sandbox import Workspace
from agent.session import make_backend, open_memory, squid_settings, with_overrides
from context.config import load_file_config
from context.errors import SquidcodeError
from context.index.semantic import store_searcher
from context.runtime import get_runtime

__all__ = ["add_parsers", "run_agent_command", "run_memory_command"]


def add_parsers(sub) -> None:
    agent = sub.add_parser("agent", help="ask the agent for an edit of the code under PATH")
    agent.add_argument("path", type=Path, metavar="PATH", help="a file (the one to change) or a folder")
    agent.add_argument("instruction")
    agent.add_argument(
        "--k", type=int, default=None, help="candidates to sample and verify (default: agent.k)"
    )
    agent.add_argument("--apply", action="store_true", help="write the chosen edit to the files")
    agent.add_argument("--json", action="store_true", help="print one JSON object")
    agent.add_argument("--backend", choices=["local", "openai"], help="the model backend for this run")
    agent.add_argument("--model", help="the model name (openai backend) for this run")
    agent.add_argument("--lines", metavar="START:END", help="the 1-based line range the request is about")

    memory = sub.add_parser("memory", help="list or forget the agent's notes about a workspace")
    memory_sub = memory.add_subparsers(dest="memory_command", required=True)
    listing = memory_sub.add_parser("list", help="the notes of a workspace")
    listing.add_argument("path", type=Path, nargs="?", default=Path("."), metavar="PATH")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--all", action="store_true", help="the notes of every workspace")
    forget = memory_sub.add_parser("forget", help="forget notes by id, or the stale ones")
    forget.add_argument("ids", type=int, nargs="*", metavar="ID")
    forget.add_argument("--path", type=Path, default=Path("."), help="the workspace (default: .)")
    forget.add_argument(
        "--stale", action="store_true", help="forget notes unused for agent.memory_stale_days"
    )


def _workspace_root(path: Path) -> Path:
    start = path if path.is_dir() else path.parent
    for folder in [start, *start.parents]:
        if (folder / ".git").exists() or (folder / "pyproject.toml").is_file():
            return folder
    return start


def _parse_lines(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    start, _, end = value.partition(":")
    if not start.isdigit() or (end and not end.isdigit()) or int(start) < 1:
        raise SquidcodeError(f"--lines expects START:END (1-based), got {value!r}")
    return int(start), int(end or start)


def _print_step(step: StepRecord, number: int) -> None:
    status = "ok" if step.ok else "failed"
    args = json.dumps(step.args)[:120]
    first = (step.output.strip().splitlines() or [""])[0][:120]
    print(f"[{number}] {step.tool} {args} -> {status}: {first}", file=sys.stderr)


def run_agent_command(args) -> int:
    path = args.path.resolve()
    if not path.exists():
        print(f"squidcode: {args.path} does not exist", file=sys.stderr)
        return 2
    root = _workspace_root(path)
    config, problems = load_file_config([root])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    try:
        agent_config = with_overrides(config.agent, args.backend, args.model, args.k)
        line_range = _parse_lines(args.lines)
        backend = make_backend(agent_config, lambda: get_runtime(config.model, config.resolved_cache_dir()),
                               *squid_settings(config))
        store = _index_store(root)
        loop = AgentLoop(
            backend,
            Workspace([root]),
            agent_config,
            store=store,
            searcher=store_searcher(store) if store is not None else None,
            memory=open_memory(config, root),
            on_step=None if args.json else _print_step,
        )
        result = loop.run(AgentRequest(args.instruction, path if path.is_file() else None, line_range))
    except AgentCancelled:
        print("squidcode: cancelled", file=sys.stderr)
        return 130
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    if args.apply and result.chosen is not None:
        _apply(result)
    _report(result, args.json, args.apply)
    return 0 if result.chosen is not None else 3


def _index_store(root: Path):
    from .cli_index import _open_indexed

    try:
        store, _ = _open_indexed(root)
        return store
    except SquidcodeError as exc:
        print(f"squidcode: no index for {root} ({exc}); search and symbols are unavailable", file=sys.stderr)
        return None


def _apply(result: AgentResult) -> None:
    for change in result.changes:
        change.path.write_text(change.after, encoding="utf-8")


def _report(result: AgentResult, as_json: bool, applied: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json()))
        return
    verified = sum(c.verified for c in result.candidates)
    print(
        f"{len(result.steps)} steps, {len(result.candidates)} candidates ({verified} verified), "
        f"stopped: {result.stop_reason}, {result.seconds:.1f}s",
        file=sys.stderr,
    )
    if result.error:
        print(f"squidcode: {result.error}", file=sys.stderr)
    if result.chosen is None:
        print("no verified edit", file=sys.stderr)
        return
    print(result.diff, end="")
    if applied:
        print(f"applied to {', '.join(c.rel for c in result.changes)}", file=sys.stderr)


def run_memory_command(args) -> int:
    root = _workspace_root(args.path.resolve())
    config, _ = load_file_config([root])
    try:
        memory = MemoryStore(default_memory_path(config.resolved_cache_dir()), str(root))
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    with_all = getattr(args, "all", False)
    if args.memory_command == "list":
        notes = memory.notes(all_workspaces=with_all)
        if args.json:
            print(
                json.dumps(
                    [
                        {
                            "id": n.id,
                            "workspace": n.workspace,
                            "subject": n.subject,
                            "body": n.body,
                            "kind": n.kind,
                            "uses": n.uses,
                        }
                        for n in notes
                    ]
                )
            )
        else:
            for note in notes:
                print(
                    f"{note.id:>5} [{note.kind}] {note.body}" + (f"  ({note.workspace})" if with_all else "")
                )
            if not notes:
                print(f"no notes for {root}", file=sys.stderr)
        return 0
    gone = memory.forget_stale(config.agent.memory_stale_days) if args.stale else 0
    missing = [i for i in args.ids if not memory.forget(i)]
    gone += len(args.ids) - len(missing)
    print(f"forgot {gone} note(s)" + (f"; no note with id {', '.join(map(str, missing))}" if missing else ""))
    return 1 if missing else 0
