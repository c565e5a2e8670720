#!/usr/bin/env python
"""Kernels benchmark (issue 5): each kernel's CPU path against the naive torch formulation it replaces.

  1. rope_shift: the reference shift against un-rotate-then-rotate (`rope_shift_naive`), on a
     SmolLM2-sized cache (3 kv heads, 64 channels) of per-document deltas; error against float64 truth.
  2. selective_logprob: peak memory (VmHWM, in a fresh subprocess per variant) of forward + backward for
     one 256-token completion with SmolLM2's head (49,152 x 576), chunked vs the full float32
     log_softmax; the largest value difference.
  3. sparse_attention: SmolLM2 on real code (standard library files, concatenated) at 4k and 8k
     tokens: teacher-forced decode steps with dense attention and with several (window, top_k, block)
     settings, top-1 agreement and KL(dense || sparse) of the next-token distributions, time per token;
     and the attention operation alone (all layers of one decode step) as the context grows.

Usage: python bench/bench_kernels.py [--json] [--threads N] [--steps N] [--contexts 4096,8192] [--quick]

--json prints exactly {"rope_shift": {...}, "sparse_attention": {...}, "selective_logprob": {...}} on
stdout; the detailed tables go to stderr. The machine may be shared: times are medians of runs made
side by side, and the load average is printed with them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from kernels.logprob import selective_logprob, selective_logprob_reference  # noqa: E402
from kernels.rope import rope_shift, rope_shift_naive  # noqa: E402

VOCAB, HIDDEN = 49_152, 576  # SmolLM2-135M's head
Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30
STDLIB_FILES = ("argparse.py", "dataclasses.py", "inspect.py", "typing.py", "functools.py")
# (score, sinks, window, top_k, block): the first is the ModelConfig default; the last two were the
# Quest-style scores before "mass" (docs/benchmarks.md).
SETTINGS = (
    ("mass", 64, 1024, 10, 64),
    ("mass", 64, 1024, 12, 64),
    ("mass", 64, 1024, 16, 64),
    ("mass", 64, 512, 24, 64),
    ("mass", 64, 512, 16, 64),
    ("minmax", 64, 512, 16, 64),
    ("minmax", 64, 1024, 64, 32),
)


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median_time(fn, runs: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_times(fns: dict, runs: int) -> dict[str, float]:
    """Median time of each function, run in turns so load changes hit all of them alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# -- rope_shift ------------------------------------------------------------------------------------


def _rotate64(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half encoding in float64: the truth the float32 paths are measured against."""
    angles = positions.double()[:, None] * inv_freq.double()  # [s, half]
    cos, sin = angles.cos(), angles.sin()
    half = inv_freq.shape[0]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def bench_rope(runs: int, seq: int) -> dict:
    inv_freq = 1.0 / 100_000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)  # SmolLM2
    raw = torch.randn(1, KV_HEADS * LAYERS, seq, HEAD_DIM, dtype=torch.float64)  # every layer's keys at once
    doc = seq // 8
    positions = torch.arange(seq) % doc  # eight documents, each encoded from position 0
    deltas = torch.arange(seq) // doc * doc + 37  # placed one after another after a 37-token prefix
    inv32 = inv_freq.float()  # the model's own float32 frequencies; the truth uses exactly these values
    cached = _rotate64(raw, positions, inv32).float()
    truth = _rotate64(raw, positions + deltas, inv32)
    times = interleaved_times(
        {
            "reference": lambda: rope_shift(cached, deltas, inv32),
            "naive": lambda: rope_shift_naive(cached, positions, deltas, inv32),
        },
        runs,
    )

    def rel_err(got):
        return float((got.double() - truth).abs().max() / truth.abs().max())

    result = {
        "speedup_vs_naive": times["naive"] / times["reference"],
        "max_rel_err": rel_err(rope_shift(cached, deltas, inv32)),
    }
    shape = f"[1, {KV_HEADS * LAYERS}, {seq}, {HEAD_DIM}]"
    log(f"\nrope_shift on {shape} float32, 8 documents (load {load_average()})")
    log(f"  reference {times['reference'] * 1e3:.1f} ms, naive {times['naive'] * 1e3:.1f} ms, "
        f"speedup {result['speedup_vs_naive']:.2f}x")
    log(f"  max rel err vs float64: reference {result['max_rel_err']:.2e}, "
        f"naive {rel_err(rope_shift_naive(cached, positions, deltas, inv32)):.2e}")
    return result


# -- selective_logprob -----------------------------------------------------------------------------


def _logprob_inputs(tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, tokens, HIDDEN, generator=gen)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen) * HIDDEN**-0.5 * 4
    ids = torch.randint(0, VOCAB, (1, tokens), generator=gen)
    return hidden, weight, ids


def _peak_child(variant: str, tokens: int, chunk: int, head_grad: bool) -> None:
    """Runs in a fresh process: prints the peak RSS growth (bytes) of forward + backward.

    Without `head_grad` the head is frozen (LoRA training leaves it alone) and only the hidden states
    get a gradient; with it, both variants also build the [vocab, d] weight gradient.
    """
    torch.set_num_threads(1)
    hidden, weight, ids = _logprob_inputs(tokens)
    hidden.requires_grad_()
    weight.requires_grad_(head_grad)
    small = hidden[:, :4].detach().clone().requires_grad_()
    selective_logprob(small, weight, ids[:, :4], chunk_size=2).sum().backward()  # load the code paths
    selective_logprob_reference(small, weight, ids[:, :4]).sum().backward()
    if head_grad:
        weight.grad = torch.zeros_like(weight)  # allocated up front: the same in both variants
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    if variant == "naive":
        out = selective_logprob_reference(hidden, weight, ids)
    else:
        out = selective_logprob(hidden, weight, ids, chunk_size=chunk)
    out.sum().backward()
    print((_status_kib("VmHWM") - base) * 1024)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _peak_bytes(variant: str, tokens: int, chunk: int, head_grad: bool = False) -> int:
    cmd = [sys.executable, __file__, "--_peak", variant, str(tokens), str(chunk), str(int(head_grad))]
    runs = [int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])
            for _ in range(3)]
    return statistics.median(runs)


def bench_logprob(tokens: int = 256, chunk: int = 32) -> dict:
    hidden, weight, ids = _logprob_inputs(tokens)
    want = selective_logprob_reference(hidden, weight, ids)
    errs = {
        c: float((selective_logprob(hidden, weight, ids, chunk_size=c) - want).abs().max())
        for c in (chunk, 1024)
    }
    times = interleaved_times(
        {
            "naive": lambda: selective_logprob_reference(hidden, weight, ids),
            "chunked": lambda: selective_logprob(hidden, weight, ids, chunk_size=chunk),
        },
        5,
    )
    naive = _peak_bytes("naive", tokens, chunk)
    peaks = {c: _peak_bytes("chunked", tokens, c) for c in (chunk, 64, 1024)}
    naive_head = _peak_bytes("naive", tokens, chunk, True)
    chunk_head = _peak_bytes("chunked", tokens, chunk, True)
    full = tokens * VOCAB * 4
    log(f"\nselective_logprob, one {tokens}-token completion, head {VOCAB} x {HIDDEN}, forward + backward "
        f"(load {load_average()}); one float32 [{tokens}, {VOCAB}] tensor is {full / 2**20:.1f} MiB")
    log(f"  peak RSS growth: full log_softmax {naive / 2**20:.1f} MiB; chunked "
        + ", ".join(f"chunk {c}: {p / 2**20:.1f} MiB ({naive / p:.1f}x lower)" for c, p in peaks.items()))
    head_mib = VOCAB * HIDDEN * 4 / 2**20
    log(f"  with a head gradient too ([vocab, d] float32, {head_mib:.0f} MiB in both): full "
        f"{naive_head / 2**20:.1f} MiB, chunk {chunk}: {chunk_head / 2**20:.1f} MiB "
        f"({naive_head / chunk_head:.1f}x)")
    diffs = ", ".join(f"chunk {c}: {e:.1e}" for c, e in errs.items())
    log("  max |difference| vs full log_softmax: " + diffs)
    log(f"  forward time: full {times['naive'] * 1e3:.1f} ms, chunked {times['chunked'] * 1e3:.1f} ms")
    return {"peak_memory_ratio": naive / peaks[chunk], "max_abs_err": errs[chunk]}


# -- sparse attention ------------------------------------------------------------------------------


def real_code_ids(runtime, count: int) -> list[int]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(f"# file: {name}\n{(stdlib / name).read_text()}\n" for name in STDLIB_FILES)
    ids = runtime.encode(text)
    if len(ids) < count:
        raise SystemExit(f"only {len(ids)} tokens of standard library code, {count} needed")
    return ids[:count]


def _step(model, cache, token: int):
    began = time.perf_counter()
    out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
    return out.cache, out.logits[0, -1].float().log_softmax(-1), time.perf_counter() - began


def _decode_pair(model, cache, ids: list[int], start: int, steps: int, settings):
    """Teacher-forced decode, dense and sparse steps taken in turns on their own copies of `cache`, so
    both see the same machine load: (dense log-probs, sparse log-probs [steps, vocab], times of each)."""
    layers = [m for m in model.modules() if hasattr(m, "_squid_sparse_settings")]
    caches = {"dense": copy.deepcopy(cache), "sparse": copy.deepcopy(cache)}
    rows = {"dense": [], "sparse": []}
    times = {"dense": [], "sparse": []}
    with torch.inference_mode():
        for t in range(start, start + steps):
            for name in ("dense", "sparse"):
                for layer in layers:  # no settings = the SDPA path, summaries left alone
                    layer._squid_sparse_settings = settings if name == "sparse" else None
                caches[name], logp, took = _step(model, caches[name], ids[t])
                rows[name].append(logp)
                times[name].append(took)
    return torch.stack(rows["dense"]), torch.stack(rows["sparse"]), times["dense"], times["sparse"]


def _prefill(model, ids: list[int]):
    cache = None
    with torch.inference_mode():
        for start in range(0, len(ids), 512):
            chunk = torch.tensor([ids[start : start + 512]])
            cache = model(input_ids=chunk, cache=cache, use_cache=True).cache
    return cache


def bench_sparse_quality(
    contexts: list[int], steps: int, settings_list=SETTINGS, trace_steps: int = 32
) -> tuple[list[dict], list[dict]]:
    """Quality and whole-model decode time per setting and context, and the attention-alone timing
    on each context's real decode trace (`bench_sparse_trace`): (quality rows, trace rows)."""
    from context.config import ModelConfig
    from context.runtime import get_runtime
    from context.sparse_attention import (
        SparseAttentionSettings,
        install_sparse_attention,
        uninstall_sparse_attention,
    )

    runtime = get_runtime(ModelConfig())
    model = runtime.model
    ids = real_code_ids(runtime, max(contexts) + max(steps, trace_steps))
    rows, trace_rows = [], []
    for context in contexts:
        began = time.perf_counter()
        cache = _prefill(model, ids[:context])
        log(f"\nprefilled {context} tokens in {time.perf_counter() - began:.0f} s (load {load_average()})")
        if trace_steps:
            trace_rows += bench_sparse_trace(model, cache, ids, context, trace_steps, settings_list)
        for score, sinks, window, top_k, block in settings_list:
            settings = SparseAttentionSettings(min_context=1024, sinks=sinks, window=window, top_k=top_k,
                                               block_size=block, score=score)
            stats = install_sparse_attention(model, settings)
            pair = _decode_pair(model, cache, ids, context, steps, settings)
            dense, sparse, dense_times, sparse_times = pair
            uninstall_sparse_attention(model)
            kl = (dense.exp() * (dense - sparse)).sum(-1)  # KL(dense || sparse) per step
            row = {
                "context": context, "score": score, "sinks": sinks, "window": window, "top_k": top_k,
                "block": block,
                "attended": stats.attended_tokens / max(stats.sparse_calls, 1),
                "top1_agreement": float((dense.argmax(-1) == sparse.argmax(-1)).float().mean()),
                "mean_kl": float(kl.mean()),
                "dense_ms": statistics.median(dense_times) * 1e3,
                "sparse_ms": statistics.median(sparse_times) * 1e3,
                "load": load_average(),
            }
            rows.append(row)
            log(f"  {score} sinks {sinks} window {window} top_k {top_k} block {block}: attends "
                f"{row['attended']:.0f} "
                f"tokens, top-1 {row['top1_agreement']:.3f}, KL {row['mean_kl']:.4f}, decode "
                f"{row['sparse_ms']:.0f} ms/token vs dense {row['dense_ms']:.0f} "
                f"({row['dense_ms'] / row['sparse_ms']:.2f}x)")
        del cache
    return rows, trace_rows


class _AttentionLayer(torch.nn.Module):
    """Stands for one LlamaAttention: the attributes the transformers attention functions read."""

    num_key_value_groups = Q_HEADS // KV_HEADS
    is_causal = True

    def __init__(self, layer_idx: int, settings):
        super().__init__()
        from context.sparse_attention import SparseAttentionStats

        self.layer_idx = layer_idx
        self._squid_sparse_settings = settings
        self._squid_sparse_stats = SparseAttentionStats()
        self._squid_sparse_summaries = None


def _attention_step_fns(context: int, setting: tuple[str, int, int, int, int]):
    """One decode step's attention over all layers, through the runtime's two attention functions:
    transformers' SDPA one (dense) and context.sparse_attention's (summaries kept per layer)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from context.sparse_attention import SparseAttentionSettings, sparse_attention_forward

    score, sinks, window, top_k, block = setting
    settings = SparseAttentionSettings(
        min_context=1024, sinks=sinks, window=window, top_k=top_k, block_size=block, score=score
    )
    gen = torch.Generator().manual_seed(context)
    q = torch.randn(1, Q_HEADS, 1, HEAD_DIM, generator=gen)  # [b, heads, q_len, d] as the model passes it
    layers = [(_AttentionLayer(i, settings), torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=gen),
               torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=gen)) for i in range(LAYERS)]

    def dense():
        for module, k, v in layers:
            sdpa_attention_forward(module, q, k, v, None, scaling=HEAD_DIM**-0.5)

    def sparse():
        for module, k, v in layers:
            module._squid_sparse_gathered = None  # a fixed query would copy nothing after the first call
            sparse_attention_forward(module, q, k, v, None, scaling=HEAD_DIM**-0.5)

    return dense, sparse


def _record_decode(model, cache, ids: list[int], start: int, steps: int):
    """Dense teacher-forced decode from `cache`, recording every layer's query at every step:
    ([step][layer] query [1, q_heads, 1, d], the grown cache's [layer] (keys, values))."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    queries: list[list[torch.Tensor]] = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx == 0:
            queries.append([])
        queries[-1].append(query.detach().clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("squid_record", recording)
    previous = model.config._attn_implementation
    model.set_attn_implementation("squid_record")
    cache = copy.deepcopy(cache)
    try:
        with torch.inference_mode():
            for t in range(start, start + steps):
                cache = model(input_ids=torch.tensor([[ids[t]]]), cache=cache, use_cache=True).cache
    finally:
        model.set_attn_implementation(previous)
    return queries, [(layer.keys, layer.values) for layer in cache.layers]


def bench_sparse_trace(model, cache, ids: list[int], context: int, steps: int, settings_list) -> list[dict]:
    """Attention alone on a real decode trace: the model's own queries and growing cache, replayed
    step by step through the runtime's two attention functions, dense (SDPA) and sparse, in turns.
    The sparse side keeps its summaries and copied blocks across steps as the runtime does, so the
    blocks that change from one step to the next are what it pays for."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from context.sparse_attention import SparseAttentionSettings, sparse_attention_forward

    queries, layers = _record_decode(model, cache, ids, context, steps)
    rows = []
    for setting in settings_list:
        score, sinks, window, top_k, block = setting
        settings = SparseAttentionSettings(min_context=1024, sinks=sinks, window=window, top_k=top_k,
                                           block_size=block, score=score)
        modules = [_AttentionLayer(i, settings) for i in range(len(layers))]
        dense_times, sparse_times = [], []
        with torch.inference_mode():
            for t in range(steps):
                n = context + t + 1  # the cache at step t holds the step's own token
                views = [(k[:, :, :n], v[:, :, :n]) for k, v in layers]
                began = time.perf_counter()
                for module, q, (k, v) in zip(modules, queries[t], views, strict=True):
                    sdpa_attention_forward(module, q, k, v, None, scaling=HEAD_DIM**-0.5)
                middle = time.perf_counter()
                for module, q, (k, v) in zip(modules, queries[t], views, strict=True):
                    sparse_attention_forward(module, q, k, v, None, scaling=HEAD_DIM**-0.5)
                dense_times.append(middle - began)
                sparse_times.append(time.perf_counter() - middle)
        copied = sum(m._squid_sparse_gathered.copied_blocks for m in modules[1:])  # layer 0 starts over
        chosen = (len(modules) - 1) * KV_HEADS * top_k * steps
        warm = slice(1, None)  # the first step copies every block
        row = {"context": context, "setting": setting, "dense_ms": statistics.median(dense_times[warm]) * 1e3,
               "sparse_ms": statistics.median(sparse_times[warm]) * 1e3, "copied_share": copied / chosen}
        rows.append(row)
        log(f"  trace at {context}: {setting}: dense {row['dense_ms']:.2f} ms, "
            f"sparse {row['sparse_ms']:.2f} ms "
            f"({row['dense_ms'] / row['sparse_ms']:.2f}x), {row['copied_share']:.0%} of chosen blocks copied")
    return rows


def bench_sparse_attention_op(contexts: list[int], runs: int, settings_list=SETTINGS) -> list[dict]:
    """Attention per decode step as the context grows (default setting), and every setting at the end."""
    rows = []
    log(f"\nattention of one decode step, {LAYERS} layers, {Q_HEADS} query / {KV_HEADS} kv heads "
        f"(load {load_average()})")
    jobs = [(c, settings_list[0]) for c in contexts] + [(max(contexts), s) for s in settings_list[1:]]
    for context, setting in jobs:
        dense, sparse = _attention_step_fns(context, setting)
        times = interleaved_times({"dense": dense, "sparse": sparse}, runs)
        dense_ms, sparse_ms = times["dense"] * 1e3, times["sparse"] * 1e3
        rows.append({"context": context, "setting": setting, "dense_ms": dense_ms, "sparse_ms": sparse_ms})
        log(f"  {context:>6} tokens, (score, sinks, window, top_k, block) {setting}: "
            f"dense {dense_ms:.2f} ms, sparse {sparse_ms:.2f} ms ({dense_ms / sparse_ms:.2f}x)")
    return rows


def summarise_sparse(quality: list[dict], op_rows: list[dict]) -> dict:
    """The headline: at the longest context, the setting with the fastest attention among those whose
    top-1 agreement is at least 97% (else the most faithful one), its speed-up and its quality.
    `op_rows`: attention timings per setting (the real decode trace's when measured)."""
    context = max(r["context"] for r in quality)
    op = {tuple(r["setting"]): r for r in op_rows if r["context"] == context}
    at = [r for r in quality if r["context"] == context]
    for r in at:
        timing = op[(r["score"], r["sinks"], r["window"], r["top_k"], r["block"])]
        r["attention_speedup"] = timing["dense_ms"] / timing["sparse_ms"]
    good = [r for r in at if r["top1_agreement"] >= 0.97]
    if good:
        best = max(good, key=lambda r: r["attention_speedup"])
    else:
        best = max(at, key=lambda r: r["top1_agreement"])
    log(f"\nheadline at {context}: {best['score']} sinks {best['sinks']} window {best['window']} "
        f"top_k {best['top_k']} block {best['block']}: attention {best['attention_speedup']:.2f}x faster, "
        f"whole-model decode "
        f"{best['dense_ms'] / best['sparse_ms']:.2f}x, top-1 {best['top1_agreement']:.3f}, "
        f"KL {best['mean_kl']:.4f}")
    return {
        "context": context,
        "speedup_vs_dense": best["attention_speedup"],
        "top1_agreement": best["top1_agreement"],
        "mean_kl": best["mean_kl"],
    }


def _parse_settings(text: str) -> tuple:
    settings = []
    for item in text.split(","):
        score, *numbers = item.split(":")
        if len(numbers) != 4:
            raise argparse.ArgumentTypeError(f"{item!r} is not score:sinks:window:top_k:block")
        settings.append((score, *map(int, numbers)))
    return tuple(settings)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_peak":
        _peak_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result object on stdout")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced decode steps per setting")
    parser.add_argument("--contexts", default="4096,8192")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1k/2k contexts, 8 steps")
    parser.add_argument("--settings", type=_parse_settings, default=SETTINGS,
                        help="sparse settings to compare, score:sinks:window:top_k:block,... (the first is "
                             "also timed against the context length)")
    parser.add_argument("--only-sparse", action="store_true", help="skip rope_shift and selective_logprob")
    parser.add_argument("--trace-steps", type=int, default=32,
                        help="decode steps of the real trace that attention alone is timed on (0: the "
                             "synthetic per-call timing instead)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = [1024, 2048] if args.quick else [int(c) for c in args.contexts.split(",")]
    steps = 8 if args.quick else args.steps
    log(f"kernels benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.threads} thread(s), "
        f"{os.cpu_count()} cores, load {load_average()}")
    result = {} if args.only_sparse else {
        "rope_shift": bench_rope(args.runs, 4096 if not args.quick else 1024),
        "selective_logprob": bench_logprob(),
    }
    op_rows = bench_sparse_attention_op(sorted({1024, 2048, 4096, 8192} | set(contexts)), args.runs,
                                        args.settings)
    quality, trace_rows = bench_sparse_quality(contexts, steps, args.settings, args.trace_steps)
    result["sparse_attention"] = summarise_sparse(quality, trace_rows or op_rows)
    order = ("rope_shift", "sparse_attention", "selective_logprob")
    result = {key: result[key] for key in order if key in result}
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    log(f"done, load {load_average()}")


if __name__ == "__main__":
    main()
