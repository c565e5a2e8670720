"""`squidcode feedback stats|report|export|forget` and `squidcode collector serve`."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path

__all__ = ["add_parsers", "run"]


def _since(value: str) -> float:
    """A time: ISO date/datetime, or an age like 30m, 2h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[:-1].replace(".", "", 1).isdigit() and value[-1] in units:
        return time.time() - float(value[:-1]) * units[value[-1]]
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO date or an age like 2h or 7d, got {value!r}"
        ) from None


def add_parsers(sub) -> None:
    feedback = sub.add_parser("feedback", help="what squidcode recorded about its suggestions (local)")
    actions = feedback.add_subparsers(dest="feedback_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", type=Path, metavar="PATH", help="the feedback store (default: the user data dir)"
    )
    common.add_argument("--since", type=_since, help="only what was recorded since (ISO date or 2h, 7d)")
    stats = actions.add_parser("stats", parents=[common], help="acceptance, persistence, revert rate")
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    report = actions.add_parser("report", parents=[common], help="write a self-contained HTML report")
    report.add_argument("--html", type=Path, required=True, metavar="FILE")
    export = actions.add_parser("export", parents=[common], help="print the store as JSON lines")
    export.add_argument("--jsonl", action="store_true", required=True, help="JSON lines (the only format)")
    export.add_argument("--out", type=Path, metavar="FILE", help="write there instead of stdout")
    forget = actions.add_parser("forget", parents=[common], help="delete recorded feedback")
    forget.add_argument("--all", action="store_true", help="delete everything")

    collector = sub.add_parser("collector", help="the team feedback collector")
    serve = collector.add_subparsers(dest="collector_command", required=True).add_parser(
        "serve", help="receive teams' uploads over HTTP (uvicorn)"
    )
    serve.add_argument(
        "--db", required=True, metavar="PATH|URL", help="SQLite file to store into, or a postgresql:// URL"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument(
        "--tokens", metavar="FILE", help="file of team=token lines (else $SQUIDCODE_COLLECTOR_TOKENS)"
    )
    serve.add_argument("--rate-limit", type=int, default=600, metavar="N",
                       help="requests per minute per team before 429 (0: no limit)")
    serve.add_argument("--ssl-certfile", metavar="FILE", help="serve HTTPS with this certificate (uvicorn)")
    serve.add_argument("--ssl-keyfile", metavar="FILE", help="... and this private key")


def run(args) -> int:
    if args.command == "collector":
        return _serve_collector(args)
    from context.config import FeedbackConfig, load_file_config
    from context.errors import FeedbackStoreError
    from feedback.store import FeedbackStore, default_db_path, translate_sqlite_error

    config = load_file_config([])[0].feedback if args.db is None else FeedbackConfig()
    path = args.db or default_db_path(config)
    if args.feedback_command == "forget" and not (args.all or args.since):
        print("squidcode: say what to forget: --all, or --since TIME", file=sys.stderr)
        return 2
    if not path.exists():
        print(f"squidcode: no feedback recorded yet ({path} does not exist)", file=sys.stderr)
        return 0 if args.feedback_command == "forget" else 1
    try:
        store = FeedbackStore(path)
        try:
            return _feedback(args, store, config)
        finally:
            store.close()
    except FeedbackStoreError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:
        print(f"squidcode: {translate_sqlite_error(exc, path)}", file=sys.stderr)
        return 1


def _feedback(args, store, config) -> int:
    from feedback.report import compute_stats, export_jsonl, render_html

    since = args.since
    if args.feedback_command == "stats":
        stats = compute_stats(store, since, config=config)
        print(json.dumps(stats, indent=2) if args.json else _stats_text(stats))
    elif args.feedback_command == "report":
        args.html.write_text(render_html(compute_stats(store, since, config=config)), encoding="utf-8")
        print(f"wrote {args.html}")
    elif args.feedback_command == "export":
        out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
        try:
            for line in export_jsonl(store, since):
                out.write(line + "\n")
        finally:
            if args.out:
                out.close()
    else:
        deleted = store.forget(None if args.all else since)
        print("deleted " + ", ".join(f"{n} {table}" for table, n in deleted.items()))
    return 0


def _stats_text(stats: dict) -> str:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"store: {stats['db']}",
        f"episodes: {stats['episodes']}  completions shown: {stats['shown']}  accepted: {stats['accepted']}"
        f"  acceptance rate: {pct(stats['acceptance_rate'])}",
        f"agent edits applied: {stats['applied']}  tracked regions: {stats['tracked_regions']}"
        f"  revert rate: {pct(stats['revert_rate'])}",
    ]
    for label, p in stats["persistence"].items():
        lines.append(
            f"  at {label:>4}: kept {pct(p['kept_rate'])} (n={p['n']}), reverted {pct(p['reverted'])}"
        )
    for model, s in stats["by_model"].items():
        lines.append(f"model {model}: acceptance {pct(s['acceptance_rate'])}, revert {pct(s['revert_rate'])}")
    for context, s in stats.get("by_context", {}).items():
        lines.append(f"completions {context}: {s['shown']} shown, acceptance {pct(s['acceptance_rate'])}, "
                     f"revert {pct(s['revert_rate'])}")
    sessions = stats["sessions"]
    lines.append(
        f"sessions: {sessions['count']} on {sessions['active_days']} days;"
        f" days since last: {sessions['days_since_last']}"
    )
    lines.append(
        f"model switches: {stats['model_switches']['count']}"
        f" ({stats['model_switches']['right_after_output']} right after an output)"
    )
    return "\n".join(lines)


def _serve_collector(args) -> int:
    import uvicorn

    from context.errors import FeedbackStoreError
    from feedback.collector import create_app, open_collector_store, parse_tokens

    try:
        spec = (
            Path(args.tokens).read_text(encoding="utf-8")
            if args.tokens
            else os.environ.get("SQUIDCODE_COLLECTOR_TOKENS", "")
        )
        tokens = parse_tokens(spec)
    except (OSError, ValueError) as exc:
        print(f"squidcode: collector tokens: {exc}", file=sys.stderr)
        return 2
    if not tokens:
        print(
            "squidcode: the collector needs at least one token (--tokens FILE or "
            "$SQUIDCODE_COLLECTOR_TOKENS=team=token)",
            file=sys.stderr,
        )
        return 2
    try:
        store = open_collector_store(args.db)
    except FeedbackStoreError as exc:
        print(f"squidcode: {exc}", file=sys.stderr)
        return 1
    scheme = "https" if args.ssl_certfile else "http"
    print(f"squidcode collector on {scheme}://{args.host}:{args.port}, storing into {store.path}",
          file=sys.stderr)
    uvicorn.run(create_app(store, tokens, rate_per_minute=args.rate_limit), host=args.host, port=args.port,
                log_level="warning", ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    return 0
