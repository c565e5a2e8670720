"""`definition`, `references`, `hover`, `document_symbols` and `rename` from the language servers.

A position is a file, a 1-based line and the symbol on it (or a 1-based column). `rename` asks the
server for a workspace edit, applies it to a copy of the overlay, compares the diagnostics of every
file it touches before and after, and keeps it only when it introduces no error: the rename is in
the overlay, like any other edit, until the user applies it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ToolError
from ..lsp_client import (
    LanguageServers,
    Location,
    definition,
    document_symbols,
    file_diagnostics,
    hover,
    introduced_errors,
    references,
    rename_edit,
)
from ..overlay import unified_diff
from .lsp import notes_text, position_args, servers_for
from .registry import Tool, ToolContext, ToolResult

__all__ = ["DEFINITION", "REFERENCES", "HOVER", "DOCUMENT_SYMBOLS", "RENAME"]

MAX_LOCATIONS = 50
MAX_HOVER_CHARS = 2000
_OFF = "language servers are off (agent.language_servers = false); use search, symbols or grep instead"


def _servers(ctx: ToolContext) -> LanguageServers:
    servers = servers_for(ctx)
    if servers is None:
        raise ToolError(_OFF)
    return servers


def _unanswered(what: str, notes: list[str]) -> ToolResult:
    """No server could answer: a result (not an error) telling the model to use other tools."""
    return ToolResult(
        True,
        f"no {what}: no language server answered; use search or grep" + notes_text(notes),
        {"notes": notes, "degraded": True},
    )


def _render_locations(ctx: ToolContext, locations: list[Location]) -> list[str]:
    return [
        f"  {ctx.workspace.rel(loc.path)}:{loc.line}:{loc.column}  {loc.text[:160]}"
        for loc in locations[:MAX_LOCATIONS]
    ]


def definition_tool(ctx: ToolContext, args: dict) -> ToolResult:
    servers = _servers(ctx)
    path, position, _ = position_args(ctx, args)
    notes: list[str] = []
    found = definition(servers, ctx.overlay, path, position, notes)
    if not found:
        if notes:
            return _unanswered("definition", notes)
        return ToolResult(True, "no definition found at that position", {"count": 0})
    lines = [f"definition ({len(found)}):", *_render_locations(ctx, found)]
    return ToolResult(True, "\n".join(lines) + notes_text(notes), {"count": len(found)})


def references_tool(ctx: ToolContext, args: dict) -> ToolResult:
    servers = _servers(ctx)
    path, position, _ = position_args(ctx, args)
    notes: list[str] = []
    found = references(servers, ctx.overlay, path, position, notes)
    if not found:
        if notes:
            return _unanswered("references", notes)
        return ToolResult(True, "no references found at that position", {"count": 0})
    more = f" (first {MAX_LOCATIONS} shown)" if len(found) > MAX_LOCATIONS else ""
    lines = [f"references ({len(found)}){more}:", *_render_locations(ctx, found)]
    return ToolResult(True, "\n".join(lines) + notes_text(notes), {"count": len(found)})


def hover_tool(ctx: ToolContext, args: dict) -> ToolResult:
    servers = _servers(ctx)
    path, position, _ = position_args(ctx, args)
    notes: list[str] = []
    text = hover(servers, ctx.overlay, path, position, notes)
    if text is None:
        if notes:
            return _unanswered("hover", notes)
        return ToolResult(True, "nothing to show at that position")
    return ToolResult(True, text[:MAX_HOVER_CHARS] + notes_text(notes), {"chars": len(text)})


def document_symbols_tool(ctx: ToolContext, args: dict) -> ToolResult:
    servers = _servers(ctx)
    path = ctx.workspace.resolve(args["path"])
    ctx.overlay.read(path)  # a missing file is the model's mistake, reported as such
    notes: list[str] = []
    found = document_symbols(servers, ctx.overlay, path, notes)
    if not found:
        if notes:
            return _unanswered("symbols", notes)
        return ToolResult(True, f"{ctx.workspace.rel(path)} defines no symbols", {"count": 0})
    lines = [f"{'  ' * s.depth}{s.kind} {s.name} (line {s.line})" for s in found[:200]]
    header = f"{ctx.workspace.rel(path)}: {len(found)} symbols"
    return ToolResult(True, header + "\n" + "\n".join(lines) + notes_text(notes), {"count": len(found)})


def _rename_diagnostics(servers: LanguageServers, overlay, paths: list[Path], notes: list[str]):
    answered: set[str] = set()
    found = []
    for path in paths:
        found.extend(file_diagnostics(servers, overlay, path, notes, answered=answered))
    return found, answered


def rename_tool(ctx: ToolContext, args: dict) -> ToolResult:
    servers = _servers(ctx)
    new_name = args["new_name"].strip()
    if not new_name.isidentifier():
        raise ToolError(f"{new_name!r} is not a valid identifier")
    path, position, _ = position_args(ctx, args)
    notes: list[str] = []
    texts = rename_edit(servers, ctx.overlay, path, position, new_name, notes)
    if not texts:
        if notes:
            return _unanswered("rename", notes)
        return ToolResult(False, "nothing to rename at that position")
    for target in texts:
        ctx.workspace.resolve(target)  # a rename reaching outside the workspace is refused
    trial = ctx.overlay.copy()
    for target, text in texts.items():
        trial.write(target, text)
    touched = sorted(texts)
    before, before_from = _rename_diagnostics(servers, ctx.overlay, touched, notes)
    after, after_from = _rename_diagnostics(servers, trial, touched, notes)
    both = before_from & after_from
    new = introduced_errors([d for d in before if d.server in both], [d for d in after if d.server in both])
    diff = "".join(unified_diff(ctx.workspace.rel(p), ctx.overlay.read(p), texts[p]) for p in touched)
    if new:
        errors = "\n".join(d.render() for d in new[:20])
        return ToolResult(
            False,
            f"rename rejected, nothing changed. It would introduce:\n{errors}\n{diff}" + notes_text(notes),
            {"rejected": True, "new_errors": len(new)},
        )
    for target, text in texts.items():
        ctx.overlay.write(target, text)
    checked = ", ".join(sorted(both)) or "nothing (no server answered)"
    files = ", ".join(ctx.workspace.rel(p) for p in touched)
    return ToolResult(
        True,
        f"renamed to {new_name} in {files} (checked by {checked}: no new errors):\n{diff}"
        + notes_text(notes),
        {"files": [str(p) for p in touched], "checked_by": sorted(both)},
    )


_POSITION = {
    "path": {"type": "string"},
    "line": {"type": "integer", "description": "1-based line"},
    "symbol": {"type": "string", "description": "the name on that line"},
    "column": {"type": "integer", "description": "1-based column, when no symbol is given"},
}


def _position_tool(name: str, description: str, run) -> Tool:
    return Tool(
        name, description, {"type": "object", "properties": _POSITION, "required": ["path", "line"]}, run
    )


DEFINITION = _position_tool(
    "definition", "Where the symbol at a position is defined (from the language server).", definition_tool
)
REFERENCES = _position_tool(
    "references", "Every use of the symbol at a position, across the workspace.", references_tool
)
HOVER = _position_tool("hover", "The type and documentation of the symbol at a position.", hover_tool)
DOCUMENT_SYMBOLS = Tool(
    "document_symbols",
    "The classes, functions and variables a file defines, nested, with their lines.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    document_symbols_tool,
)
RENAME = Tool(
    "rename",
    "Rename the symbol at a position everywhere it is used; rejected when it would introduce errors.",
    {
        "type": "object",
        "properties": {**_POSITION, "new_name": {"type": "string"}},
        "required": ["path", "line", "new_name"],
    },
    rename_tool,
)
