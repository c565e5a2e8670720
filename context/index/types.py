"""The values that flow through the repository index: walk -> parse -> store -> retrieve.

Lines are 1-based and inclusive everywhere in the index (as editors and `grep -n` show them);
the LSP layer converts to 0-based positions at its boundary.

Who produces what:
- `context.index.walk.walk_roots(roots, max_file_bytes) -> WalkResult`
- `context.index.parse.parse_source(text, rel_path) -> ParsedFile` (tree-sitter, line-window fallback)
- `context.index.store.IndexStore` (SQLite WAL + FTS5) and `context.index.indexer.Indexer`
  (incremental indexing of roots into a store; overlays for unsaved buffers)
- `context.index.watcher.IndexWatcher` (watchdog, debounced, feeding the indexer)
- `context.index.retrieval.search(store, query, k) -> list[SearchHit]` (BM25 + symbols, RRF)
- `context.index.repomap.render_repo_map(store, focus, names, token_budget, count_tokens) -> str`
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SourceFile",
    "WalkResult",
    "Symbol",
    "Reference",
    "Chunk",
    "ParsedFile",
    "SearchHit",
    "IndexReport",
    "SKIP_REASONS",
]

# Every file the walk passes over is counted under exactly one of these reasons.
SKIP_REASONS = (
    "ignored",  # .gitignore / not in git's file list / a VCS or cache folder
    "binary",  # NUL bytes or not decodable as UTF-8
    "generated",  # minified or generated (very long lines, "generated" markers, lock files)
    "too_large",  # over the size limit
    "unreadable",  # permission denied, vanished while read, broken link
    "symlink_loop",  # a symlink cycle or a link leaving the roots
)


@dataclass(frozen=True)
class SourceFile:
    """A file the walk decided to index."""

    root: Path  # the workspace root it was found under (absolute)
    path: Path  # absolute path
    rel: str  # path relative to root, POSIX separators
    size: int
    mtime: float


@dataclass
class WalkResult:
    files: list[SourceFile] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> count


@dataclass(frozen=True)
class Symbol:
    """A definition: function, class, method, (module-level) variable, struct, trait, ..."""

    name: str  # the bare name, e.g. "urlsplit"
    qualname: str  # dotted within the file, e.g. "SplitResult.geturl"
    kind: str  # "function" | "class" | "method" | "variable" | "struct" | "interface" | ...
    start_line: int
    end_line: int
    signature: str  # the definition's header as written, e.g. "def urlsplit(url, scheme='', ...):"


@dataclass(frozen=True)
class Reference:
    """A use of a name (identifier in a call, attribute access, type position...)."""

    name: str
    line: int


@dataclass(frozen=True)
class Chunk:
    """A retrievable piece of a file: one definition (large ones split), merged small neighbours,
    or a line window for files without a grammar."""

    start_line: int
    end_line: int
    text: str
    symbol: str | None  # qualname of the definition it covers, None for windows / module code
    kind: str  # "definition" | "merged" | "window"


@dataclass
class ParsedFile:
    language: str | None  # None: no grammar, chunks are line windows
    chunks: list[Chunk] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)


@dataclass(frozen=True)
class SearchHit:
    path: str  # absolute path
    rel: str  # relative to its root
    start_line: int
    end_line: int
    symbol: str | None
    score: float
    text: str = ""


@dataclass
class IndexReport:
    """What one indexing pass did (the `squidcode index --json` object)."""

    files: int = 0  # files in the index after the pass
    chunks: int = 0
    symbols: int = 0
    skipped: Counter = field(default_factory=Counter)
    parsed: int = 0  # files (re)parsed in this pass
    removed: int = 0  # files dropped from the index in this pass
    seconds: float = 0.0
