"""The index commands of the CLI: `squidcode index`, `squidcode search`, `squidcode map`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from context.config import SquidConfig, load_file_config
from context.errors import SquidcodeError
from context.index.indexer import Indexer, default_index_path
from context.index.repomap import render_repo_map
from context.index.semantic import (
    VectorCache,
    default_ranker,
    default_vector_cache_path,
    embed_pending,
    store_searcher,
)
from context.index.store import IndexStore
from context.index.types import IndexReport
from context.progress import progress
from context.runtime import model_token_counter

__all__ = ["run_index", "run_search", "run_map"]


def _open(root: Path) -> tuple[IndexStore, Indexer, SquidConfig]:
    config, problems = load_file_config([root])
    for problem in problems:
        print(f"squidcode: configuration: {problem}", file=sys.stderr)
    store = IndexStore(default_index_path([root]))
    if store.recovered_from is not None:
        print(f"squidcode: the index database was corrupt; moved aside to {store.recovered_from} "
              "and rebuilt", file=sys.stderr)
    return store, Indexer([root], store, max_file_bytes=config.index.max_file_bytes), config


def _open_indexed(root: Path) -> tuple[IndexStore, SquidConfig]:
    """The store of `root`, indexed first when it holds nothing yet, its chunks embedded."""
    store, indexer, config = _open(root)
    if store.stats()["files"] == 0:
        _index_with_progress(indexer, root)
    _embed_with_progress(store, config)
    return store, config


def _embed_with_progress(store: IndexStore, config: SquidConfig) -> None:
    """Vectors for the chunks that have none, so that search fuses the semantic ranker as the
    server's does: after the first run only new or changed chunks (vectors are shared by content
    through the user's cache). Nothing without the search model or with `index.embeddings` off; a
    failure leaves search lexical, said on stderr."""
    ranker = default_ranker() if config.index.embeddings else None
    if ranker is None:
        return
    embedded, total = store.vector_counts()
    if store.vector_model() != ranker.embedder.model_id:
        embedded = 0
    if embedded == total:
        return
    cache = VectorCache(default_vector_cache_path(ranker.embedder.model_id))
    try:
        with progress(total - embedded, "embedding for semantic search", unit="chunks") as shown:
            embed_pending(store, ranker.embedder, cache=cache, progress=shown.update_to)
    except SquidcodeError as exc:
        print(f"squidcode: semantic search unavailable ({exc}); searching by words only", file=sys.stderr)
    finally:
        cache.close()


def _index_with_progress(indexer: Indexer, root: Path) -> IndexReport:
    """A full pass, its progress on stderr (stdout carries the command's result)."""
    with progress(None, f"indexing {root}", unit="files") as shown:
        return indexer.index_all(progress=shown.update_to)


def _check_root(path: Path) -> Path | None:
    root = path.resolve()
    if not root.is_dir():
        print(f"squidcode: {path} is not a folder", file=sys.stderr)
        return None
    return root


def run_index(path: Path, as_json: bool) -> int:
    root = _check_root(path)
    if root is None:
        return 2
    store, indexer, config = _open(root)
    with store:
        report = _index_with_progress(indexer, root)
        _embed_with_progress(store, config)
    summary = {
        "files": report.files, "chunks": report.chunks, "symbols": report.symbols,
        "skipped": dict(sorted(report.skipped.items())), "seconds": round(report.seconds, 3),
    }
    if as_json:
        print(json.dumps(summary))
    else:
        skipped = ", ".join(f"{n} {reason}" for reason, n in summary["skipped"].items()) or "none"
        print(f"indexed {root}: {report.files} files, {report.chunks} chunks, {report.symbols} symbols "
              f"({report.parsed} parsed, {report.removed} removed) in {report.seconds:.1f}s; "
              f"skipped: {skipped}")
    return 0


def run_search(path: Path, query: str, k: int, as_json: bool) -> int:
    root = _check_root(path)
    if root is None:
        return 2
    store, _ = _open_indexed(root)
    with store:
        hits = store_searcher(store)(query, k)
    rows = [
        {"path": os.path.relpath(hit.path, root), "start_line": hit.start_line, "end_line": hit.end_line,
         "symbol": hit.symbol, "score": round(hit.score, 6)}
        for hit in hits
    ]
    if as_json:
        print(json.dumps(rows))
    elif not rows:
        print("(no results)")
    else:
        for row in rows:
            print(f"{row['path']}:{row['start_line']}-{row['end_line']}  {row['symbol'] or ''}  "
                  f"{row['score']:.4f}")
    return 0


def run_map(path: Path, focus: Path | None, tokens: int) -> int:
    root = _check_root(path)
    if root is None:
        return 2
    store, config = _open_indexed(root)
    with store:
        focus_path = str(focus.resolve()) if focus else None
        counter = model_token_counter(config.resolved_cache_dir())
        kwargs = {"count_tokens": counter} if counter else {}
        print(render_repo_map(store, focus=focus_path, token_budget=tokens, **kwargs))
    return 0
