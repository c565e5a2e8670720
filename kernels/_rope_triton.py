"""Triton kernel for RoPE re-rotation: one program per (batch, head, block of positions).

Each program loads the channel pairs of its keys, rotates them by the precomputed cos/sin of their
position's shift and stores them, in any dtype, to `out` (which may be the keys themselves: every
element is read before it is written, by the same program). Imported only when a Triton path is taken.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rotate_pairs"]


@triton.jit
def _rotate_pairs_kernel(
    k_ptr, o_ptr, cos_ptr, sin_ptr,
    heads, seq, half,
    sk_b, sk_h, sk_s, sk_d, so_b, so_h, so_s, so_d, sc_b, sc_s,
    INTERLEAVED: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_P: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // heads
    h = bh % heads
    pos = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    pair = tl.arange(0, BLOCK_P)
    mask = (pos < seq)[:, None] & (pair < half)[None, :]
    if INTERLEAVED:
        c1 = 2 * pair
        c2 = 2 * pair + 1
    else:
        c1 = pair
        c2 = pair + half
    k_row = k_ptr + b * sk_b + h * sk_h + pos[:, None] * sk_s
    o_row = o_ptr + b * so_b + h * so_h + pos[:, None] * so_s
    x1 = tl.load(k_row + c1[None, :] * sk_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(k_row + c2[None, :] * sk_d, mask=mask, other=0.0).to(tl.float32)
    table = b * sc_b + pos[:, None] * sc_s + pair[None, :]
    cos = tl.load(cos_ptr + table, mask=mask, other=1.0)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    tl.store(o_row + c1[None, :] * so_d, y1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + c2[None, :] * so_d, y2.to(o_ptr.dtype.element_ty), mask=mask)


def rotate_pairs(keys: torch.Tensor, out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                 interleaved: bool) -> None:
    """Rotate the first 2 * half channels of `keys` [b, h, s, d] into `out` by cos/sin [1|b, 1|s, half]."""
    batch, heads, seq, _ = keys.shape
    half = cos.shape[-1]
    if batch * heads * seq == 0:
        return
    sc_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    sc_s = 0 if cos.shape[1] == 1 else cos.stride(1)
    block_s = 16
    grid = (batch * heads, triton.cdiv(seq, block_s))
    _rotate_pairs_kernel[grid](
        keys, out, cos, sin, heads, seq, half,
        *keys.stride(), *out.stride(), sc_b, sc_s,
        INTERLEAVED=interleaved, BLOCK_S=block_s, BLOCK_P=triton.next_power_of_2(half),
    )
