"""Retrieval quality on the running interpreter's standard library, against a labelled query set.

`tests/data/stdlib_queries.json` was written by reading the stdlib sources (Python 3.11), not from
index output: "where is X defined" and "code that does Y" questions, each with the definitions that
answer it. Split "dev" (104 queries) was used while tuning the retrieval (an audit of its misses
added 9 answers that genuinely implement the behaviour asked); split "holdout" (32) was written
after the tuning and only measured (2 such answers added by the same audit). A hit counts when its
file matches and it names the definition (same last name part) or its line range holds the
definition's `def`/`class` line without being an enclosing definition (a class hit does not answer
a question about one of its methods).

The stdlib (without site-packages, its test suites, compiled modules and caches) is copied into a
temporary folder and indexed once per module with the real Indexer. `evaluate` is shared with
bench/bench_index.py.

Issue 3 asks for fused recall@5 >= 0.9. Lexical retrieval alone reaches 0.85 on dev and 0.66 on
holdout (0.80 overall); `test_stdlib_recall` guards that level. With the semantic ranker (the
`embeddings` extra) fused in, `test_stdlib_recall_with_semantic_ranker` and
`test_stdlib_recall_meets_the_issue_target` measure the whole query set. Embedding the ~17k chunks
takes about two minutes on two cores, so the vectors are kept in the shared vector cache (keyed by
content): a fresh machine pays that once, later runs read them back in seconds.
tests/unit/index/test_semantic.py runs the ranker on a small repository.
"""

from __future__ import annotations

import ast
import json
import shutil
import sysconfig
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from context.index.embeddings import (
    ChunkEmbedder,
    EmbedderConfig,
    embeddings_available,
)
from context.index.indexer import Indexer
from context.index.retrieval import MODES, search
from context.index.semantic import SemanticRanker, VectorCache, default_vector_cache_path, embed_pending
from context.index.store import IndexStore

__all__ = ["HELD_OUT_PATH", "QUERIES_PATH", "STDLIB", "Expected", "copy_stdlib", "evaluate", "load_queries"]

QUERIES_PATH = Path(__file__).resolve().parents[2] / "data" / "stdlib_queries.json"
# Questions written for issue 25 (the agent's search) before any measurement, never tuned on.
HELD_OUT_PATH = QUERIES_PATH.with_name("stdlib_symbol_queries.json")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Not the standard library proper (installed packages, compiled modules, caches), or its own tests.
_COPY_IGNORE = shutil.ignore_patterns(
    "site-packages",
    "dist-packages",
    "lib-dynload",
    "__pycache__",
    "config-*",
    "*.pyc",
    "*.so",
    "test",
    "idle_test",
    "tests",
)
RECALL_AT = 5
MRR_AT = 10
LEXICAL_MODES = tuple(m for m in MODES if m != "semantic")


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


def evaluate(store, queries: list[dict], mode: str, semantic=None) -> dict:
    """recall@5, MRR@10 and the queries missed at 5 for one search mode."""
    found_at_5, reciprocal, missed = 0, 0.0, []
    for q in queries:
        hits = search(store, q["query"], MRR_AT, mode=mode, semantic=semantic)
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


@dataclass
class StdlibIndex:
    root: Path
    store: IndexStore
    report: object  # the full pass's IndexReport
    seconds: float


@pytest.fixture(scope="module")
def stdlib_index(tmp_path_factory):
    """A copy of the running interpreter's standard library, indexed once for this module."""
    base = tmp_path_factory.mktemp("stdlib")
    root = copy_stdlib(base / "python3")
    store = IndexStore(base / "index.db")
    started = time.monotonic()
    report = Indexer([root], store).index_all()
    yield StdlibIndex(root, store, report, time.monotonic() - started)
    store.close()


@pytest.fixture(scope="module")
def stdlib_store(stdlib_index):
    return stdlib_index.store


def test_index_the_running_interpreters_standard_library(stdlib_index):
    """A real code base: every file parsed, its symbols, chunks and references stored, and a second
    pass over unchanged files parses nothing."""
    store, report = stdlib_index.store, stdlib_index.report
    started = time.monotonic()
    again = Indexer([stdlib_index.root], store).index_all()
    noop = time.monotonic() - started
    size_mb = store.path.stat().st_size / 1e6
    print(f"\nstdlib copy: {report.files} files, {report.chunks} chunks, {report.symbols} symbols, "
          f"skipped {dict(report.skipped)}; full pass {stdlib_index.seconds:.1f}s, no-op pass {noop:.2f}s, "
          f"database {size_mb:.0f} MB")
    # CPython 3.11's library without its tests: 755 files, 22.6k symbols, 17.3k chunks.
    assert report.files > 600 and report.symbols > 18_000 and report.chunks > 14_000
    assert store.stats()["references"] > 80_000  # 114k
    assert again.parsed == 0 and again.removed == 0 and noop < 5
    found = store.symbols_named(["urlsplit"], 5)
    assert any(s.rel == "urllib/parse.py" and s.kind == "function" for s in found)
    assert any(h.rel == "urllib/parse.py" for h in store.fts_chunks("url split", 10))


def test_query_set_is_well_formed_and_resolves_in_this_stdlib():
    queries = load_queries()
    assert len(queries) >= 60
    assert {q["kind"] for q in queries} == {"definition", "behaviour"}
    assert {q["split"] for q in queries} == {"dev", "holdout"}
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
    return any(
        "_" in w or "." in w.strip(".") or (w[1:] != w[1:].lower() and not w.isupper()) for w in query.split()
    )


# The level reached on Python 3.11.7 (dev 0.846, holdout 0.656, all 0.801), a query of slack.
RECALL_FLOOR = {"dev": 0.83, "holdout": 0.62, "all": 0.79}
ISSUE_TARGET = 0.9


@pytest.fixture(scope="module")
def results(stdlib_store) -> dict[tuple[str, str], dict]:
    queries = load_queries()
    out = {}
    for split in ("dev", "holdout", "all"):
        subset = [q for q in queries if split in ("all", q["split"])]
        for mode in LEXICAL_MODES:
            out[(split, mode)] = evaluate(stdlib_store, subset, mode)
    return out


def test_stdlib_recall(results, capsys):
    with capsys.disabled():
        print(f"\nstdlib retrieval (recall@{RECALL_AT}, MRR@{MRR_AT}):")
        for (split, mode), r in results.items():
            print(
                f"  {split:8s} {mode:8s} n={r['n']:3d}  recall@{RECALL_AT} = {r['recall@5']:.3f}  "
                f"MRR = {r['mrr']:.3f}"
            )
        misses = len(results[("all", "fused")]["missed"])
        print(f"  fused misses at {RECALL_AT}: {misses} (bench/bench_index.py lists them)")
    for split, floor in RECALL_FLOOR.items():
        assert results[(split, "fused")]["recall@5"] >= floor, results[(split, "fused")]["missed"]
    for split in ("dev", "holdout", "all"):
        fused = results[(split, "fused")]
        for single in ("bm25", "symbols"):
            assert fused["recall@5"] >= results[(split, single)]["recall@5"], split
            assert fused["mrr"] >= results[(split, single)]["mrr"] - 0.02, split


# The shared cache as configured when the tests start (fixtures may point XDG_CACHE_HOME elsewhere).
VECTOR_CACHE = default_vector_cache_path(EmbedderConfig().model_id)
# What the cache must hold of the tree's chunk vectors for the semantic measurements to run.
@pytest.fixture(scope="module")
def stdlib_ranker(stdlib_store) -> SemanticRanker:
    if not embeddings_available():
        pytest.skip("the embeddings extra is not installed")
    embedder = ChunkEmbedder(EmbedderConfig())
    cache = VectorCache(VECTOR_CACHE)
    try:
        # A fresh machine embeds the whole stdlib copy once (about two minutes on two cores) and
        # keeps the vectors in the shared cache; later runs read them from there in seconds.
        embed_pending(stdlib_store, embedder, cache=cache)
    finally:
        cache.close()
    return SemanticRanker(embedder)


@pytest.fixture(scope="module")
def semantic_results(stdlib_store, stdlib_ranker) -> dict[tuple[str, str], dict]:
    ranker = stdlib_ranker
    queries = load_queries()
    out = {}
    for mode in ("semantic", "fused"):
        for split in ("dev", "holdout"):
            out[(split, mode)] = evaluate(stdlib_store, [q for q in queries if q["split"] == split], mode,
                                          semantic=ranker)
        out[("all", mode)] = _combined(out[("dev", mode)], out[("holdout", mode)])
    return out


def _combined(a: dict, b: dict) -> dict:
    """The evaluation of two disjoint query sets together."""
    n = a["n"] + b["n"]
    return {"mode": a["mode"], "n": n, "missed": a["missed"] + b["missed"],
            "recall@5": (a["recall@5"] * a["n"] + b["recall@5"] * b["n"]) / n,
            "mrr": (a["mrr"] * a["n"] + b["mrr"] * b["n"]) / n}


# Reached with the semantic ranker (int8, 64 tokens) on Python 3.11.7, a query of slack.
SEMANTIC_FLOOR = {"dev": 0.90, "holdout": 0.84, "all": 0.89}


# Seconds on a quiet machine; minutes when the shared machine is loaded (235 s at load 17).
@pytest.mark.timeout(900)
def test_stdlib_recall_with_semantic_ranker(semantic_results, results, capsys):
    with capsys.disabled():
        print("\nstdlib retrieval with the semantic ranker:")
        for (split, mode), r in semantic_results.items():
            print(f"  {split:8s} {mode:8s} n={r['n']:3d}  recall@{RECALL_AT} = {r['recall@5']:.3f}  "
                  f"MRR = {r['mrr']:.3f}")
    for split, floor in SEMANTIC_FLOOR.items():
        fused = semantic_results[(split, "fused")]
        assert fused["recall@5"] >= floor, (split, fused["missed"])
        # Fusion keeps what the lexical rankers found and adds what only the embeddings find.
        assert fused["recall@5"] >= results[(split, "fused")]["recall@5"], split
        assert fused["recall@5"] >= semantic_results[(split, "semantic")]["recall@5"], split


@pytest.mark.timeout(900)
def test_stdlib_recall_meets_the_issue_target(semantic_results):
    assert semantic_results[("all", "fused")]["recall@5"] >= ISSUE_TARGET


# Issue 25 asks that the definition a question describes be in the agent's top 5 for at least 80%
# of questions. Reached on the held-out questions (Python 3.11.7): 0.676-0.690 from words alone,
# 0.803-0.817 with the semantic ranker (bench/bench_agent_search.py); floors a query below.
HELD_OUT_FLOOR = {"words": 0.66, "semantic": 0.79}


@pytest.mark.timeout(900)
def test_held_out_questions_find_their_definition(stdlib_store, stdlib_ranker, capsys):
    queries = load_queries(HELD_OUT_PATH)
    assert len(queries) >= 50 and {q["split"] for q in queries} == {"agent"}
    assert not {q["query"] for q in queries} & {q["query"] for q in load_queries()}
    words = evaluate(stdlib_store, queries, "fused")
    semantic = evaluate(stdlib_store, queries, "fused", semantic=stdlib_ranker)
    with capsys.disabled():
        print(f"\nheld-out questions (n={len(queries)}): recall@{RECALL_AT} {words['recall@5']:.3f} "
              f"from words, {semantic['recall@5']:.3f} with the semantic ranker")
    assert words["recall@5"] >= HELD_OUT_FLOOR["words"], words["missed"]
    assert semantic["recall@5"] >= HELD_OUT_FLOOR["semantic"], semantic["missed"]
    assert semantic["mrr"] > words["mrr"]
