"""Retrieval quality on the running interpreter's standard library, against a labelled query set.

`tests/data/stdlib_queries.json` was written by reading the stdlib sources (Python 3.11), not from
index output: "where is X defined" and "code that does Y" questions, each with the definitions that
answer it. A hit counts when its file matches and it names the definition (same last name part) or
its line range holds the definition's first line without being an enclosing definition (a class hit
does not answer a question about one of its methods).

The stdlib (without site-packages, its test suite and caches) is copied into a temporary folder and
indexed once per module with the real Indexer. `evaluate` is shared with bench/bench_index.py.
"""

from __future__ import annotations

import ast
import json
import shutil
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from context.index.indexer import Indexer
from context.index.retrieval import MODES, search
from context.index.store import IndexStore

__all__ = ["QUERIES_PATH", "STDLIB", "Expected", "copy_stdlib", "evaluate", "load_queries"]

QUERIES_PATH = Path(__file__).resolve().parents[2] / "data" / "stdlib_queries.json"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Not the standard library proper (installed packages, compiled modules, caches), or its own tests.
_COPY_IGNORE = shutil.ignore_patterns(
    "site-packages", "dist-packages", "lib-dynload", "__pycache__", "config-*", "*.pyc", "*.so", "test",
    "idle_test", "tests",
)
RECALL_AT = 5
MRR_AT = 10


@dataclass(frozen=True)
class Expected:
    rel: str
    symbol: str  # bare or dotted name, as in the query file
    start_line: int
    end_line: int


def _definitions(path: Path) -> dict[str, tuple[int, int]]:
    """Dotted name -> (`def`/`class` line, last line) of every class and function, through if/try blocks."""
    found: dict[str, tuple[int, int]] = {}
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

    def visit(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, scopes):
                found.setdefault(prefix + node.name, (node.lineno, node.end_lineno))
                visit(node.body, prefix + node.name + ".")
                continue
            for attr in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(node, attr, None)
                if isinstance(block, list):
                    visit(block, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


@cache
def _definitions_in(rel: str) -> dict[str, tuple[int, int]]:
    return _definitions(STDLIB / rel)


def load_queries(path: Path = QUERIES_PATH) -> list[dict]:
    """The labelled queries, each expected answer resolved to its line range in this stdlib."""
    queries = json.loads(path.read_text(encoding="utf-8"))
    for q in queries:
        q["resolved"] = [
            Expected(e["rel"], e["symbol"], *_definitions_in(e["rel"])[e["symbol"]]) for e in q["expected"]
        ]
    return queries


def is_hit(hit, expected: Expected) -> bool:
    if hit.rel != expected.rel:
        return False
    last = expected.symbol.rsplit(".", 1)[-1]
    if hit.symbol and hit.symbol.rsplit(".", 1)[-1] == last:
        return True
    encloses = hit.symbol is not None and expected.symbol.startswith(hit.symbol + ".")
    return hit.start_line <= expected.start_line <= hit.end_line and not encloses


def evaluate(store, queries: list[dict], mode: str) -> dict:
    """recall@5, MRR@10 and the queries missed at 5 for one search mode."""
    found_at_5, reciprocal, missed = 0, 0.0, []
    for q in queries:
        hits = search(store, q["query"], MRR_AT, mode=mode)
        rank = next((i for i, h in enumerate(hits, 1) if any(is_hit(h, e) for e in q["resolved"])), None)
        if rank is not None and rank <= RECALL_AT:
            found_at_5 += 1
        else:
            missed.append(q["query"])
        reciprocal += 1.0 / rank if rank else 0.0
    n = len(queries)
    return {"mode": mode, "recall@5": found_at_5 / n, "mrr": reciprocal / n, "missed": missed, "n": n}


def copy_stdlib(target: Path) -> Path:
    shutil.copytree(STDLIB, target, ignore=_COPY_IGNORE, symlinks=True)
    return target


@pytest.fixture(scope="module")
def stdlib_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("stdlib")
    root = copy_stdlib(base / "python3")
    store = IndexStore(base / "index.db")
    Indexer([root], store).index_all()
    yield store
    store.close()


def test_query_set_is_well_formed_and_resolves_in_this_stdlib():
    queries = load_queries()
    assert len(queries) >= 60
    kinds = {q["kind"] for q in queries}
    assert kinds == {"definition", "behaviour"}
    assert len({q["query"] for q in queries}) == len(queries)
    for q in queries:
        assert q["expected"], q["query"]
        for e in q["resolved"]:
            assert not e.rel.startswith(("test/", "idlelib/idle_test/")), e
            assert 1 <= e.start_line <= e.end_line


def test_behaviour_queries_rarely_name_the_answer():
    """Behaviour questions are written in other words: few plain-word ones contain an answer's name."""
    plain = [q for q in load_queries() if q["kind"] == "behaviour" and not _has_identifier(q["query"])]
    naming = []
    for q in plain:
        words = {w.lower() for w in q["query"].replace("-", " ").split()}
        if any(e["symbol"].rsplit(".", 1)[-1].lower() in words for e in q["expected"]):
            naming.append(q["query"])
    assert len(plain) >= 40
    assert len(naming) <= len(plain) // 20, naming


def _has_identifier(query: str) -> bool:
    """Mixed queries deliberately name a class or function (CamelCase, snake_case, dotted)."""
    return any("_" in w or "." in w.strip(".") or (w[1:] != w[1:].lower() and not w.isupper())
               for w in query.split())


def test_stdlib_recall(stdlib_store, capsys):
    queries = load_queries()
    results = {mode: evaluate(stdlib_store, queries, mode) for mode in MODES}
    with capsys.disabled():
        print(f"\nstdlib retrieval, {len(queries)} labelled queries:")
        for r in results.values():
            print(f"  {r['mode']:8s} recall@{RECALL_AT} = {r['recall@5']:.3f}  MRR@{MRR_AT} = {r['mrr']:.3f}")
        print("  fused misses:", results["fused"]["missed"])
    assert results["fused"]["recall@5"] >= 0.9, results["fused"]["missed"]
    assert results["fused"]["recall@5"] >= max(results["bm25"]["recall@5"], results["symbols"]["recall@5"])
