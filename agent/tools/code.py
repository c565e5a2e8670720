"""Reading tools: `read_file` (a numbered window), `grep` (summarised), `search` and `symbols` (the index)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from context.index.retrieval import search as index_search

from ..errors import ToolError
from .registry import Tool, ToolContext, ToolResult

__all__ = ["READ_FILE", "GREP", "SEARCH", "SYMBOLS", "walk_text_files"]

WINDOW = 100
GREP_MAX_HITS = 40
GREP_MAX_FILES = 5000
_SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "node_modules",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "dist",
    "build",
    ".tox",
}
_MAX_LINE = 300


def _int(args: dict, key: str, default: int, low: int, high: int) -> int:
    value = args.get(key, default)
    return max(low, min(high, int(value)))


def read_file(ctx: ToolContext, args: dict) -> ToolResult:
    path = ctx.workspace.resolve(args["path"])
    text = ctx.overlay.read(path)
    lines = text.splitlines()
    total = len(lines)
    size = _int(args, "lines", WINDOW, 1, 400)
    start = _int(args, "start", 1, 1, max(total, 1))
    end = min(total, start + size - 1)
    numbered = "\n".join(f"{n:>5} {lines[n - 1][:_MAX_LINE]}" for n in range(start, end + 1))
    header = (
        f"{ctx.workspace.rel(path)}: {total} lines, showing {start}-{end}"
        f" ({start - 1} above, {total - end} below)"
    )
    return ToolResult(True, f"{header}\n{numbered}", {"path": str(path), "start": start, "end": end})


def walk_text_files(ctx: ToolContext, under: Path):
    """Files under `under`, skipping tool folders, dot-folders and large or binary files."""
    if under.is_file():
        yield under
        return
    count = 0
    for dirpath, dirnames, filenames in os.walk(under):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            count += 1
            if count > GREP_MAX_FILES:
                return
            try:
                if path.is_symlink() or path.stat().st_size > 1_000_000:
                    continue
            except OSError:
                continue
            yield path


def grep(ctx: ToolContext, args: dict) -> ToolResult:
    try:
        pattern = re.compile(args["pattern"])
    except re.error as exc:
        raise ToolError(f"bad regular expression {args['pattern']!r}: {exc}") from exc
    under = ctx.workspace.resolve(args.get("path") or ".")
    hits: list[str] = []
    per_file: dict[str, int] = {}
    for path in walk_text_files(ctx, under):
        try:
            text = ctx.overlay.read(path)
        except ToolError:
            continue  # binary or unreadable: not a text hit
        rel = ctx.workspace.rel(path)
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line[:2000]):
                per_file[rel] = per_file.get(rel, 0) + 1
                if len(hits) < GREP_MAX_HITS:
                    hits.append(f"{rel}:{number}: {line.strip()[:_MAX_LINE]}")
    total = sum(per_file.values())
    if total == 0:
        return ToolResult(True, f"no match for {args['pattern']!r}", {"hits": 0})
    if total > GREP_MAX_HITS:
        top = sorted(per_file.items(), key=lambda kv: -kv[1])[:15]
        summary = "\n".join(f"{rel}: {n} hits" for rel, n in top)
        return ToolResult(
            True,
            f"{total} matches in {len(per_file)} files: too many to list; narrow the "
            f"pattern or give a path. Most hits:\n{summary}",
            {"hits": total},
        )
    return ToolResult(True, f"{total} matches in {len(per_file)} files:\n" + "\n".join(hits), {"hits": total})


def _need_store(ctx: ToolContext):
    if ctx.store is None:
        raise ToolError("the workspace index is not available; use grep instead")
    return ctx.store


def search(ctx: ToolContext, args: dict) -> ToolResult:
    store = _need_store(ctx)
    k = _int(args, "k", 5, 1, 20)
    query = args["query"]
    hits = ctx.searcher(query, k) if ctx.searcher is not None else index_search(store, query, k)
    if not hits:
        return ToolResult(True, f"nothing found for {args['query']!r}")
    parts = []
    for hit in hits:
        head = "\n".join(hit.text.splitlines()[:8])
        parts.append(f"{hit.rel}:{hit.start_line}-{hit.end_line} {hit.symbol or ''}\n{head}")
    return ToolResult(True, "\n\n".join(parts), {"hits": len(hits)})


def symbols(ctx: ToolContext, args: dict) -> ToolResult:
    store = _need_store(ctx)
    name = args["name"]
    defs = store.symbols_named([name], 10)
    tail = name.rsplit(".", 1)[-1]
    refs = []
    for path, ref_name, line in store.all_references():
        if ref_name == tail:
            refs.append((path, line))
            if len(refs) >= 30:
                break
    if not defs and not refs:
        return ToolResult(True, f"no definition or reference of {name!r} in the index")
    lines = (
        [f"definitions of {name}:"]
        + [f"  {d.rel}:{d.start_line}-{d.end_line} {d.kind} {d.signature}" for d in defs]
        + [f"references ({len(refs)}{'+' if len(refs) >= 30 else ''}):"]
        + [f"  {ctx.workspace.rel(Path(p))}:{line}" for p, line in refs]
    )
    return ToolResult(True, "\n".join(lines), {"definitions": len(defs), "references": len(refs)})


READ_FILE = Tool(
    "read_file",
    "Show about 100 numbered lines of a file, with how many lines are above and below.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "path relative to the workspace"},
            "start": {"type": "integer", "description": "first line (1-based)"},
            "lines": {"type": "integer", "description": "how many lines (default 100)"},
        },
        "required": ["path"],
    },
    read_file,
)
GREP = Tool(
    "grep",
    "Search file contents with a regular expression; all hits in one answer.",
    {
        "type": "object",
        "properties": {
            "pattern": {"type": "string"},
            "path": {"type": "string", "description": "file or folder"},
        },
        "required": ["pattern"],
    },
    grep,
)
SEARCH = Tool(
    "search",
    "Find the code most related to a question (the workspace index: BM25 and symbols).",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
        "required": ["query"],
    },
    search,
)
SYMBOLS = Tool(
    "symbols",
    "Where a name is defined and referenced.",
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    symbols,
)
