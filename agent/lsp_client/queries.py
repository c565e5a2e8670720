"""What the agent asks language servers, as typed records: diagnostics, locations, hover, symbols,
and rename's workspace edit turned into new file texts.

Each function takes the workspace's `LanguageServers`, the overlay and a list that collects notes
(one line per server that was missing, hung or crashed); an answer nobody could give is empty or
None, never an exception.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ToolError
from .client import LanguageServerClient
from .positions import TextEdit, apply_text_edits, path_to_uri, python_column, uri_to_path, utf16_column
from .servers import LanguageServers

__all__ = [
    "LspDiagnostic",
    "Location",
    "DocumentSymbol",
    "file_diagnostics",
    "introduced_errors",
    "definition",
    "references",
    "hover",
    "document_symbols",
    "rename_edit",
    "lsp_position",
]

SEVERITIES = {1: "error", 2: "warning", 3: "information", 4: "hint"}
_SYMBOL_KINDS = {
    1: "file",
    2: "module",
    3: "namespace",
    4: "package",
    5: "class",
    6: "method",
    7: "property",
    8: "field",
    9: "constructor",
    10: "enum",
    11: "interface",
    12: "function",
    13: "variable",
    14: "constant",
    15: "string",
    16: "number",
    17: "boolean",
    18: "array",
    19: "object",
    20: "key",
    21: "null",
    22: "enum member",
    23: "struct",
    24: "event",
    25: "operator",
    26: "type parameter",
}


@dataclass(frozen=True)
class LspDiagnostic:
    """One server's finding; `key` leaves out the line so that shifted lines still compare equal."""

    server: str
    line: int  # 1-based
    column: int  # 1-based, Python characters
    severity: str
    code: str
    message: str
    source_line: str
    type_check: bool  # from a server whose errors the edit gate may count

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.server, self.code, self.message, self.source_line.strip())

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def render(self) -> str:
        code = f" {self.code}" if self.code else ""
        first = self.message.splitlines()[0] if self.message else ""
        return f"line {self.line}: {self.severity}{code} ({self.server}) {first}"


@dataclass(frozen=True)
class Location:
    path: Path
    line: int  # 1-based
    column: int  # 1-based
    text: str  # the line's text, stripped


@dataclass(frozen=True)
class DocumentSymbol:
    name: str
    kind: str
    line: int  # 1-based
    depth: int  # 0 for top-level symbols


def lsp_position(text: str, line: int, column: int) -> dict[str, int]:
    """The LSP position of 1-based `line` and 1-based Python `column` in `text`."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise ToolError(f"line {line} is outside the file (it has {len(lines)} lines)")
    return {"line": line - 1, "character": utf16_column(lines[line - 1], max(column - 1, 0))}


def _to_diagnostic(client: LanguageServerClient, raw: dict[str, Any], lines: list[str]) -> LspDiagnostic:
    start = raw.get("range", {}).get("start", {})
    row = int(start.get("line", 0))
    source = lines[row] if 0 <= row < len(lines) else ""
    code = raw.get("code")
    return LspDiagnostic(
        client.spec.name,
        row + 1,
        python_column(source, int(start.get("character", 0))) + 1,
        SEVERITIES.get(raw.get("severity") or 1, "error"),
        str(code) if code is not None else "",
        str(raw.get("message", "")),
        source,
        client.spec.checks_types,
    )


def file_diagnostics(
    servers: LanguageServers,
    overlay: Any,
    path: Path,
    notes: list[str],
    type_checkers_only: bool = False,
    answered: set[str] | None = None,
) -> list[LspDiagnostic]:
    """Every server's diagnostics of the overlay's `path`, in line order; the names of the servers
    that answered are added to `answered`."""
    text = overlay.read(path)
    lines = text.split("\n")
    found: list[LspDiagnostic] = []
    for client in servers.clients_for(path, notes):
        if type_checkers_only and not client.spec.checks_types:
            continue
        items = servers.run(client, overlay, [path], lambda c: c.diagnostics(path), notes)
        if items is None:
            continue
        if answered is not None:
            answered.add(client.spec.name)
        found.extend(_to_diagnostic(client, raw, lines) for raw in items)
    return sorted(found, key=lambda d: (d.line, d.column, d.server))


def introduced_errors(before: list[LspDiagnostic], after: list[LspDiagnostic]) -> list[LspDiagnostic]:
    """Errors of `after` that `before` did not have (as a multiset of keys)."""
    left = Counter(d.key for d in before if d.is_error)
    new = []
    for diag in after:
        if not diag.is_error:
            continue
        if left[diag.key] > 0:
            left[diag.key] -= 1
        else:
            new.append(diag)
    return new


def _locations(overlay: Any, answer: Any) -> list[Location]:
    if answer is None:
        return []
    items = answer if isinstance(answer, list) else [answer]
    out = []
    for item in items:
        uri = item.get("targetUri") or item.get("uri")
        rng = item.get("targetSelectionRange") or item.get("range") or {}
        if not uri:
            continue
        path = uri_to_path(uri)
        row = int(rng.get("start", {}).get("line", 0))
        try:
            lines = overlay.read(path).split("\n")
        except ToolError:
            lines = []  # outside the workspace (a library's stub): no text to show
        source = lines[row] if 0 <= row < len(lines) else ""
        column = python_column(source, int(rng.get("start", {}).get("character", 0))) + 1
        out.append(Location(path, row + 1, column, source.strip()))
    return out


def _position_params(path: Path, position: dict[str, int]) -> dict[str, Any]:
    return {"textDocument": {"uri": path_to_uri(path)}, "position": position}


def definition(servers: LanguageServers, overlay: Any, path: Path, position: dict, notes: list[str]):
    answer = servers.query_first(
        overlay,
        path,
        "definitionProvider",
        lambda c: c.request("textDocument/definition", _position_params(path, position)),
        notes,
    )
    return _locations(overlay, answer)


def references(servers: LanguageServers, overlay: Any, path: Path, position: dict, notes: list[str]):
    params = {**_position_params(path, position), "context": {"includeDeclaration": True}}
    answer = servers.query_first(
        overlay, path, "referencesProvider", lambda c: c.request("textDocument/references", params), notes
    )
    return sorted(_locations(overlay, answer), key=lambda loc: (str(loc.path), loc.line, loc.column))


def _hover_text(contents: Any) -> str:
    if isinstance(contents, str):
        return contents
    if isinstance(contents, dict):
        return str(contents.get("value", ""))
    if isinstance(contents, list):
        return "\n\n".join(_hover_text(part) for part in contents)
    return ""


def hover(servers: LanguageServers, overlay: Any, path: Path, position: dict, notes: list[str]) -> str | None:
    answer = servers.query_first(
        overlay,
        path,
        "hoverProvider",
        lambda c: c.request("textDocument/hover", _position_params(path, position)) or {},
        notes,
    )
    text = _hover_text((answer or {}).get("contents")).strip()
    return text or None


def _flatten_symbols(items: list[dict], depth: int, out: list[DocumentSymbol]) -> None:
    for item in items:
        rng = item.get("selectionRange") or item.get("range") or item.get("location", {}).get("range", {})
        kind = _SYMBOL_KINDS.get(item.get("kind"), "symbol")
        out.append(
            DocumentSymbol(item.get("name", "?"), kind, int(rng.get("start", {}).get("line", 0)) + 1, depth)
        )
        _flatten_symbols(item.get("children") or [], depth + 1, out)


def document_symbols(servers: LanguageServers, overlay: Any, path: Path, notes: list[str]):
    params = {"textDocument": {"uri": path_to_uri(path)}}
    answer = servers.query_first(
        overlay,
        path,
        "documentSymbolProvider",
        lambda c: c.request("textDocument/documentSymbol", params) or [],
        notes,
    )
    out: list[DocumentSymbol] = []
    _flatten_symbols(answer or [], 0, out)
    return out


def _edits_by_path(workspace_edit: dict[str, Any]) -> dict[Path, list[TextEdit]]:
    by_path: dict[Path, list[TextEdit]] = {}
    for uri, edits in (workspace_edit.get("changes") or {}).items():
        by_path.setdefault(uri_to_path(uri), []).extend(TextEdit.from_lsp(e) for e in edits)
    for change in workspace_edit.get("documentChanges") or []:
        if "kind" in change:  # create, rename or delete a file: not something an overlay edit does
            raise ToolError(f"the server's rename also wants to {change['kind']} a file; not applied")
        path = uri_to_path(change["textDocument"]["uri"])
        by_path.setdefault(path, []).extend(TextEdit.from_lsp(e) for e in change.get("edits") or [])
    return by_path


def rename_edit(
    servers: LanguageServers, overlay: Any, path: Path, position: dict, new_name: str, notes: list[str]
) -> dict[Path, str] | None:
    """The new text of every file the server's rename changes, or None when no server renames."""
    params = {**_position_params(path, position), "newName": new_name}
    answer = servers.query_first(
        overlay, path, "renameProvider", lambda c: c.request("textDocument/rename", params) or {}, notes
    )
    if not answer:
        return None
    return {
        target: apply_text_edits(overlay.read(target), edits)
        for target, edits in _edits_by_path(answer).items()
    }
