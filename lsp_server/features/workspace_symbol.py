"""workspace/symbol: definitions from the repository index whose names start with the query."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from ..server import SquidServer

__all__ = ["register", "to_lsp_symbol"]

_KINDS = {
    "function": types.SymbolKind.Function,
    "method": types.SymbolKind.Method,
    "class": types.SymbolKind.Class,
    "variable": types.SymbolKind.Variable,
    "constant": types.SymbolKind.Constant,
    "struct": types.SymbolKind.Struct,
    "enum": types.SymbolKind.Enum,
    "interface": types.SymbolKind.Interface,
    "trait": types.SymbolKind.Interface,
    "type": types.SymbolKind.TypeParameter,
    "module": types.SymbolKind.Module,
}


def to_lsp_symbol(row) -> types.WorkspaceSymbol:
    container = row.qualname.rpartition(".")[0] or None
    # Index lines are 1-based and inclusive; LSP ranges are 0-based with an exclusive end.
    location = types.Location(
        uri=Path(row.path).as_uri(),
        range=types.Range(
            start=types.Position(line=row.start_line - 1, character=0),
            end=types.Position(line=row.end_line, character=0),
        ),
    )
    return types.WorkspaceSymbol(
        name=row.name,
        kind=_KINDS.get(row.kind, types.SymbolKind.Variable),
        location=location,
        container_name=container,
    )


def register(server: SquidServer) -> None:
    @server.feature(types.WORKSPACE_SYMBOL, types.WorkspaceSymbolOptions())
    def workspace_symbol(ls: SquidServer, params: types.WorkspaceSymbolParams) -> list[types.WorkspaceSymbol]:
        service = ls.index_service
        if service is None:
            return []
        return [to_lsp_symbol(row) for row in service.symbols(params.query, limit=200)]
