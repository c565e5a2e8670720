"""rope_shift against rotating from scratch: shifting keys encoded at p must equal encoding at p + d."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kernels.rope import rope_shift, rope_shift_naive, rope_shift_reference, rope_shift_triton
from tests.unit.kernels.conftest import max_rel_err, requires_triton


def _inv_freq(rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate un-rotated keys [b, h, s, d] to `positions` [s] the way a model does at encode time."""
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)  # [s, half]
    rot = 2 * inv_freq.shape[0]
    if layout == "rotate_half":
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().float()[None], emb.sin().float()[None]
        rotated, _ = apply_rotary_pos_emb(x[..., :rot], x[..., :rot], cos, sin)
    else:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
        cos, sin = angles.cos().float(), angles.sin().float()
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, x[..., rot:]), dim=-1)


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("shape", [(1, 3, 17, 64), (2, 1, 5, 32), (1, 4, 33, 48)])
def test_shift_equals_encoding_at_the_new_position(layout, shape):
    gen = torch.Generator().manual_seed(hash((layout, shape)) % 2**31)
    raw = torch.randn(shape, generator=gen)
    inv_freq = _inv_freq(shape[-1])
    start = torch.arange(shape[2]) + 7
    deltas = torch.randint(-5, 900, (shape[2],), generator=gen)
    cached = _rotate(raw, start, inv_freq, layout)
    expected = _rotate(raw, start + deltas, inv_freq, layout)
    got = rope_shift(cached, deltas, inv_freq, layout=layout)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_per_document_deltas_in_one_call_and_in_place():
    inv_freq = _inv_freq(64)
    raw = torch.randn(1, 2, 12, 64)
    start = torch.cat((torch.arange(5), torch.arange(7)))  # two documents, each encoded from 0
    deltas = torch.cat((torch.full((5,), 10), torch.full((7,), 15)))  # placed at 10 and 15
    cached = _rotate(raw, start, inv_freq, "rotate_half")
    expected = _rotate(raw, torch.arange(10, 22), inv_freq, "rotate_half")
    same = rope_shift(cached, deltas, inv_freq, out=cached)
    assert same is cached
    torch.testing.assert_close(cached, expected, rtol=1e-5, atol=1e-5)


def test_shift_into_a_slice_of_a_larger_tensor_writes_only_that_slice():
    # Composition shifts each document straight into its span of the composed keys.
    inv_freq = _inv_freq(64)
    raw = torch.randn(3, 2, 7, 64)
    cached = _rotate(raw, torch.arange(7), inv_freq, "rotate_half")
    composed = torch.zeros(3, 2, 20, 64)
    got = rope_shift(cached, 9, inv_freq, out=composed[:, :, 9:16])
    expected = _rotate(raw, torch.arange(9, 16), inv_freq, "rotate_half")
    torch.testing.assert_close(composed[:, :, 9:16], expected, rtol=1e-5, atol=1e-5)
    assert got.data_ptr() == composed[:, :, 9:16].data_ptr()
    assert not composed[:, :, :9].any() and not composed[:, :, 16:].any()
    torch.testing.assert_close(got, rope_shift(cached.double(), 9, inv_freq).float(), rtol=1e-6, atol=1e-6)


def test_partial_rotary_leaves_the_other_channels_alone():
    inv_freq = _inv_freq(32)  # 32 of 64 channels rotate
    keys = torch.randn(1, 2, 9, 64)
    got = rope_shift(keys, 100, inv_freq)
    assert torch.equal(got[..., 32:], keys[..., 32:])
    assert not torch.allclose(got[..., :32], keys[..., :32])


def test_shift_by_zero_is_identity_and_bfloat16_keeps_dtype():
    inv_freq = _inv_freq(64)
    keys = torch.randn(1, 2, 9, 64, dtype=torch.bfloat16)
    got = rope_shift(keys, 0, inv_freq)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, keys)


def test_round_trip_and_batched_deltas():
    inv_freq = _inv_freq(64)
    keys = torch.randn(2, 2, 6, 64)
    deltas = torch.tensor([[3] * 6, [40] * 6])
    there = rope_shift(keys, deltas, inv_freq)
    back = rope_shift(there, -deltas, inv_freq)
    torch.testing.assert_close(back, keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(there[1:], rope_shift(keys[1:], 40, inv_freq))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda k, f: rope_shift(k, 1, f, layout="neox"), "unknown rope layout"),
        (lambda k, f: rope_shift(k[0], 1, f), "must be"),
        (lambda k, f: rope_shift(k, torch.zeros(5), f), "does not fit"),
        (lambda k, f: rope_shift(k, 1, _inv_freq(128)), "more than head_dim"),
    ],
)
def test_bad_arguments_are_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(1, 2, 9, 64), _inv_freq(64))


def test_naive_route_agrees_with_the_shift():
    inv_freq = _inv_freq(64)
    for layout in ("rotate_half", "interleaved"):
        raw = torch.randn(1, 2, 21, 64)
        positions = torch.arange(21) + 3
        cached = _rotate(raw, positions, inv_freq, layout)
        got = rope_shift_naive(cached, positions, 40, inv_freq, layout=layout)
        torch.testing.assert_close(got, rope_shift(cached, 40, inv_freq, layout=layout), rtol=1e-4, atol=1e-4)


def test_bad_arguments_get_clear_errors():
    inv_freq = _inv_freq(64)
    with pytest.raises(ValueError, match="unknown rope layout"):
        rope_shift(torch.randn(1, 1, 2, 64), 1, inv_freq, layout="neox")
    with pytest.raises(ValueError, match="batch, kv_heads, seq, head_dim"):
        rope_shift(torch.randn(2, 64), 1, inv_freq)
    with pytest.raises(ValueError, match="more than head_dim"):
        rope_shift(torch.randn(1, 1, 2, 32), 1, inv_freq)
    with pytest.raises(ValueError, match="does not fit"):
        rope_shift(torch.randn(1, 1, 4, 64), torch.arange(3), inv_freq)
    with pytest.raises(ValueError, match="out has shape"):
        rope_shift(torch.randn(1, 1, 4, 64), 1, inv_freq, out=torch.empty(1, 1, 5, 64))


@requires_triton
@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
@pytest.mark.parametrize(
    "shape, rot_dim, delta_kind",
    [
        ((1, 3, 17, 64), 64, "scalar"),
        ((2, 1, 5, 32), 32, "batched"),
        ((1, 4, 33, 48), 32, "per_position"),  # partial rotary: 16 channels pass through
        ((3, 2, 1, 80), 80, "per_position"),  # half = 40, not a power of two
    ],
)
def test_triton_kernel_matches_the_reference(layout, shape, rot_dim, delta_kind):
    gen = torch.Generator().manual_seed(hash((layout, shape, delta_kind)) % 2**31)
    keys = torch.randn(shape, generator=gen)
    inv_freq = _inv_freq(rot_dim)
    batch, _, seq, _ = shape
    delta = {
        "scalar": 1234,
        "per_position": torch.randint(-50, 9000, (seq,), generator=gen),
        "batched": torch.randint(-50, 9000, (batch, seq), generator=gen),
    }[delta_kind]
    want = rope_shift_reference(keys, delta, inv_freq, layout=layout)
    out = torch.full_like(keys, float("nan"))
    got = rope_shift_triton(keys, delta, inv_freq, layout=layout, out=out)
    assert got is out
    assert max_rel_err(got, want) < 1e-5
    fresh = rope_shift_triton(keys, delta, inv_freq, layout=layout)  # out=None allocates
    assert max_rel_err(fresh, want) < 1e-5
    in_place = keys.clone()
    rope_shift_triton(in_place, delta, inv_freq, layout=layout, out=in_place)
    assert max_rel_err(in_place, want) < 1e-5


@requires_triton
def test_triton_kernel_on_strided_bfloat16_keys():
    keys = torch.randn(2, 7, 3, 64).transpose(1, 2)  # [b, h, s, d] with non-contiguous strides
    inv_freq = _inv_freq(64)
    want = rope_shift_reference(keys, 77, inv_freq)
    assert max_rel_err(rope_shift_triton(keys, 77, inv_freq), want) < 1e-5
    bf = keys.to(torch.bfloat16)
    got = rope_shift_triton(bf, 77, inv_freq)
    assert got.dtype == torch.bfloat16
    # One bfloat16 step at most: the interpreter's float32 -> bfloat16 cast may round differently.
    torch.testing.assert_close(got, rope_shift_reference(bf, 77, inv_freq), rtol=8e-3, atol=8e-3)


def test_cpu_tensors_dispatch_to_the_reference(monkeypatch):
    import kernels.rope as rope

    monkeypatch.setattr(rope, "rope_shift_triton", lambda *a, **k: pytest.fail("CPU keys took Triton"))
    keys, inv_freq = torch.randn(1, 1, 3, 64), _inv_freq(64)
    torch.testing.assert_close(rope.rope_shift(keys, 5, inv_freq), rope_shift_reference(keys, 5, inv_freq))
