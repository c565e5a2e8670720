"""The repository index: walk, parse (tree-sitter), store (SQLite + FTS5), watch, retrieve, map."""

from .types import (
    SKIP_REASONS,
    Chunk,
    IndexReport,
    ParsedFile,
    Reference,
    SearchHit,
    SourceFile,
    Symbol,
    WalkResult,
)

__all__ = [
    "SKIP_REASONS",
    "Chunk",
    "IndexReport",
    "ParsedFile",
    "Reference",
    "SearchHit",
    "SourceFile",
    "Symbol",
    "WalkResult",
]
