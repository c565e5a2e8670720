#!/usr/bin/env python
"""The semantic ranker on the standard library copy (issue 3): embedding speed and retrieval quality.

1. Speed of the model settings, side by side on the same 256 sampled chunk heads, one torch thread:
   fp32 and int8 (dynamic, per-channel) at 64 and 128 tokens, chunks/s, and the cosine of each
   setting's vectors to fp32 at the same length.
2. The full embedding pass of the index with the default setting through `embed_pending` (the code
   the background process runs), with the shared vector cache (so it also fills the cache the recall
   test reads; `--no-cache` measures the model alone), niced and on one thread.
3. recall@5 / MRR@10 per mode (bm25, symbols, semantic, fused) per split (dev / holdout / all).
4. Search latency with the semantic ranker, p50 / p95 over the labelled queries: cold (the query
   is embedded inside the timed call, as for a new question) and warm (its vector is cached).

Run it niced on a shared machine: `nice -n 10 python bench/bench_index_embed.py`.

`--full-stdlib` indexes the interpreter's whole standard library in place (test suites included,
as issue 3 names it) instead of the copy the labelled queries were written on.

Usage: python bench/bench_index_embed.py [--sample N] [--passes N] [--full-stdlib] [--no-cache] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from bench_foundation import loadavg, machine_info  # noqa: E402

from context.index.embeddings import ChunkEmbedder, EmbedderConfig, embedding_text  # noqa: E402
from context.index.indexer import Indexer  # noqa: E402
from context.index.retrieval import MODES, search  # noqa: E402
from context.index.semantic import (  # noqa: E402
    SemanticRanker,
    VectorCache,
    default_vector_cache_path,
    embed_pending,
)
from context.index.store import IndexStore  # noqa: E402
from tests.unit.index.test_stdlib_recall import STDLIB, copy_stdlib, evaluate, load_queries  # noqa: E402

SETTINGS = [("fp32", False, 64), ("int8", True, 64), ("fp32", False, 128), ("int8", True, 128)]


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def speed(store: IndexStore, sample: int) -> list[dict]:
    rows = store.chunks_without_vectors(10**7)
    random.Random(0).shuffle(rows)
    texts = [embedding_text(r[1], r[2], r[3]) for r in rows[:sample]]
    out, reference = [], {}
    for name, quantize, tokens in SETTINGS:
        embedder = ChunkEmbedder(EmbedderConfig(max_tokens=tokens, quantize=quantize))
        embedder.load()
        embedder.embed(texts[:32])  # warm up
        t0 = time.perf_counter()
        vectors = embedder.embed(texts)
        seconds = time.perf_counter() - t0
        if not quantize:
            reference[tokens] = vectors
        cosine = (vectors * reference[tokens]).sum(axis=1)
        out.append({"setting": f"{name}/{tokens}", "chunks_per_s": len(texts) / seconds,
                    "cos_to_fp32_mean": float(cosine.mean()), "cos_to_fp32_min": float(cosine.min())})
        progress(f"{name}/{tokens}: {out[-1]['chunks_per_s']:.1f} chunks/s")
    return out


def quality(store: IndexStore, ranker: SemanticRanker) -> dict:
    queries = load_queries()
    out = {}
    for mode in MODES:
        out[mode] = {}
        for split in ("dev", "holdout", "all"):
            subset = [q for q in queries if split in ("all", q["split"])]
            r = evaluate(store, subset, mode, semantic=ranker)
            out[mode][split] = {k: r[k] for k in ("recall@5", "mrr", "n", "missed")}
    return out


def _percentiles(samples_ms: list[float]) -> dict:
    ordered = sorted(samples_ms)
    return {"n": len(ordered), "p50_ms": statistics.median(ordered),
            "p95_ms": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]}


def latency(store: IndexStore, ranker: SemanticRanker, passes: int) -> dict:
    """Wall time of `search(..., semantic=ranker)` per mode, cold and warm query vectors."""
    texts = [q["query"] for q in load_queries()]
    for text in texts[:8]:
        search(store, text, 10, mode="fused", semantic=ranker)  # model and matrix loaded
    out = {}
    for mode in ("semantic", "fused"):
        cold, warm = [], []
        for _ in range(passes):
            for text in texts:
                ranker._queries.clear()  # a question not asked before: the query is embedded
                t0 = time.perf_counter()
                search(store, text, 10, mode=mode, semantic=ranker)
                cold.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                search(store, text, 10, mode=mode, semantic=ranker)
                warm.append((time.perf_counter() - t0) * 1000)
        out[mode] = {"cold": _percentiles(cold), "warm": _percentiles(warm)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=256, help="chunks in the speed comparison")
    parser.add_argument("--passes", type=int, default=3, help="passes over the queries for latency")
    parser.add_argument("--full-stdlib", action="store_true", help="index the whole stdlib in place")
    parser.add_argument("--no-cache", action="store_true", help="embed without the shared vector cache")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {"machine": machine_info(), "load_before": loadavg(), "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="squid-bench-embed-") as tmp:
        root = STDLIB if args.full_stdlib else copy_stdlib(Path(tmp) / "python3")
        with IndexStore(Path(tmp) / "index.db") as store:
            indexed = Indexer([root], store).index_all()
            report["tree"] = {"root": str(root), "files": indexed.files, "chunks": indexed.chunks}
            progress(f"speed of {len(SETTINGS)} settings on {args.sample} chunks")
            report["speed"] = speed(store, args.sample) if args.sample else []
            config = EmbedderConfig()
            cache = None if args.no_cache else VectorCache(default_vector_cache_path(config.model_id))
            embedder = ChunkEmbedder(config)
            progress(f"embedding every chunk ({config.model_id}, cache: {cache.path if cache else 'none'})")
            done = embed_pending(store, embedder, cache=cache)
            report["embed"] = {"model_id": config.model_id, "chunks": store.vector_counts()[1],
                               "embedded": done.embedded, "from_cache": done.cached, "seconds": done.seconds,
                               "chunks_per_s": done.chunks_per_s}
            progress("quality")
            ranker = SemanticRanker(embedder)
            report["quality"] = quality(store, ranker)
            progress(f"search latency, {args.passes} passes")
            report["latency"] = latency(store, ranker, args.passes)
    report["load_after"] = loadavg()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    m = report["machine"]
    print(f"{m['date']} | {m['nproc']} CPUs | load before {report['load_before']}, "
          f"after {report['load_after']}")
    tree = report["tree"]
    print(f"  tree {tree['root']}: {tree['files']} files, {tree['chunks']} chunks")
    for row in report["speed"]:
        print(f"  {row['setting']:10s} {row['chunks_per_s']:7.1f} chunks/s  cos to fp32 mean "
              f"{row['cos_to_fp32_mean']:.4f} min {row['cos_to_fp32_min']:.4f}")
    e = report["embed"]
    print(f"  full pass {e['model_id']}: {e['chunks']} chunks, {e['embedded']} embedded, {e['from_cache']} "
          f"from the cache, {e['seconds']:.1f} s ({e['chunks_per_s']:.1f}/s)")
    for mode, by_split in report["quality"].items():
        cells = "  ".join(f"{split} {r['recall@5']:.3f}/{r['mrr']:.3f}" for split, r in by_split.items())
        print(f"  {mode:8s} recall@5/MRR@10  {cells}")
    print("  fused misses:", report["quality"]["fused"]["all"]["missed"])
    for mode, by_kind in report["latency"].items():
        cells = "  ".join(f"{kind} p50 {r['p50_ms']:.1f} / p95 {r['p95_ms']:.1f} ms (n={r['n']})"
                          for kind, r in by_kind.items())
        print(f"  search {mode:8s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
