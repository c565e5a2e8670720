#!/usr/bin/env python
"""Does the agent's `search` tool find the definition a question describes? (issue 25 item 6)

On a copy of the running interpreter's standard library (the tree tests/unit/index/test_stdlib_recall.py
indexes), the agent's real `search` tool is asked each labelled question through the tool registry,
as the model would call it, and its answer text is read back: the question counts as answered at 5
when one of the first five hits names an expected definition (the same rule as the recall test: same
file, and the hit names the definition or its lines hold the `def`/`class` line without enclosing it).

Two arms, side by side in one process on one index:
  - "words only": the tool without a searcher (lexical fusion: BM25, synonyms, heads, symbol names),
    what it was before the semantic ranker reached the agent, and what a machine without the search
    model gets;
  - "with the semantic ranker": the tool with `store_searcher(store)`, what `squidcode agent` and
    `squidcode search` use once the index holds vectors (the server passes its own search, which is
    the same fusion).

Three question sets: the recall test's dev split (used to tune the lexical ranking), its holdout, and
`tests/data/stdlib_symbol_queries.json` (71 questions written for issue 25 before any measurement and
never used to tune). Per set and arm: the definition in the top 5 (the issue's measure), the file in
the top 5, MRR@10, and the tool call's p50 / p95 latency.

Vectors come from the shared vector cache; a fresh machine embeds the copy once (a few minutes,
one thread). Usage: python bench/bench_agent_search.py [--json FILE] [--misses]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from bench_foundation import cpu_info, loadavg, percentile  # noqa: E402

from agent.sandbox import Workspace  # noqa: E402
from agent.tools import ToolContext, default_registry  # noqa: E402
from context.config import AgentConfig  # noqa: E402
from context.index.embeddings import ChunkEmbedder, EmbedderConfig  # noqa: E402
from context.index.indexer import Indexer  # noqa: E402
from context.index.semantic import VectorCache, default_vector_cache_path, embed_pending, store_searcher  # noqa: E402
from context.index.store import IndexStore  # noqa: E402
from context.index.types import SearchHit  # noqa: E402
from tests.unit.index.test_stdlib_recall import copy_stdlib, is_hit, load_queries  # noqa: E402

HELD_OUT = REPO / "tests" / "data" / "stdlib_symbol_queries.json"
AT = 5
MRR_AT = 10


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tool_hits(output: str) -> list[SearchHit]:
    """The hits the tool's answer lists, in order: each part opens with `rel:start-end symbol`."""
    hits = []
    for part in output.split("\n\n"):
        head = part.strip("\n").split("\n", 1)[0]
        where, _, symbol = head.partition(" ")
        rel, _, lines = where.rpartition(":")
        start, _, end = lines.partition("-")
        if not rel or not start.isdigit() or not end.isdigit():
            continue
        hits.append(SearchHit(path=Path(rel), rel=rel, start_line=int(start), end_line=int(end),
                              symbol=symbol.strip() or None, score=0.0, text=""))
    return hits


def evaluate(ctx: ToolContext, queries: list[dict]) -> dict:
    registry = default_registry()
    found, files, reciprocal, times, missed = 0, 0, 0.0, [], []
    for q in queries:
        started = time.perf_counter()
        result = registry.call(ctx, "search", {"query": q["query"], "k": MRR_AT})
        times.append((time.perf_counter() - started) * 1000)
        hits = tool_hits(result.output) if result.ok else []
        rank = next((i for i, h in enumerate(hits, 1) if any(is_hit(h, e) for e in q["resolved"])), None)
        if rank is not None and rank <= AT:
            found += 1
        else:
            missed.append(q["query"])
        reciprocal += 1.0 / rank if rank else 0.0
        if any(h.rel == e.rel for h in hits[:AT] for e in q["resolved"]):
            files += 1
    n = len(queries)
    return {"n": n, "definition@5": found / n, "file@5": files / n, "mrr@10": reciprocal / n,
            "p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "missed": missed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--misses", action="store_true", help="list the questions each arm misses at 5")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the server's ranker and the embedding process run
    started_load = loadavg()
    old = load_queries()
    sets = {
        "dev (tuned on)": [q for q in old if q["split"] == "dev"],
        "holdout": [q for q in old if q["split"] == "holdout"],
        "held out, issue 25": load_queries(HELD_OUT),
    }
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = copy_stdlib(Path(tmp) / "python3")
        store = IndexStore(Path(tmp) / "index.db")
        progress("indexing the standard library copy")
        Indexer([root], store).index_all()
        progress("embedding (vectors from the shared cache where they are)")
        embedder = ChunkEmbedder(EmbedderConfig())
        cache = VectorCache(default_vector_cache_path(embedder.config.model_id))
        try:
            embed_pending(store, embedder, cache=cache)
        finally:
            cache.close()
        arms = {
            "words only": ToolContext(Workspace([root]), None, AgentConfig(), store),
            "with the semantic ranker": ToolContext(Workspace([root]), None, AgentConfig(), store,
                                                    searcher=store_searcher(store)),
        }
        arms["with the semantic ranker"].searcher("warm up the query model", 1)
        for name, queries in sets.items():
            for arm, ctx in arms.items():
                progress(f"{name}: {arm}")
                results[f"{name} | {arm}"] = evaluate(ctx, queries)
        store.close()
    print(f"\nCPU: {cpu_info()['model']}; load average {started_load} before, {loadavg()} after\n")
    print("| questions | search | definition in top 5 | file in top 5 | MRR@10 | tool p50 / p95 |")
    print("|---|---|---:|---:|---:|---:|")
    for key, r in results.items():
        name, arm = key.split(" | ")
        answered = round(r["definition@5"] * r["n"])
        print(f"| {name} ({r['n']}) | {arm} | {r['definition@5']:.3f} ({answered}) | {r['file@5']:.3f} | "
              f"{r['mrr@10']:.3f} | {r['p50_ms']:.0f} / {r['p95_ms']:.0f} ms |")
    if args.misses:
        for key, r in results.items():
            print(f"\n{key}: missed at 5\n" + "\n".join(f"  {m}" for m in r["missed"]))
    if args.json:
        record = {"cpu": cpu_info(), "load_before": started_load, "load_after": loadavg(), "results": results}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
