"""`lint`: ruff's JSON diagnostics, reported as what a change introduced (before vs after), and the
syntax check every edit must pass (Python's own parser; tree-sitter for the other languages)."""

from __future__ import annotations

import ast
import hashlib
import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tree_sitter

from context.index.parse import language_for

from ..errors import ToolError
from ..sandbox import run_command
from .registry import Tool, ToolContext, ToolResult

__all__ = ["LINT", "Diagnostic", "lint_text", "introduced", "syntax_errors", "lint_change"]

_per_thread = threading.local()
# Lints the text before an edit while the caller lints the text after it.
_LINT_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="squid-lint")


@dataclass(frozen=True)
class Diagnostic:
    """One ruff finding; `key` ignores the line number so that shifted lines still compare equal."""

    code: str
    message: str
    line: int
    source_line: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.code, self.message, self.source_line.strip())

    def render(self) -> str:
        return f"line {self.line}: {self.code} {self.message}"


def lint_text(ctx: ToolContext, path: Path, text: str) -> list[Diagnostic]:
    """ruff's diagnostics of `text` as the file `path` (the project's ruff settings apply)."""
    if not path.suffix == ".py":
        return []
    rel = ctx.workspace.rel(path)
    key = (rel, hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest())
    if key in ctx.lint_cache:
        return ctx.lint_cache[key]
    result = run_command(
        [
            "ruff",
            "check",
            "--output-format",
            "json",
            "--no-cache",
            "--exit-zero",
            "--stdin-filename",
            rel,
            "-",
        ],
        ctx.workspace.root,
        timeout_s=ctx.config.tool_timeout_s,
        max_output_bytes=2_000_000,
        stdin_text=text,
        stderr=False,
    )
    if result.timed_out:
        raise ToolError(f"ruff did not finish within {ctx.config.tool_timeout_s:.0f} s")
    try:
        raw = json.loads(result.output or "[]")
    except json.JSONDecodeError as exc:
        raise ToolError(
            f"ruff printed something that is not its JSON report: {result.output[:200]!r}"
        ) from exc
    lines = text.splitlines()
    out = []
    for item in raw:
        row = (item.get("location") or {}).get("row") or 0
        source = lines[row - 1] if 0 < row <= len(lines) else ""
        out.append(Diagnostic(item.get("code") or "syntax", item.get("message", ""), row, source))
    ctx.lint_cache[key] = out
    return out


def introduced(before: list[Diagnostic], after: list[Diagnostic]) -> list[Diagnostic]:
    """Diagnostics of `after` that `before` did not have (as a multiset of keys)."""
    left = Counter(d.key for d in before)
    new = []
    for diag in after:
        if left[diag.key] > 0:
            left[diag.key] -= 1
        else:
            new.append(diag)
    return new


def _tree_sitter_errors(text: str, language: str) -> list[str]:
    from context.index import parse as parse_module

    cache = getattr(_per_thread, "parsers", None)
    if cache is None:
        cache = _per_thread.parsers = {}
    parser = cache.get(language)
    if parser is None:
        # The index's grammar table: one source of truth for which wheel parses which language.
        grammar = tree_sitter.Language(parse_module._GRAMMARS[language]())
        parser = cache[language] = tree_sitter.Parser(grammar)
    tree = parser.parse(text.encode("utf-8", "surrogatepass"))
    if not tree.root_node.has_error:
        return []
    errors = []
    stack = [tree.root_node]
    while stack and len(errors) < 5:
        node = stack.pop()
        if node.is_error or node.is_missing:
            errors.append(f"line {node.start_point[0] + 1}: syntax error near {node.text[:40]!r}")
        elif node.has_error:
            stack.extend(reversed(node.children))
    return errors or ["syntax error"]


def syntax_errors(path: Path, text: str) -> list[str]:
    """The syntax errors of `text` for the language of `path` ([] when it parses or has no grammar)."""
    if path.suffix == ".py":
        try:
            ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            return [f"line {exc.lineno}: SyntaxError: {exc.msg}"]
        except ValueError as exc:  # NUL bytes
            return [f"SyntaxError: {exc}"]
        return []
    language = language_for(path.name)
    if language is None:
        return []
    return _tree_sitter_errors(text, language)


def lint_change(ctx: ToolContext, path: Path, before: str, after: str) -> tuple[list[str], list[Diagnostic]]:
    """(syntax errors introduced, lint diagnostics introduced) by changing `before` into `after`.

    The two ruff runs (before and after) go side by side: a round trip costs one run's wall time.
    """
    new_syntax = syntax_errors(path, after)
    if new_syntax and syntax_errors(path, before):
        new_syntax = []  # the file did not parse before either: not this change's doing
    if new_syntax:
        return new_syntax, []
    earlier = _LINT_POOL.submit(lint_text, ctx, path, before)
    later = lint_text(ctx, path, after)
    return [], introduced(earlier.result(), later)


def lint(ctx: ToolContext, args: dict) -> ToolResult:
    path = ctx.workspace.resolve(args["path"])
    current = ctx.overlay.read(path)
    base = ctx.overlay.base_text(path)
    syntax, new = lint_change(ctx, path, base, current)
    if syntax:
        return ToolResult(True, "syntax errors:\n" + "\n".join(syntax), {"new": len(syntax)})
    all_now = lint_text(ctx, path, current)
    if not new:
        return ToolResult(
            True,
            f"{ctx.workspace.rel(path)}: no new lint errors ({len(all_now)} were already there)",
            {"new": 0, "total": len(all_now)},
        )
    return ToolResult(
        True,
        f"{ctx.workspace.rel(path)}: {len(new)} new lint error(s):\n" + "\n".join(d.render() for d in new),
        {"new": len(new), "total": len(all_now)},
    )


LINT = Tool(
    "lint",
    "Lint a file (ruff) and report only the problems your edits introduced.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    lint,
)
