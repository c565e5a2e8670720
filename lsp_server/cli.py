"""The `squidcode` command: serve, complete, setup, doctor, demo, index, search, map, bench."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from . import __version__

__all__ = ["main"]


def _parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def _parse_location(value: str) -> tuple[Path, int, int]:
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected FILE:LINE:COL (1-based), got {value!r}")
    line, col = int(parts[1]), int(parts[2])
    if line < 1 or col < 1:
        raise argparse.ArgumentTypeError("LINE and COL count from 1")
    return Path(parts[0]), line, col


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="squidcode", description="A local AI coding assistant backend (language server)."
    )
    parser.add_argument("--version", action="version", version=f"squidcode {__version__}")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="log level on stderr (default: info)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the language server (stdio unless --tcp)")
    serve.add_argument("--tcp", type=_parse_host_port, metavar="HOST:PORT",
                       help="listen on TCP instead of stdio (for debugging)")

    complete = sub.add_parser("complete", help="print one completion at FILE:LINE:COL (1-based)")
    complete.add_argument("location", type=_parse_location, metavar="FILE:LINE:COL")
    complete.add_argument("--json", action="store_true", help="print the result as JSON")

    from .cli_setup import add_parser as add_setup_parser

    add_setup_parser(sub)

    doctor = sub.add_parser("doctor", help="check the model, device, compiler, grammars, tools and folders")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument("--no-load", action="store_true", help="find the model but do not load it")
    doctor.add_argument("--retune", action="store_true",
                        help="measure this CPU's costs again and choose the speed settings anew")

    index = sub.add_parser("index", help="index the code under PATH (incremental after the first run)")
    index.add_argument("path", type=Path, metavar="PATH")
    index.add_argument("--json", action="store_true", help="print the summary as JSON")

    search = sub.add_parser("search", help="search the index of PATH (indexing it first if needed)")
    search.add_argument("path", type=Path, metavar="PATH")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=10, help="how many results (default 10)")
    search.add_argument("--json", action="store_true", help="print the results as JSON")

    repo_map = sub.add_parser("map", help="print a ranked map of PATH's definitions")
    repo_map.add_argument("path", type=Path, metavar="PATH")
    repo_map.add_argument("--focus", type=Path, metavar="FILE", help="rank toward this file")
    repo_map.add_argument("--tokens", type=int, default=1024, help="token budget (default 1024)")

    from .cli_train import add_train_parser

    add_train_parser(sub)

    demo = sub.add_parser(
        "demo",
        help="start `squidcode serve`, open the bundled examples, print inline completions and an agent edit",
    )
    demo.add_argument("--json", action="store_true", help="print the result as JSON")

    from .cli_feedback import add_parsers as add_feedback_parsers

    add_feedback_parsers(sub)
    from . import cli_agent

    cli_agent.add_parsers(sub)
    from .cli_squid import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The Python processes squidcode starts inherit this (the index's parse workers and the
    # embedding process, spawned with `python -c`; the trainer): none puts its working folder,
    # often the workspace, first on sys.path, where a workspace's `multiprocessing.py` or
    # `threading.py` would run in place of the standard module.
    os.environ["PYTHONSAFEPATH"] = "1"
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "debug":
        # pygls logs every message it sends at INFO, document text included: noise an editor shows
        # as errors (it reads stderr), a cost on every keystroke, and code in the editor's logs.
        logging.getLogger("pygls").setLevel(logging.WARNING)
    if args.command == "serve":
        return _serve(args)
    if args.command == "complete":
        return _complete(args)
    if args.command == "setup":
        from .cli_setup import run_setup

        return run_setup(args)
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor(as_json=args.json, load_model=not args.no_load, retune=args.retune)
    if args.command in ("index", "search", "map"):
        from . import cli_index

        if args.command == "index":
            return cli_index.run_index(args.path, args.json)
        if args.command == "search":
            return cli_index.run_search(args.path, args.query, args.k, args.json)
        return cli_index.run_map(args.path, args.focus, args.tokens)
    if args.command == "train":
        from .cli_train import run_train

        return run_train(args)
    if args.command in ("agent", "memory"):
        from . import cli_agent

        if args.command == "agent":
            return cli_agent.run_agent_command(args)
        return cli_agent.run_memory_command(args)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(as_json=args.json)
    if args.command in ("feedback", "collector"):
        from . import cli_feedback

        return cli_feedback.run(args)
    if args.command == "bench":
        from .cli_squid import run_bench_command

        return run_bench_command(args)
    raise AssertionError(f"unhandled command {args.command}")


def _serve(args) -> int:
    from . import create_server
    from .connection import ClientOutput

    server = create_server()
    if args.tcp:
        host, port = args.tcp
        server.start_tcp(host, port)
    else:
        # stdout carries the protocol: anything else printed there (a stray print, a progress bar)
        # would corrupt it, so the rest of the process writes to stderr.
        protocol_out = ClientOutput(sys.stdout.buffer)
        sys.stdout = sys.stderr
        server.start_io(sys.stdin.buffer, protocol_out)
        protocol_out.close()
    # However the connection ended (`exit`, the client gone, a broken pipe), background work stops
    # and the stores close before the interpreter does.
    server.stop_background_work()
    code = server.exit_code
    logging.shutdown()
    sys.stderr.flush()
    # Everything is closed and flushed. A thread still inside native code (a model load that cannot
    # be interrupted) would make the interpreter's own teardown abort the process (SIGABRT), so the
    # process ends here, with the code LSP asks for.
    os._exit(code)


def _complete(args) -> int:
    from agent.completion import CompletionRequest, complete
    from context.config import load_file_config
    from context.errors import SquidcodeError
    from context.runtime import get_runtime

    path, line, col = args.location
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"squidcode: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    workspace = _nearest_workspace_root(path)
    config, problems = load_file_config([workspace] if workspace else [])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    lines = text.split("\n")
    if line > len(lines):
        print(f"squidcode: {path} has {len(lines)} lines, not {line}", file=sys.stderr)
        return 2
    offset = sum(len(ln) + 1 for ln in lines[: line - 1]) + min(col - 1, len(lines[line - 1]))
    try:
        runtime = get_runtime(config.model, config.resolved_cache_dir())
    except SquidcodeError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    result = complete(runtime, CompletionRequest(text, offset), config.completion)
    if args.json:
        print(json.dumps({
            "file": str(path), "line": line, "col": col,
            "text": result.text if result else None,
            "latency_s": round(result.latency_s, 3) if result else None,
            "prompt_tokens": result.prompt_tokens if result else None,
            "new_tokens": result.new_tokens if result else None,
        }))
    elif result is None:
        print("(no completion)")
    else:
        print(result.text)
    return 0


def _nearest_workspace_root(path: Path) -> Path | None:
    """The closest folder above `path` holding a `.squidcode.toml`, as the server's root would."""
    from context.config import WORKSPACE_CONFIG_NAME

    return next((d for d in path.resolve().parents if (d / WORKSPACE_CONFIG_NAME).is_file()), None)


if __name__ == "__main__":
    sys.exit(main())
