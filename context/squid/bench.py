"""Measurements behind `squidcode bench squid`: time to first token, swap cost, quality, tier bandwidth.

Documents are cut from the running interpreter's standard library (the first T tokens of each
file long enough). All variants run side by side in one process on the same documents:

- full: prefill prefix + documents + query from nothing;
- prefix_cache: simulated prefix caching, where the previous request shared the system prefix and the
  documents before the middle one (the middle document changed), so only the longest common prefix
  is reused and everything after it is prefilled;
- squid variants: the documents' caches composed from the store, with each recovery setting;
- with `reader` (a Squid reader adapter, `context.squid.reader`): the same compositions, the tokens
  after them read by the reader (`<variant>+reader`).

Quality is teacher-forced against full prefill over the full model's greedy continuation
(`continuation` tokens): top-1 agreement and mean KL(full || variant) in nats, per query, averaged.
Prefix caching's quality is measured on the first document set's queries only (it reuses exactly
computed keys and values; measuring it costs a second full prefill per set).
Queries come in groups sharing a document set (5 per set, documents shuffled per set); half quote a
span of one of the set's documents (the model can copy from its context), half come from other files.
Documents and queries come from the standard library's top-level modules, or with `source` from the
Python files under that folder (a package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .compose import Recovery, compose, full_prefill, greedy_continuation, prefill
from .encode import build_cache, cache_tensors, document_key, encode_document, encode_prefix
from .reader import load_reader
from .store import KVCacheStore

__all__ = ["BENCH_RECOVERIES", "BenchSettings", "run_bench"]

BENCH_RECOVERIES = (
    Recovery(),
    Recovery(first_k=16), Recovery(first_k=32), Recovery(first_k=64),
    Recovery(blend_ratio=0.10), Recovery(blend_ratio=0.20),
    Recovery(first_k=32, blend_ratio=0.10),
    # the last 512 tokens (at 512-token documents, the last document: the one nearest the query)
    Recovery(last_k=512), Recovery(first_k=16, last_k=512), Recovery(first_k=32, last_k=512),
    # the same, attending while recomputed to the prefix, 16 sinks per document and a window
    Recovery(first_k=32, last_k=512, window=1024, sinks=16),
    Recovery(first_k=32, last_k=512, window=512, sinks=16),
    # composed after a swap of the middle document, refreshing only it (the default), or it and
    # the next one
    Recovery(first_k=32, following=0),
    Recovery(first_k=32, following=1),
)
# Measured with a reader too: re-rotation only, and the cheapest first-k settings.
READER_RECOVERIES = (Recovery(), Recovery(first_k=16), Recovery(first_k=32))
_QUERY_TOKENS = 48
_QUERIES_PER_SET = 5


@dataclass(frozen=True)
class ReaderVariant:
    """A composition with `recovery`, the tokens after it read by the bench's reader."""

    recovery: Recovery

    @property
    def name(self) -> str:
        return f"{self.recovery.name}+reader"


@dataclass(frozen=True)
class BenchSettings:
    docs: int = 8
    doc_tokens: int = 512
    queries: int = 20
    runs: int = 3
    continuation: int = 32
    curve: tuple[int, ...] = ()
    curve_runs: int = 1
    default: Recovery = Recovery(first_k=32)
    seed: int = 0
    source: str | None = None  # a folder of Python files in place of the standard library
    reader: str | None = None  # a Squid reader adapter's folder
    # Only the compositions a reader is measured on (READER_RECOVERIES), with and without it.
    reader_only: bool = False


def _token_pool(runtime, tokens: int, wanted: int, seed: int, source: str | None = None) -> tuple[list, list]:
    """(documents, other files' token lists) from the standard library's top-level modules, or from
    every Python file under `source`; deterministic per seed."""
    if source is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(p for p in root.glob("*.py") if p.stat().st_size > tokens * 6)
    else:
        root = Path(source)
        files = sorted(p for p in root.rglob("*.py") if p.is_file() and p.stat().st_size > tokens * 6)
    random.Random(seed).shuffle(files)
    docs, others = [], []
    for path in files:
        ids = runtime.encode(path.read_text(encoding="utf-8", errors="replace")[: tokens * 12])
        if len(ids) < tokens:
            continue
        (docs if len(docs) < wanted else others).append((path.name, ids[:tokens] if len(docs) < wanted
                                                         else ids))
        if len(others) >= 8:
            break
    if len(docs) < wanted:
        where = "the standard library" if source is None else source
        raise RuntimeError(f"{where} has only {len(docs)} files of {tokens}+ tokens")
    return docs, others


def _timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class _Bench:
    def __init__(self, runtime, settings: BenchSettings, workdir: Path):
        self.rt, self.s = runtime, settings
        self.prefix = encode_prefix(runtime)
        need = max((settings.docs, *settings.curve)) + 1
        self.pool, self.others = _token_pool(runtime, settings.doc_tokens, need, settings.seed,
                                             settings.source)
        self.store = KVCacheStore(workdir / "kv", device=runtime.device, device_bytes=8 << 30,
                                  cpu_bytes=8 << 30, disk_bytes=16 << 30)
        self.entries = []
        self.reader = None  # set once the documents are encoded (they are the base model's)
        with torch.inference_mode():
            for name, ids in self.pool:
                entry = encode_document(runtime, self.prefix, ids, document_key(runtime, self.prefix, name),
                                        source=name)
                self.store.put(entry)
                self.entries.append(entry)

    def docs(self, n: int):
        return [self.store.get(e.key) for e in self.entries[:n]]

    # -- time to first token ---------------------------------------------------------------------

    def ttft_full(self, n: int, query: list[int]) -> float:
        ids = list(self.prefix.token_ids) + [t for e in self.entries[:n] for t in e.token_ids] + query
        return _timed(lambda: int(full_prefill(self.rt, ids)[1].argmax()), self.s.runs)

    def _common_prefix(self, n: int):
        """The cache a prefix cache would hold: prefix + the documents before the middle one."""
        keep = n // 2
        ids = list(self.prefix.token_ids) + [t for e in self.entries[:keep] for t in e.token_ids]
        cache, _ = full_prefill(self.rt, ids)
        return cache_tensors(cache), ids, keep

    def ttft_prefix_cache(self, n: int, query: list[int]) -> float:
        (keys, values), ids, keep = self._common_prefix(n)
        rest = [t for e in self.entries[keep:n] for t in e.token_ids] + query

        def run():
            cache = build_cache(self.rt.model.config, keys, values)
            return int(prefill(self.rt, cache, rest, len(ids), chunk=1 << 16).argmax())

        return _timed(run, self.s.runs)

    def _previous_for(self, docs: list, recovery: Recovery):
        """A recovery with `following` set is measured after a swap: the previous composition had
        another document in the middle (one never among the measured documents). Else None."""
        if recovery.following is None:
            return None
        before = list(docs)
        before[len(docs) // 2] = self.entries[-1]
        return compose(self.rt, self.prefix, before, recovery=recovery)

    def compose_variant(self, docs: list, recovery: Recovery | ReaderVariant):
        if isinstance(recovery, ReaderVariant):
            recovery = recovery.recovery
        return compose(self.rt, self.prefix, docs, recovery=recovery,
                       previous=self._previous_for(docs, recovery))

    def ttft_squid(self, n: int, query: list[int], recovery: Recovery | ReaderVariant) -> float:
        docs = self.docs(n)
        if isinstance(recovery, ReaderVariant):
            def run():
                ctx = compose(self.rt, self.prefix, docs, recovery=recovery.recovery)
                with self.reader.reading():
                    return int(prefill(self.rt, ctx.new_cache(), query, ctx.offset).argmax())

            return _timed(run, self.s.runs)
        previous = self._previous_for(docs, recovery)

        def run():
            ctx = compose(self.rt, self.prefix, docs, query, recovery=recovery, previous=previous)
            return int(ctx.logits.argmax())

        return _timed(run, self.s.runs)

    # -- swap ----------------------------------------------------------------------------------

    def swap(self, n: int, query: list[int], prefix_cache_s: float) -> dict:
        """Replace the middle document by a new one: Squid encodes it alone and composes, copying the
        unchanged documents from the previous request's composition (as the service does); a prefix
        cache prefills from it on (`prefix_cache_s`: exactly the prefix-cache time to first token).

        Measured with the default recovery, with first-k recovery refreshing every document after
        the swapped one (`all_`, as a fresh composition), and with re-rotation only (`plain_`). `*_squid_s`
        is the time to the first token after the swap; `request_s` is a request's time to first
        token when nothing changed (the query on the same composition, which every request at this
        N pays), so `*_added_vs_encode` = (squid_s - request_s) / encode_one_s is what the swap
        itself costs."""
        name, ids = self.pool[-1]
        key = document_key(self.rt, self.prefix, f"swap-{n}-{name}")

        def squid(recovery: Recovery, before):
            new = encode_document(self.rt, self.prefix, ids, key)
            docs = self.docs(n)
            docs[n // 2] = new
            ctx = compose(self.rt, self.prefix, docs, query, recovery=recovery, previous=before)
            return int(ctx.logits.argmax())

        encode_one = _timed(lambda: encode_document(self.rt, self.prefix, ids, key), self.s.runs)
        out = {"n": n, "prefix_cache_s": prefix_cache_s, "encode_one_s": encode_one}
        every = dataclasses.replace(self.s.default, following=None)
        for label, recovery in (("", self.s.default), ("all_", every), ("plain_", Recovery())):
            before = compose(self.rt, self.prefix, self.docs(n), recovery=recovery)
            if not label:
                def request(before=before):
                    return int(prefill(self.rt, before.new_cache(), query, before.offset).argmax())

                out["request_s"] = _timed(request, self.s.runs)
            seconds = _timed(lambda recovery=recovery, before=before: squid(recovery, before), self.s.runs)
            out[f"{label}squid_s"] = seconds
            out[f"{label}squid_vs_encode"] = seconds / encode_one
            out[f"{label}added_vs_encode"] = (seconds - out["request_s"]) / encode_one
        return out

    # -- quality -------------------------------------------------------------------------------

    def _queries(self, rng: random.Random, docs: list) -> list[list[int]]:
        out = []
        for i in range(_QUERIES_PER_SET):
            if i % 2 == 0:
                ids = list(docs[rng.randrange(len(docs))].token_ids)
                start = rng.randrange(len(ids) // 4, max(len(ids) // 4 + 1, len(ids) - _QUERY_TOKENS - 8))
            else:
                ids = self.others[rng.randrange(len(self.others))][1]
                start = rng.randrange(0, max(1, len(ids) - _QUERY_TOKENS))
            out.append(ids[start : start + _QUERY_TOKENS])
        return out

    def _forced(self, cache, query: list[int], cont: list[int], start: int, mask=None) -> torch.Tensor:
        """Teacher-forced next-token logits [len(cont), vocab] after `query` on `cache` (extended);
        `mask`: an additive [1, 1, q, start + q] attention mask in place of the causal one."""
        out = self.rt.model(input_ids=torch.tensor([query + cont[:-1]], device=self.rt.device),
                            position_ids=torch.arange(start, start + len(query) + len(cont) - 1)[None],
                            cache=cache, use_cache=True, attention_mask=mask)
        return out.logits[0, len(query) - 1 :].float()

    def _continuation(self, keys, values, query: list[int], start: int) -> list[int]:
        return greedy_continuation(self.rt, keys, values, query, start, self.s.continuation)

    def quality(self, variants: list[tuple[str, object]]) -> dict[str, dict]:
        """Mean top-1 agreement and KL per variant name over `queries` queries."""
        rng = random.Random(self.s.seed + 1)
        scores = {name: {"agree": [], "kl": []} for name, _ in variants}
        sets = -(-self.s.queries // _QUERIES_PER_SET)
        done = 0
        for _ in range(sets):
            order = rng.sample(range(len(self.entries) - 1), self.s.docs)
            docs = [self.entries[i] for i in order]
            ids = list(self.prefix.token_ids) + [t for d in docs for t in d.token_ids]
            ref_cache, _ = full_prefill(self.rt, ids)
            ref_kv = cache_tensors(ref_cache)
            # Prefix caching reuses exactly computed keys and values, so it is measured on the first
            # document set only (it costs a second full prefill per set).
            contexts = {name: self._variant_context(make, docs, ref_kv) for name, make in variants
                        if make != "prefix_cache" or done == 0}
            for query in self._queries(rng, docs)[: self.s.queries - done]:
                done += 1
                cont = self._continuation(*ref_kv, query, len(ids))
                ref = self._forced(build_cache(self.rt.model.config, *ref_kv), query, cont, len(ids))
                ref_logp = torch.log_softmax(ref, -1)
                for name, (keys, values) in contexts.items():
                    make = dict(variants)[name]
                    mask = self._attention_mask(make, len(query) + len(cont) - 1, len(ids))
                    reading = isinstance(make, ReaderVariant)
                    with self.reader.reading() if reading else contextlib.nullcontext():
                        got = self._forced(build_cache(self.rt.model.config, keys, values), query, cont,
                                           len(ids), mask)
                    got = torch.log_softmax(got, -1)
                    scores[name]["agree"].append(float((got.argmax(-1) == ref.argmax(-1)).float().mean()))
                    kl = (ref_logp.exp() * (ref_logp - got)).sum(-1).mean()
                    scores[name]["kl"].append(float(kl))
        return {n: {"top1_agreement": statistics.mean(v["agree"]), "mean_kl": statistics.mean(v["kl"]),
                    "queries": len(v["agree"])} for n, v in scores.items()}

    def _attention_mask(self, make, length: int, start: int):
        """The attention mask a variant's teacher-forced tokens use; None: the model's causal one.
        (Experiments override it: `bench/bench_squid_temperature.py`.)"""
        return None

    def _variant_context(self, make, docs, ref_kv):
        if make == "full":
            return ref_kv
        if make == "prefix_cache":
            keep = len(docs) // 2
            ids = list(self.prefix.token_ids) + [t for d in docs[:keep] for t in d.token_ids]
            cache, _ = full_prefill(self.rt, ids)
            prefill(self.rt, cache, [t for d in docs[keep:] for t in d.token_ids], len(ids), chunk=1 << 16)
            return cache_tensors(cache)
        ctx = self.compose_variant(docs, make)
        return ctx.keys, ctx.values

    # -- tiers ---------------------------------------------------------------------------------

    def tiers(self, workdir: Path) -> dict:
        entry = self.entries[0]
        disk_store = KVCacheStore(workdir / "tier", device=self.rt.device)
        disk_store.put(entry)
        disk_store.persist(entry.key)
        path = disk_store.path_for(entry.key)
        size = path.stat().st_size

        def disk_load():
            fresh = KVCacheStore(workdir / "tier", device=self.rt.device)
            assert fresh.get(entry.key) is not None

        def cpu_load():
            keys, values = entry.keys.to("cpu").clone(), entry.values.to("cpu").clone()
            return keys.to(self.rt.device, copy=True), values.to(self.rt.device, copy=True)

        copy_s = _timed(lambda: shutil.copyfile(path, workdir / "plain-copy"), max(3, self.s.runs))
        read_s = _timed(path.read_bytes, max(3, self.s.runs))
        disk_s = _timed(disk_load, max(3, self.s.runs))
        cpu_s = _timed(cpu_load, max(3, self.s.runs))
        mb = size / 1e6
        return {
            "entry_bytes": size,
            "disk_load_MBps": mb / disk_s,
            "cpu_to_device_MBps": entry.nbytes / 1e6 / cpu_s,
            "plain_file_copy_MBps": mb / copy_s,
            "plain_file_read_MBps": mb / read_s,
            "disk_vs_plain_copy": copy_s / disk_s,
            "stats": self.store.stats(),
        }


def _query_for(bench: _Bench) -> list[int]:
    return bench.others[0][1][:_QUERY_TOKENS]


def run_bench(runtime, settings: BenchSettings, log=lambda msg: print(msg, file=sys.stderr)) -> dict:
    """Everything the `--json` object reports (plus "curve" when `settings.curve` is set)."""
    with tempfile.TemporaryDirectory(prefix="squid-bench-") as tmp, torch.inference_mode():
        workdir = Path(tmp)
        bench = _Bench(runtime, settings, workdir)
        if settings.reader is not None:
            bench.reader = load_reader(runtime, Path(settings.reader))
        try:
            return _measure(bench, settings, workdir, log)
        finally:
            if bench.reader is not None:
                bench.reader.close()


def _measure(bench: _Bench, settings: BenchSettings, workdir: Path, log) -> dict:
    n, query = settings.docs, _query_for(bench)
    bench.ttft_full(1, query)  # warm-up: the first forward pays one-off allocations
    log(f"documents encoded ({len(bench.entries)} x {settings.doc_tokens} tokens)")
    recoveries = list(READER_RECOVERIES if settings.reader_only else BENCH_RECOVERIES)
    if settings.default not in recoveries:
        recoveries.append(settings.default)
    if bench.reader is not None:
        recoveries += [ReaderVariant(r) for r in READER_RECOVERIES]
    named = [("full", "full"), ("prefix_cache", "prefix_cache")] + [(r.name, r) for r in recoveries]
    ttft = {"full": bench.ttft_full(n, query), "prefix_cache": bench.ttft_prefix_cache(n, query)}
    for recovery in recoveries:
        ttft[recovery.name] = bench.ttft_squid(n, query, recovery)
    log(f"time to first token measured: {ttft}")
    # The quality figures' documents and queries do not depend on the timings above.
    quality = bench.quality(named)
    log(f"quality measured: {quality}")
    fractions = {r.name: bench.compose_variant(bench.docs(n), r).recomputed_fraction for r in recoveries}
    fractions.update({"full": 1.0, "prefix_cache": (n - n // 2) / n})
    variants = [{
        "name": name, "ttft_s": round(ttft[name], 4),
        "speedup_vs_full": round(ttft["full"] / ttft[name], 2),
        "top1_agreement": round(quality[name]["top1_agreement"], 4),
        "mean_kl": round(max(0.0, quality[name]["mean_kl"]), 4),
        "recomputed_fraction": round(fractions[name], 4),
    } for name, _ in named]
    result = {"docs": n, "doc_tokens": settings.doc_tokens, "queries": settings.queries,
              "variants": variants, "swap": {"default": settings.default.name,
                                               **bench.swap(n, query, ttft["prefix_cache"])},
              "tiers": bench.tiers(workdir)}
    if settings.curve:
        bench.s = dataclasses.replace(settings, runs=settings.curve_runs)
        result["curve"] = []
        for m in settings.curve:
            result["curve"].append(_curve_point(bench, m, query))
            log(f"curve point: {result['curve'][-1]}")
    return result


def _curve_point(bench: _Bench, n: int, query: list[int]) -> dict:
    fresh = dataclasses.replace(bench.s.default, following=None)  # a composition with no previous one
    point = {"n": n, "full_s": bench.ttft_full(n, query), "prefix_cache_s": bench.ttft_prefix_cache(n, query),
             "squid_s": bench.ttft_squid(n, query, Recovery()),
             "squid_default_s": bench.ttft_squid(n, query, fresh)}
    point["swap"] = bench.swap(n, query, point["prefix_cache_s"])
    return point
