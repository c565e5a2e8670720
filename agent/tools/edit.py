"""`edit`: search/replace blocks applied to the overlay, gated by the parser, the linter and, when
they are turned on, the type-checking language servers.

An edit that introduces a syntax error, new lint errors or new type errors is rejected: the overlay
keeps the file as it was and the model is shown the errors, the code it proposed and the original.
A search text must match exactly one place; lines that differ only in trailing spaces, or in
indentation as a whole, still match (small models rarely reproduce whitespace exactly).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..errors import ToolError
from ..overlay import unified_diff
from .lint import lint_change
from .lsp import gate_check, notes_text
from .registry import Tool, ToolContext, ToolResult

__all__ = ["EDIT", "apply_blocks", "check_edit", "EditCheck", "Block", "replace_definitions", "new_text_for"]


@dataclass(frozen=True)
class Block:
    search: str
    replace: str


@dataclass(frozen=True)
class EditCheck:
    """The outcome of proposing new text for one file."""

    ok: bool
    syntax: list[str]
    lint: list[str]
    before: str
    after: str
    types: list[str] = field(default_factory=list)  # new errors from the language servers
    notes: list[str] = field(default_factory=list)  # a server missing or hung, errors not blocking


def _occurrences(text: str, wanted: str) -> list[int]:
    found, at = [], text.find(wanted)
    while at >= 0:
        found.append(at)
        at = text.find(wanted, at + 1)
    return found


def _find_lines(lines: list[str], wanted: list[str], key) -> list[int]:
    keyed = [key(x) for x in wanted]
    n = len(wanted)
    return [i for i in range(len(lines) - n + 1) if [key(x) for x in lines[i : i + n]] == keyed]


def _reindent(replace: list[str], found_indent: str, search_indent: str) -> list[str]:
    out = []
    for line in replace:
        if line.startswith(search_indent):
            out.append(found_indent + line[len(search_indent) :])
        else:
            out.append(line)
    return out


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _indented_as_search(search: str, replace: str) -> str:
    """`replace`, or when it is written flush left for search text whose first line is indented
    (and no line of it less so), `replace` indented by that much: small models copy the search text
    with its indentation and drop it in the replacement, which then does not parse."""
    wanted = [line for line in search.split("\n") if line.strip()]
    lines = replace.split("\n")
    first = next((line for line in lines if line.strip()), None)
    indent = _indent(wanted[0]) if wanted else ""
    if not indent or first is None or _indent(first) or any(len(_indent(x)) < len(indent) for x in wanted):
        return replace
    return "\n".join(indent + line if line.strip() else line for line in lines)


def apply_block(text: str, block: Block) -> str:
    """`text` with the one place matching `block.search` replaced (ToolError when not exactly one)."""
    if block.search == "":
        if text.strip():
            raise ToolError("an empty SEARCH only creates a new (empty) file; quote the lines to change")
        return block.replace
    count, size = text.count(block.search), len(block.search)
    if count:
        at = text.find(block.search)
        if count > 1:
            # Lines quoted whole match where a line starts: `    if k in d:` is not also the end of
            # the more indented `        if k in d:` (the agent's copy of the file allows it as unique).
            starts = [i for i in _occurrences(text, block.search) if (i == 0 or text[i - 1] == "\n")
                      and (block.search.endswith("\n") or i + size == len(text) or text[i + size] == "\n")]
            if len(starts) != 1 or block.search.startswith("\n"):
                raise ToolError(f"the SEARCH text matches {count} places; include more surrounding lines")
            at = starts[0]
        return text[:at] + _indented_as_search(block.search, block.replace) + text[at + size :]
    lines = text.split("\n")
    wanted = block.search.strip("\n").split("\n")
    replace = block.replace.strip("\n").split("\n") if block.replace.strip("\n") else []
    for key, reindent in ((str.rstrip, False), (str.strip, True)):
        spots = _find_lines(lines, wanted, key)
        if len(spots) > 1:
            raise ToolError(f"the SEARCH text matches {len(spots)} places; include more surrounding lines")
        if len(spots) == 1:
            start = spots[0]
            if reindent:
                first = next((x for x in wanted if x.strip()), "")
                replace = _reindent(replace, _indent(lines[start + wanted.index(first)]), _indent(first))
            return "\n".join(lines[:start] + replace + lines[start + len(wanted) :])
    raise ToolError(
        "the SEARCH text was not found; copy the lines exactly as read_file shows them "
        "(without the line numbers)"
    )


def apply_blocks(text: str, blocks: list[Block]) -> str:
    for number, block in enumerate(blocks, 1):
        try:
            text = apply_block(text, block)
        except ToolError as exc:
            raise ToolError(f"block {number}: {exc}") from None
    return text


def _complete_prefix(code: str) -> ast.Module:
    """The longest prefix of `code` that parses (a sampled answer cut off by the token limit)."""
    lines = code.rstrip().split("\n")
    for end in range(len(lines), 0, -1):
        try:
            return ast.parse("\n".join(lines[:end]))
        except SyntaxError:
            continue
    raise ToolError("the code does not parse as Python")


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.setdefault(node.name, node)
    return found


def _span(node: ast.AST) -> tuple[int, int]:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno or node.lineno


def replace_definitions(before: str, code: str) -> str:
    """`before` with each definition named in `code` replaced by the one in `code` (Python only).

    The lenient edit form small models manage best: they rewrite a whole function rather than quote
    the lines to change. Definitions of `code` the file does not have are ignored.
    """
    new_tree = _complete_prefix(code)
    try:
        old_defs = _definitions(ast.parse(before))
    except SyntaxError as exc:
        raise ToolError(f"the file does not parse ({exc.msg}); use SEARCH/REPLACE blocks") from exc
    code_lines = code.split("\n")
    lines = before.split("\n")
    replacements = []
    seen: set[str] = set()
    for node in new_tree.body:
        if (
            not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            or node.name not in old_defs
            or node.name in seen  # a name defined twice: the first one is the answer
        ):
            continue
        seen.add(node.name)
        start, end = _span(node)
        old_start, old_end = _span(old_defs[node.name])
        new_text = code_lines[start - 1 : end]
        indent = _indent(lines[old_start - 1])
        new_text = _reindent(new_text, indent, _indent(new_text[0]))
        replacements.append((old_start, old_end, new_text))
    if not replacements:
        raise ToolError(
            "the code defines nothing this file defines; quote the lines to change with SEARCH/REPLACE blocks"
        )
    for old_start, old_end, new_text in sorted(replacements, reverse=True):
        lines[old_start - 1 : old_end] = new_text
    return "\n".join(lines)


def new_text_for(before: str, args: dict) -> str:
    """The file's text after the edit `args` (SEARCH/REPLACE `blocks`, or whole definitions `code`)."""
    if "blocks" in args:
        return apply_blocks(before, parse_blocks(args["blocks"]))
    if isinstance(args.get("code"), str) and args["code"].strip():
        return replace_definitions(before, args["code"])
    raise ToolError("an edit needs 'blocks' (search/replace) or 'code' (whole definitions)")


def check_edit(ctx: ToolContext, path, before: str, after: str) -> EditCheck:
    syntax, lint = lint_change(ctx, path, before, after)
    types, notes = gate_check(ctx, path, before, after) if not syntax else ([], [])
    ok = not syntax and not lint and not types
    return EditCheck(ok, syntax, [d.render() for d in lint], before, after, types, notes)


def _excerpt(text: str, around: set[int], context: int = 3) -> str:
    lines = text.splitlines()
    if not lines:
        return "(empty)"
    keep = sorted(
        {n for line in around for n in range(line - context, line + context + 1) if 1 <= n <= len(lines)}
    ) or list(range(1, min(len(lines), 2 * context) + 1))
    return "\n".join(f"{n:>5} {lines[n - 1]}" for n in keep)


def _changed_lines(before: str, after: str) -> tuple[set[int], set[int]]:
    import difflib

    old, new = set(), set()
    matcher = difflib.SequenceMatcher(a=before.splitlines(), b=after.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            old.update(range(i1 + 1, max(i2, i1 + 1) + 1))
            new.update(range(j1 + 1, max(j2, j1 + 1) + 1))
    return old, new


def rejection_message(rel: str, check: EditCheck) -> str:
    old, new = _changed_lines(check.before, check.after)
    errors = "\n".join(check.syntax + check.lint + check.types)
    return (
        f"edit of {rel} rejected, the file is unchanged. It would introduce:\n{errors}\n"
        f"--- your proposed code:\n{_excerpt(check.after, new)}\n"
        f"--- the original:\n{_excerpt(check.before, old)}\nFix the edit and try again."
    )


def parse_blocks(raw) -> list[Block]:
    if not isinstance(raw, list) or not raw:
        raise ToolError("blocks must be a non-empty list of {search, replace} objects")
    blocks = []
    for item in raw:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("search"), str)
            or not isinstance(item.get("replace"), str)
        ):
            raise ToolError("each block needs a string 'search' and a string 'replace'")
        blocks.append(Block(item["search"], item["replace"]))
    return blocks


def edit(ctx: ToolContext, args: dict) -> ToolResult:
    path = ctx.workspace.resolve(args["path"])
    rel = ctx.workspace.rel(path)
    try:
        before = ctx.overlay.read(path)
    except ToolError:
        blocks = args.get("blocks")
        if not (
            isinstance(blocks, list)
            and blocks
            and isinstance(blocks[0], dict)
            and blocks[0].get("search") == ""
        ):
            raise
        before = ""
    after = new_text_for(before, args)
    if after == before:
        return ToolResult(False, f"edit of {rel} changes nothing")
    check = check_edit(ctx, path, before, after)
    if not check.ok:
        return ToolResult(
            False,
            rejection_message(rel, check),
            {"rejected": True, "syntax": check.syntax, "lint": check.lint, "types": check.types},
        )
    ctx.overlay.write(path, after)
    diff = unified_diff(rel, before, after)
    return ToolResult(True, f"edited {rel}:\n{diff}{notes_text(check.notes)}", {"path": str(path)})


EDIT = Tool(
    "edit",
    "Change a file with search/replace blocks (each search text must match one place). Rejected, "
    "with the errors shown, when it introduces a syntax error or new lint (or type) errors.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "blocks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"search": {"type": "string"}, "replace": {"type": "string"}},
                    "required": ["search", "replace"],
                },
            },
            "code": {"type": "string", "description": "whole definitions replacing those of the same name"},
        },
        "required": ["path"],
    },
    edit,
)
