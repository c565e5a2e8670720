#!/usr/bin/env python
"""GPU check and timing of the three Triton kernels (run by bench/gpu_kernels.sh on an H200).

For each kernel: compile (first call), check against the torch reference on the same inputs, then time
the Triton path, torch eager (the reference formulation, on the GPU) and the bytes-moved floor
(bytes read + written / HBM bandwidth, 4.3 TB/s by default), and print one table.

`--smoke` runs the same code on tiny CPU shapes under TRITON_INTERPRET=1 (no GPU needed), so the script
itself is checked before it meets a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

from kernels.logprob import (  # noqa: E402
    selective_logprob,
    selective_logprob_from_logits,
    selective_logprob_from_logits_reference,
    selective_logprob_reference,
)
from kernels.rope import rope_shift_naive, rope_shift_reference, rope_shift_triton  # noqa: E402
from kernels.sparse_attention import (  # noqa: E402
    plan_sparse_attention,
    sparse_decode_attention,
    sparse_decode_attention_reference,
)

ROWS: list[dict] = []


def timer(fn, device) -> float:
    """Median milliseconds of `fn`: CUDA events via triton.testing.do_bench on a GPU, perf_counter else."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def record(kernel, shape, bytes_moved, triton_ms, eager_ms, err, tol, bandwidth, note=""):
    floor_ms = bytes_moved / bandwidth * 1e3
    ROWS.append(dict(kernel=kernel, shape=shape, triton_ms=triton_ms, eager_ms=eager_ms, floor_ms=floor_ms,
                     err=err, ok=err < tol, tol=tol, note=note))


def check_rope(device, dtype, big: bool, bandwidth: float) -> None:
    batch, heads, seq, dim = (1, 8, 32768, 128) if big else (1, 2, 37, 64)
    inv_freq = 1.0 / 500_000.0 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    keys = torch.randn(batch, heads, seq, dim, device=device).to(dtype)
    deltas = (torch.arange(seq, device=device) // max(1, seq // 8) + 1) * 1000  # eight documents
    for name, kdtype, tol in (("float32", torch.float32, 1e-5), (str(dtype).split(".")[-1], dtype, 2e-2)):
        k = keys.to(kdtype)
        out = torch.full_like(k, float("nan"))
        want = rope_shift_reference(k, deltas, inv_freq)
        err = rel_err(rope_shift_triton(k, deltas, inv_freq, out=out), want)
        table = seq * dim // 2 * 4 * 2  # cos + sin, float32
        moved = 2 * k.numel() * k.element_size() + table
        t_ms = timer(lambda k=k: rope_shift_triton(k, deltas, inv_freq, out=k), device)  # in place
        e_ms = timer(lambda k=k: rope_shift_reference(k, deltas, inv_freq), device)
        positions = torch.arange(seq, device=device)
        n_ms = timer(lambda k=k, p=positions: rope_shift_naive(k, p, deltas, inv_freq), device)
        record("rope_shift", f"{list(k.shape)} {name}", moved, t_ms, e_ms, err, tol, bandwidth,
               f"naive {n_ms:.3f} ms")


def check_logprob(device, dtype, big: bool, bandwidth: float) -> None:
    rows, dim, vocab = (4096, 4096, 128_256) if big else (37, 48, 1000)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(1, rows, dim, device=device, generator=gen)
    weight = torch.randn(vocab, dim, device=device, generator=gen) * dim**-0.5 * 3
    tokens = torch.randint(0, vocab, (1, rows), device=device, generator=gen)
    # Float32 check with IEEE dot products (1e-5), then the production dtype.
    for name, cast, tol in (("float32", torch.float32, 1e-5), (str(dtype).split(".")[-1], dtype, 1e-2)):
        h, w = hidden.to(cast), weight.to(cast)
        if big and cast == torch.float32:
            h, w = h[:, :512], w  # keep the float32 reference's [rows, vocab] tensor small
            tok = tokens[:, :512]
        else:
            tok = tokens
        want = selective_logprob_reference(h, w, tok)
        got = selective_logprob(h, w, tok, backend="triton")
        err = rel_err(got, want)
        moved = h.numel() * h.element_size() + w.numel() * w.element_size() + tok.numel() * 12
        t_ms = timer(lambda h=h, w=w, tok=tok: selective_logprob(h, w, tok, backend="triton"), device)
        e_ms = timer(lambda h=h, w=w, tok=tok: selective_logprob_reference(h, w, tok), device)
        flops = 2 * h.shape[1] * vocab * dim
        shape = f"{list(h.shape)} x {list(w.shape)} {name}"
        record("selective_logprob (head, fwd)", shape, moved, t_ms, e_ms, err, tol, bandwidth,
               f"matmul-bound: {flops / 1e12:.2f} TFLOP")
    h, w = hidden.to(dtype).requires_grad_(), weight.to(dtype)
    chunk = 1024

    def train_step():
        selective_logprob(h, w, tokens, backend="triton", chunk_size=chunk).sum().backward()

    def eager_step():
        selective_logprob_reference(h, w, tokens).sum().backward()

    peak = _peak_mib(train_step, device), _peak_mib(eager_step, device)
    record("selective_logprob (head, fwd+bwd)", f"{list(h.shape)} {str(dtype).split('.')[-1]}",
           h.numel() * h.element_size() * 2 + w.numel() * w.element_size() * 2, timer(train_step, device),
           timer(eager_step, device), 0.0, 1.0, bandwidth,
           f"peak MiB chunked {peak[0]:.0f} vs eager {peak[1]:.0f}")
    logits = (hidden[0] @ weight.T).to(dtype)[None]  # [1, rows, vocab]
    want = selective_logprob_from_logits_reference(logits, tokens)
    err = rel_err(selective_logprob_from_logits(logits, tokens, backend="triton"), want)
    record("selective_logprob (logits, fwd)", f"{list(logits.shape)} {str(dtype).split('.')[-1]}",
           logits.numel() * logits.element_size() + rows * 12,
           timer(lambda: selective_logprob_from_logits(logits, tokens, backend="triton"), device),
           timer(lambda: selective_logprob_from_logits_reference(logits, tokens), device), err, 1e-5,
           bandwidth)


def _peak_mib(fn, device) -> float:
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def check_sparse(device, dtype, big: bool, bandwidth: float) -> None:
    # A Llama-3-8B layer: 32 query heads over 8 kv heads, 128 channels.
    batch, q_heads, kv_heads, seq, dim = (4, 32, 8, 32768, 128) if big else (2, 6, 2, 517, 40)
    sinks, window, top_k, block = (64, 1024, 32, 64) if big else (10, 50, 5, 16)
    q = torch.randn(batch, q_heads, dim, device=device).to(dtype)
    k = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    v = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    plan = plan_sparse_attention(q, k, sinks=sinks, window=window, top_k=top_k, block_size=block)
    for name, cast, tol in (("float32", torch.float32, 1e-5), (str(dtype).split(".")[-1], dtype, 2e-2)):
        qc, kc, vc = q.to(cast), k.to(cast), v.to(cast)
        want = sparse_decode_attention_reference(qc, kc, vc, plan)
        err = rel_err(sparse_decode_attention(qc, kc, vc, plan, backend="triton"), want)
        moved = 2 * batch * kv_heads * plan.n_tokens * dim * kc.element_size()
        moved += 2 * qc.numel() * qc.element_size()  # the query in, the output out
        t_ms = timer(lambda qc=qc, kc=kc, vc=vc: sparse_decode_attention(qc, kc, vc, plan, backend="triton"),
                     device)
        e_ms = timer(lambda qc=qc, kc=kc, vc=vc: sparse_decode_attention(qc, kc, vc, plan, backend="torch"),
                     device)

        def dense(qc=qc, kc=kc, vc=vc):
            torch.nn.functional.scaled_dot_product_attention(qc[:, :, None], kc, vc, enable_gqa=True)

        d_ms = timer(dense, device)
        record("sparse decode attention", f"b{batch} {q_heads}/{kv_heads}h s{seq} d{dim} {name}", moved, t_ms,
               e_ms, err, tol, bandwidth, f"{plan.n_tokens} of {seq} tokens; dense SDPA {d_ms:.3f} ms")


def print_table() -> bool:
    header = ("kernel", "shape", "triton ms", "eager ms", "vs eager", "floor ms", "% of floor", "rel err",
              "note")
    lines = [header]
    for r in ROWS:
        lines.append((
            r["kernel"], r["shape"], f"{r['triton_ms']:.3f}", f"{r['eager_ms']:.3f}",
            f"{r['eager_ms'] / r['triton_ms']:.2f}x", f"{r['floor_ms']:.3f}",
            f"{100 * r['floor_ms'] / r['triton_ms']:.0f}%", f"{r['err']:.1e}{'' if r['ok'] else ' FAIL'}",
            r["note"],
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print(" | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    return all(r["ok"] for r in ROWS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny CPU shapes under TRITON_INTERPRET=1")
    parser.add_argument("--bandwidth", type=float, default=4.3e12, help="HBM bytes/s for the floor")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU interpreter check", file=sys.stderr)
        return 2
    name = "CPU (interpreter)" if args.smoke else torch.cuda.get_device_name(0)
    import triton

    print(f"device {name}, torch {torch.__version__}, triton {triton.__version__}, floor at "
          f"{args.bandwidth / 1e12:.1f} TB/s")
    dtype = torch.bfloat16
    for check in (check_rope, check_logprob, check_sparse):
        started = time.perf_counter()
        check(device, dtype, not args.smoke, args.bandwidth)
        print(f"{check.__name__} done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0 if print_table() else 1


if __name__ == "__main__":
    sys.exit(main())
