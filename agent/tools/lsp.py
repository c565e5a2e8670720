"""`diagnostics` from the workspace's language servers, and their part in the edit gate.

The settings are read from the agent's configuration with defaults, so that they work before the
configuration names them: `language_servers` (off by default), `type_errors_block` (new errors of a
type checker reject an edit; false: they are shown and the edit goes through), `lsp_timeout_s`, and
`language_server_commands` (language -> command, e.g. {"go": "gopls"}) and `type_checker` (Python's:
"auto", "ty" or "basedpyright").

Without a server (turned off, not installed, crashed too often, hanging) the tools fall back to what
the agent checked before (the parser and ruff) and say so in one line: never an error.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ToolError
from ..lsp_client import (
    LanguageServers,
    file_diagnostics,
    introduced_errors,
    lsp_position,
    shared_language_servers,
)
from ..lsp_client.specs import parse_server_commands
from .lint import lint_text, syntax_errors
from .registry import Tool, ToolContext, ToolResult

__all__ = [
    "DIAGNOSTICS",
    "LspSettings",
    "lsp_settings",
    "servers_for",
    "gate_check",
    "position_args",
    "notes_text",
]

log = logging.getLogger(__name__)

MAX_SHOWN = 40


@dataclass(frozen=True)
class LspSettings:
    """The language-server settings of `AgentConfig`, with their defaults."""

    enabled: bool = False
    type_errors_block: bool = True
    timeout_s: float = 10.0
    commands: tuple[tuple[str, Any], ...] = ()
    type_checker: str = "auto"


def lsp_settings(config: Any) -> LspSettings:
    commands, problems = parse_server_commands(config.language_server_commands)
    for problem in problems:
        log.warning("agent.language_server_commands: %s", problem)
    return LspSettings(
        config.language_servers,
        config.type_errors_block,
        config.lsp_timeout_s,
        tuple(sorted((k, v if isinstance(v, str) else tuple(v)) for k, v in commands.items())),
        config.type_checker,
    )


def servers_for(ctx: ToolContext) -> LanguageServers | None:
    """The context's language servers, the shared pool when the configuration turns them on, or None."""
    if ctx.language_servers is not None:
        return ctx.language_servers
    settings = lsp_settings(ctx.config)
    if not settings.enabled:
        return None
    return shared_language_servers(ctx.workspace.root, dict(settings.commands), settings.timeout_s,
                                   ctx.config.allow_unisolated, settings.type_checker)


def notes_text(notes: list[str]) -> str:
    unique = list(dict.fromkeys(notes))
    return "".join(f"\nnote: {note}" for note in unique)


_OFF_NOTE = "language servers are off (agent.language_servers = false); checked with the parser and ruff only"


def _word_columns(line: str, symbol: str) -> list[int]:
    pattern = rf"(?<![\w]){re.escape(symbol)}(?![\w])" if re.match(r"\w", symbol) else re.escape(symbol)
    return [m.start() for m in re.finditer(pattern, line)]


def position_args(ctx: ToolContext, args: dict) -> tuple[Path, dict[str, int], str]:
    """(path, LSP position, text) of a tool's `path`, `line` and `symbol` or `column` arguments.

    A symbol not on the given line is looked for on the nearest lines around it (small models are
    often a line or two off)."""
    path = ctx.workspace.resolve(args["path"])
    text = ctx.overlay.read(path)
    lines = text.split("\n")
    line = int(args["line"])
    if not 1 <= line <= len(lines):
        raise ToolError(f"line {line} is outside {ctx.workspace.rel(path)} (it has {len(lines)} lines)")
    symbol = (args.get("symbol") or "").strip()
    if "." in symbol.strip("."):
        symbol = symbol.rsplit(".", 1)[-1]  # "calc.add" or "self.total": the name is the last part
    if not symbol:
        column = int(args.get("column") or 0)
        if column <= 0:
            current = lines[line - 1]
            column = len(current) - len(current.lstrip()) + 1
        return path, lsp_position(text, line, column), text
    for offset in (0, -1, 1, -2, 2, -3, 3):
        row = line + offset
        if 1 <= row <= len(lines) and (columns := _word_columns(lines[row - 1], symbol)):
            return path, lsp_position(text, row, columns[0] + 1), text
    raise ToolError(
        f"{symbol!r} is not on line {line} of {ctx.workspace.rel(path)}; it reads: "
        f"{lines[line - 1].strip()[:120]!r}"
    )


def _with_text(overlay: Any, path: Path, text: str) -> Any:
    view = overlay.copy()
    view.write(path, text)
    return view


def gate_check(ctx: ToolContext, path: Path, before: str, after: str) -> tuple[list[str], list[str]]:
    """(new errors that reject the edit, notes) from the type-checking language servers.

    ruff's server is left out: the gate runs ruff itself. With `type_errors_block` false, new type
    errors come back as notes and do not reject the edit."""
    servers = servers_for(ctx)
    if servers is None:
        return [], []
    notes: list[str] = []
    before_from: set[str] = set()
    after_from: set[str] = set()
    old = file_diagnostics(
        servers,
        _with_text(ctx.overlay, path, before),
        path,
        notes,
        type_checkers_only=True,
        answered=before_from,
    )
    new = file_diagnostics(
        servers,
        _with_text(ctx.overlay, path, after),
        path,
        notes,
        type_checkers_only=True,
        answered=after_from,
    )
    notes = [f"{n}; the edit was checked with the parser and ruff only" for n in dict.fromkeys(notes)]
    both = before_from & after_from  # a server that answered only once cannot tell what is new
    changed = introduced_errors([d for d in old if d.server in both], [d for d in new if d.server in both])
    found = [d.render() for d in changed]
    if found and not lsp_settings(ctx.config).type_errors_block:
        return [], notes + [f"{len(found)} new type error(s), not blocking: " + "; ".join(found[:5])]
    return found, notes


def _fallback(ctx: ToolContext, path: Path, text: str, why: str) -> ToolResult:
    rel = ctx.workspace.rel(path)
    problems = syntax_errors(path, text) or [d.render() for d in lint_text(ctx, path, text)]
    body = "\n".join(problems[:MAX_SHOWN]) if problems else "no problems found"
    return ToolResult(
        True, f"{rel} (parser and ruff): {body}\nnote: {why}", {"count": len(problems), "fallback": True}
    )


def diagnostics(ctx: ToolContext, args: dict) -> ToolResult:
    path = ctx.workspace.resolve(args["path"])
    text = ctx.overlay.read(path)
    servers = servers_for(ctx)
    if servers is None:
        return _fallback(ctx, path, text, _OFF_NOTE)
    notes: list[str] = []
    answered: set[str] = set()
    found = file_diagnostics(servers, ctx.overlay, path, notes, answered=answered)
    if not answered:
        why = (
            "; ".join(dict.fromkeys(notes)) or f"no language server handles {path.suffix or path.name} files"
        )
        return _fallback(ctx, path, text, why)
    shown = [d for d in found if d.severity != "hint"][:MAX_SHOWN]
    errors = sum(d.is_error for d in found)
    rel = ctx.workspace.rel(path)
    header = (
        f"{rel}: {errors} error(s), {len(found) - errors} other finding(s) ({', '.join(sorted(answered))})"
    )
    body = "\n".join(d.render() for d in shown)
    return ToolResult(
        True,
        header + ("\n" + body if body else "") + notes_text(notes),
        {"errors": errors, "total": len(found), "notes": notes},
    )


DIAGNOSTICS = Tool(
    "diagnostics",
    "Errors and warnings of a file as it is now, your edits included, from the language servers "
    "(type checker and linter).",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    diagnostics,
)
