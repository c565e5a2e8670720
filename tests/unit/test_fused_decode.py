"""The fused CPU step (kernels/cpu_decode.c): one call runs a few tokens through every layer.

Checked against the lean engine's torch step on the real embedded model over real code (same
tokens, logits within float32 rounding), for both weight layouts and both thread counts, and for
what happens when the library cannot be built, its source is not installed or a cached copy is
damaged: the engine falls back to its torch steps (one warning per process) and generation goes on;
and for the cache key, which names the CPU the library was built for.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from context.decode import DecodeEngine
from kernels import cpu_decode

REPO = Path(__file__).resolve().parents[2]


needs_compiler = pytest.mark.skipif(
    cpu_decode.compiler() is None, reason="no C compiler (cc): install gcc (.ci/system-packages.sh)")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """A private library cache, and the module's memory of earlier builds forgotten (both ways)."""
    monkeypatch.setenv("SQUIDCODE_KERNEL_CACHE", str(tmp_path / "kernels"))
    cpu_decode.reset()
    yield tmp_path / "kernels"
    cpu_decode.reset()


def _greedy(engine: DecodeEngine, ids: list[int], steps: int, threads: int = 0):
    """Greedy tokens and the logits of each single-token step after prefilling `ids`."""
    engine.fused_threads = threads
    cache = engine.new_cache()
    tokens, logits = [], []
    with torch.inference_mode():
        last = engine.forward(torch.tensor([ids]), cache)[:, -1]
        for _ in range(steps):
            token = last.argmax(-1, keepdim=True)
            tokens.append(int(token))
            last = engine.forward(token, cache)[:, -1]
            logits.append(last)
    return tokens, torch.cat(logits)


def _tolerance(engine: DecodeEngine) -> float:
    """How far the fused step's logits may be from the torch steps': float32 rounding where it
    multiplies in float32; where 4-bit codes meet activations rounded to 15 bits in integer
    products (AVX-512 VNNI or AVX2), what that rounding moves a logit of about 20 by over 30 layers (at most
    0.0097 measured on these prompts; the top token stays the same)."""
    return 2.5e-2 if engine.fused_step.activation_bits else 2e-3


def _prompt(runtime) -> list[int]:
    return runtime.encode((REPO / "context/squid/compose.py").read_text())[:400]


@needs_compiler
@pytest.mark.parametrize(("q4", "integer"), [(True, True), (True, False), (False, True)])
def test_fused_steps_decode_as_the_torch_steps_do(runtime, kernel_cache, q4, integer):
    ids = _prompt(runtime)
    fused = DecodeEngine(runtime.model, quantize_head=False, fused_q4=q4, fused_integer=integer)
    if not (q4 and integer):  # `model.fused_integer = false`, or float32 weights: float32 products
        assert fused.fused_step.activation_bits == 0
    plain = DecodeEngine(runtime.model, quantize_head=False, fused_step=False)
    assert fused.fused_step is not None and plain.fused_step is None
    # The embedded model's weights are exactly 4-bit; without q4 the step reads the float32
    # tensors, which the runtime keeps in transposed memory.
    assert fused.fused_step.layout == (cpu_decode.LAYOUT_Q4 if q4 else cpu_decode.LAYOUT_TRANSPOSED)
    assert (fused.fused_head is not None) == q4  # the output projection from its exact 8-bit codes
    expected, expected_logits = _greedy(plain, ids, 24)
    for threads in (1, 2):
        tokens, logits = _greedy(fused, ids, 24, threads)
        assert tokens == expected
        assert (logits - expected_logits).abs().max() < _tolerance(fused)
    assert list(kernel_cache.glob("cpu_decode-*.so"))  # built into the configured cache


@needs_compiler
@pytest.mark.parametrize(("context", "tokens", "q4"), [(391, 9, True), (256, 16, True), (255, 2, True),
                                                      (391, 9, False)])
def test_a_verify_pass_of_several_tokens_matches_torch(runtime, kernel_cache, context, tokens, q4):
    # Prompt lookup checks its drafts in one pass: every position's logits, each token attending
    # to the ones before it and not after. Several tokens attend in chunks of 256 positions, the
    # new ones in the last chunk: 256 and 255 cached positions put that chunk's start at the first
    # new token's own position and one before it.
    ids = _prompt(runtime)[: context + tokens]
    logits, engines = {}, {}
    for fused in (True, False):
        engine = DecodeEngine(runtime.model, quantize_head=False, fused_step=fused, fused_q4=q4)
        engines[fused] = engine
        cache = engine.new_cache()
        with torch.inference_mode():
            engine.forward(torch.tensor([ids[:context]]), cache)
            logits[fused] = engine.forward(torch.tensor([ids[context:]]), cache, all_logits=True)[0]
            assert cache.length == len(ids) and cache.ids == ids
    assert logits[True].shape == (tokens, runtime.model.config.vocab_size)
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
    assert (logits[True] - logits[False]).abs().max() < _tolerance(engines[True])


def _cpu_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.is_file() else []:
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


# Each -march level builds a vector width of its own (cpu_decode.c's VL): SSE2 4 floats, AVX2 8.
# A width without registers of its size (16 floats on AVX2) keeps every vector in memory: 4-bit
# decoding on an AVX2 EPYC ran at a fifth of torch's speed before the step used the machine's width.
_LEVELS = {"x86-64": {"sse2"}, "x86-64-v3": {"avx2", "fma", "bmi2", "f16c", "movbe"}}


@needs_compiler
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the -march levels named here are x86-64's")
@pytest.mark.parametrize("level", sorted(_LEVELS))
def test_every_vector_width_decodes_as_the_torch_steps_do(runtime, kernel_cache, monkeypatch, level):
    flags = _cpu_flags()
    if not _LEVELS[level] <= flags:
        pytest.skip(f"this CPU cannot run -march={level} code")
    if level == "x86-64-v3" and "avx512f" not in flags:
        pytest.skip("the native build has this width here (the tests above check it)")
    _build_for(monkeypatch, level)
    ids = _prompt(runtime)[:300]
    # 4-bit codes in float32 products, the 8-bit head
    fused = DecodeEngine(runtime.model, quantize_head=False, fused_integer=False)
    plain = DecodeEngine(runtime.model, quantize_head=False, fused_step=False)
    assert fused.fused_step.layout == cpu_decode.LAYOUT_Q4 and fused.fused_head is not None
    assert f"-march={level}" in cpu_decode.FLAGS and cpu_decode.loaded_library().parent == kernel_cache
    assert fused.fused_step.activation_bits == 0
    # integer products: AVX2 has them (vpmaddubsw), plain SSE2 does not
    integer = DecodeEngine(runtime.model, quantize_head=False)
    assert integer.fused_step.integer_products == ("AVX2" if level == "x86-64-v3" else "")
    expected, expected_logits = _greedy(plain, ids, 12)
    tokens, logits = _greedy(fused, ids, 12, threads=2)
    assert tokens == expected
    assert (logits - expected_logits).abs().max() < 2e-3
    # several tokens at once (a verify pass: the lane layout)
    cache = {name: engine.new_cache() for name, engine in (("fused", fused), ("plain", plain))}
    with torch.inference_mode():
        passes = {name: (engine.forward(torch.tensor([ids[:280]]), cache[name]),
                         engine.forward(torch.tensor([ids[280:]]), cache[name], all_logits=True)[0])[1]
                  for name, engine in (("fused", fused), ("plain", plain))}
    assert torch.equal(passes["fused"].argmax(-1), passes["plain"].argmax(-1))
    assert (passes["fused"] - passes["plain"]).abs().max() < 2e-3


def _build_for(monkeypatch, level: str) -> None:
    """The step built with -march=`level` instead of the CPU's own (`native`: unchanged)."""
    if level != "native":
        monkeypatch.setattr(cpu_decode, "FLAGS", tuple(f"-march={level}" if flag == "-march=native" else flag
                                                       for flag in cpu_decode.FLAGS))


def _integer_products(flags: set[str]) -> str:
    """The integer products a native build runs on a CPU with these flags ("" for none)."""
    if {"avx512_vnni", "avx512bw", "avx512vl"} <= flags:
        return "AVX-512 VNNI"
    if {"avx2", "fma", "f16c"} <= flags and "avx512f" not in flags:
        return "AVX2"
    return ""


@needs_compiler
@pytest.mark.parametrize("level", ["native", "x86-64-v3"])
def test_integer_products_keep_the_float_models_next_tokens(runtime, kernel_cache, monkeypatch, level):
    # Where the CPU has AVX-512 VNNI or AVX2, 4-bit codes meet activations rounded to 15 bits in
    # integer products (llama.cpp's Q4_1 x Q8_1 keeps 8). Over real code, in passes of 1 token
    # (decoding) and 8 (verify passes), the top token is the float32 model's wherever that model's
    # first two are more than 0.01 apart (measured with AVX-512 VNNI: 2 of 256 single steps differ,
    # at gaps of 0.0023 and 0.0005; AVX2 on the same CPU: 3), and the distributions differ by a KL
    # divergence of about 1e-6 (either instruction set).
    from context.quant import _all_logits

    flags = _cpu_flags()
    if level == "x86-64-v3":
        if platform.machine() != "x86_64" or not {"avx2", "fma", "f16c"} <= flags:
            pytest.skip("this CPU cannot run -march=x86-64-v3 code")
        if "avx512f" not in flags:
            pytest.skip("the native build is the AVX2 one here")
        expected_products = "AVX2"
    else:
        expected_products = _integer_products(flags) if platform.machine() == "x86_64" else ""
    _build_for(monkeypatch, level)
    fused = DecodeEngine(runtime.model, quantize_head=False)
    assert fused.fused_step.integer_products == expected_products
    assert fused.fused_step.activation_bits == (15 if expected_products else 0)
    described = runtime.describe_steps(fused)  # what `squidcode doctor` prints
    assert (f"15-bit integer activations ({expected_products})" in described if expected_products
            else "x float32 activations" in described)
    if not expected_products:  # the assertions above have checked the float path is the one running here
        pytest.skip("no integer products on this CPU: the step multiplies in float32 (tests above check it)")
    plain = DecodeEngine(runtime.model, quantize_head=False, fused_step=False)
    ids = runtime.encode((REPO / "context/index/store.py").read_text())
    for chunk, positions in ((1, 256), (8, 512)):
        with torch.inference_mode():
            expected = _all_logits(plain, ids[:positions], chunk)
            got = _all_logits(fused, ids[:positions], chunk)
        top2 = expected.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 0.01
        assert torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
        assert int((~clear).sum()) <= positions // 32  # near ties are few, so this checks most positions
        kl = torch.nn.functional.kl_div(got.log_softmax(-1), expected.log_softmax(-1), log_target=True,
                                        reduction="none").sum(-1)
        assert float(kl.mean()) < 1e-4 and float(kl.max()) < 1e-3


def test_4_bit_codes_give_back_the_embedded_models_weights_exactly(runtime):
    weight = runtime.model.model.layers[3].mlp.down_proj.weight.detach()
    codes, steps, offsets = cpu_decode.pack_q4(weight)
    assert codes.dtype == torch.uint8 and codes.shape == (weight.shape[0], weight.shape[1] // 2)
    grouped = codes.view(weight.shape[0], -1, 16)  # byte j of a group: codes j (low) and j + 16 (high)
    q = torch.cat([grouped & 15, grouped >> 4], dim=-1).float()  # [out, in / 32, 32]
    assert steps.dtype == offsets.dtype == torch.float16  # as GGUF stores them: a third of the bytes read
    assert torch.equal(offsets[..., None].float() + q * steps[..., None].float(), weight.view_as(q))
    assert cpu_decode.pack_q4(weight) is cpu_decode.pack_q4(weight)  # packed once per tensor


def test_weights_off_the_4_bit_grid_are_not_packed():
    generator = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (8, 2, 32), generator=generator)
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 groups span their codes: minimum 0, maximum 15
    grid = (q.float() * 2.0**-7 - 0.0625).view(8, 64)
    codes, steps, offsets = cpu_decode.pack_q4(grid)
    assert torch.equal(steps.float(), torch.full((8, 2), 2.0**-7))
    assert torch.equal(offsets.float(), torch.full((8, 2), -0.0625))
    fine = (q.float() * 2.0**-7 - 0.0625 * (1 + 2.0**-20)).view(8, 64)  # on a grid, its offset no float16
    assert cpu_decode.pack_q4(fine) is None
    grid[5, 40] += 1e-4  # one value between two steps of its group
    assert cpu_decode.pack_q4(grid) is None  # the changed tensor (a new version) is checked again
    assert cpu_decode.pack_q4(torch.zeros(4, 48)) is None  # 48 inputs: not whole groups of 32


@needs_compiler
def test_the_8_bit_head_gives_the_float32_logits(runtime, kernel_cache):
    weight = runtime.model.lm_head.weight
    codes, steps = cpu_decode.pack_q8(weight)  # the embedded model's token embeddings are GGUF Q8_0
    assert steps.dtype == torch.float16
    grouped = codes.float().view(codes.shape[0], -1, 32)
    assert torch.equal((grouped * steps[..., None].float()).view_as(weight), weight.detach())
    head = cpu_decode.FusedHead.build(weight)
    generator = torch.Generator().manual_seed(1)
    for rows in (1, 5):
        hidden = torch.randn(1, rows, weight.shape[1], generator=generator)
        got, want = head(hidden, 2), torch.nn.functional.linear(hidden, weight.detach())
        assert got.shape == want.shape
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    off_grid = weight.detach()[:64].clone()
    off_grid[3, 7] += 1e-3
    assert cpu_decode.FusedHead.build(off_grid) is None


@needs_compiler
def test_a_model_that_is_not_4_bit_is_stepped_in_float32(runtime, kernel_cache):
    engine = DecodeEngine(runtime.model, quantize_head=False)
    names = cpu_decode._WEIGHTS_PER_LAYER
    own = [dict(zip(names, engine.fused_step._tensors[i * len(names) : (i + 1) * len(names)], strict=True))
           for i in range(engine.fused_step.layers)]
    own[7] = {**own[7], "up": own[7]["up"] * 1.0001}  # off the grid: no longer 4-bit
    step = cpu_decode.FusedDecodeStep.build(
        own, q4=True, hidden=engine.fused_step.hidden, inter=engine.fused_step.inter, heads=engine.heads,
        kv_heads=engine.kv_heads, head_dim=engine.head_dim, eps=engine.eps, scaling=engine.scaling,
        cos=engine._cos, sin=engine._sin)
    assert step is not None and step.layout != cpu_decode.LAYOUT_Q4


@needs_compiler
def test_row_major_weights_give_the_same_step(runtime, kernel_cache):
    engine = DecodeEngine(runtime.model, quantize_head=False, fused_q4=False)
    step = engine.fused_step
    names = cpu_decode._WEIGHTS_PER_LAYER
    own = [step._tensors[i * len(names) : (i + 1) * len(names)] for i in range(step.layers)]
    layers = [{name: w.contiguous() if w.dim() == 2 else w for name, w in zip(names, weights, strict=True)}
              for weights in own]
    row_major = cpu_decode.FusedDecodeStep.build(
        layers, hidden=step.hidden, inter=step.inter, heads=step.heads, kv_heads=step.kv_heads,
        head_dim=step.head_dim, eps=step.eps, scaling=step.scaling, cos=engine._cos, sin=engine._sin)
    assert row_major is not None and not row_major.transposed
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(step.layers, step.kv_heads, 64, step.head_dim, generator=generator) * 0.5
    values = torch.randn(keys.shape, generator=generator)
    embedding = engine.embed[runtime.encode("def")[0]].detach()
    outputs = []
    for runner in (step, row_major):
        k, v = keys.clone(), values.clone()
        outputs.append((runner(embedding.clone(), k, v, 40, 2), k, v))
    (a, ka, va), (b, kb, vb) = outputs
    # Thirty layers over a random cache amplify the different summation orders to about 2e-4 of
    # the largest value.
    for got, want in ((a, b), (ka, kb), (va, vb)):
        assert (got - want).abs().max() <= 1e-3 * want.abs().max()
    assert not torch.equal(ka[:, :, 40], keys[:, :, 40])  # this position's keys were written ...
    assert torch.equal(ka[:, :, 41:], keys[:, :, 41:])  # ... and nothing after it


@needs_compiler
def test_a_position_outside_the_cache_is_refused(runtime, kernel_cache):
    engine = DecodeEngine(runtime.model, quantize_head=False)
    keys = torch.zeros(engine.fused_step.layers, engine.kv_heads, 8, engine.head_dim)
    with pytest.raises(ValueError, match="positions 8..8 of a 8-position cache"):
        engine.fused_step(engine.embed[0].detach().clone(), keys, keys.clone(), 8)
    three = engine.embed[:3].detach().clone()  # three tokens from position 6 would end past it
    with pytest.raises(ValueError, match="positions 6..8"):
        engine.fused_step(three, keys, keys.clone(), 6)
    assert not keys.any()  # refused before anything was written


def _fallback_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == cpu_decode.__name__ and r.levelname == "WARNING"]


def test_without_a_compiler_the_engine_decodes_with_torch_steps(runtime, kernel_cache, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent")
    engine = DecodeEngine(runtime.model, quantize_head=False)
    assert engine.fused_step is None
    assert "no C compiler (/nonexistent)" in cpu_decode.unavailable_reason()
    plain = DecodeEngine(runtime.model, quantize_head=False, fused_step=False)
    ids = _prompt(runtime)
    assert _greedy(engine, ids, 4)[0] == _greedy(plain, ids, 4)[0]
    assert DecodeEngine(runtime.model, quantize_head=False).fused_step is None  # not tried again ...
    [warning] = _fallback_warnings(caplog)  # ... and said once per process
    assert "torch" in warning and "no C compiler" in warning


def test_a_failing_build_is_reported_and_not_used(runtime, kernel_cache, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # a "compiler" that exits 1
    assert DecodeEngine(runtime.model, quantize_head=False).fused_step is None
    assert cpu_decode.load_library() is None
    assert "false failed" in cpu_decode.unavailable_reason()
    assert not list(kernel_cache.glob("cpu_decode-*.so"))
    assert len(_fallback_warnings(caplog)) == 1


def test_an_installation_without_the_c_source_decodes_with_torch(runtime, kernel_cache, monkeypatch, caplog,
                                                                 tmp_path):
    # A wheel that left cpu_decode.c out: the first generation must still work.
    monkeypatch.setattr(cpu_decode, "SOURCE", tmp_path / "cpu_decode.c")
    engine = DecodeEngine(runtime.model, quantize_head=False)
    assert engine.fused_step is None and engine.fused_head is None
    assert len(_greedy(engine, _prompt(runtime), 2)[0]) == 2
    assert cpu_decode.load_library() is None
    [warning] = _fallback_warnings(caplog)
    assert "cpu_decode.c is not installed" in warning


def test_the_cached_library_is_keyed_by_the_cpu(kernel_cache, monkeypatch):
    # -march=native code built on one machine can die of an illegal instruction on another
    # that shares the home directory: each CPU gets its own build.
    cc = cpu_decode.compiler() or "cc"
    monkeypatch.setattr(cpu_decode, "cpu_identity", lambda: "model name=A; flags=sse2 avx2")
    first = cpu_decode.library_path(cc)
    assert cpu_decode.library_path(cc) == first
    monkeypatch.setattr(cpu_decode, "cpu_identity", lambda: "model name=A; flags=sse2 avx2 avx512f")
    assert cpu_decode.library_path(cc) != first
    assert first.parent == kernel_cache


def test_the_cpu_identity_names_this_machines_instruction_set():
    identity = cpu_decode.cpu_identity()
    assert identity.startswith(f"machine={platform.machine()}")
    if Path("/proc/cpuinfo").is_file() and platform.machine() == "x86_64":
        assert "flags=" in identity and "sse2" in identity  # every x86-64 CPU has SSE2


@needs_compiler
def test_a_damaged_cached_library_is_built_again(runtime, kernel_cache):
    target = cpu_decode.library_path(cpu_decode.compiler())
    target.parent.mkdir(parents=True)
    target.write_bytes(b"\x7fELF truncated")
    engine = DecodeEngine(runtime.model, quantize_head=False)
    assert engine.fused_step is not None
    assert target.read_bytes()[:4] == b"\x7fELF" and target.stat().st_size > 1000


def test_libraries_nobody_loaded_for_a_month_are_removed_at_the_next_build(tmp_path):
    import os
    import time

    from kernels.cpu_decode import STALE_S, prune_stale

    now = time.time()
    keep, fresh, stale = (tmp_path / f"cpu_decode-{name}.so" for name in ("keep", "fresh", "stale"))
    for path in (keep, fresh, stale):
        path.write_bytes(b"\x7fELF")
    os.utime(stale, (now - STALE_S - 60, now - STALE_S - 60))
    os.utime(keep, (now - STALE_S - 60, now - STALE_S - 60))  # the one just built is never removed
    (tmp_path / "other.so").write_bytes(b"")
    os.utime(tmp_path / "other.so", (0, 0))
    assert prune_stale(keep, now) == [stale]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["cpu_decode-fresh.so", "cpu_decode-keep.so", "other.so"]
