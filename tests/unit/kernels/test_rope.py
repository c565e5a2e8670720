"""rope_shift against rotating from scratch: shifting keys encoded at p must equal encoding at p + d."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kernels.rope import rope_shift


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
