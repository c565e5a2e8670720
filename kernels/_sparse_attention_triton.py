"""Triton kernel for block-sparse decode attention (flash-decoding style, over a planned token list).

The tokens one KV head attends to are listed virtually as sinks, then the chosen blocks, then the
window; program (b * kv_heads + h, split) walks one slice of that list in tiles, mapping each virtual
index to its cache position, and keeps an online softmax for all query heads of the group at once, so
each key and value row is read once per group. The splits' partial (max, sum, accumulator) are merged
in torch. Imported only when a Triton path is taken (see kernels/sparse_attention.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["sparse_decode_triton"]


@triton.jit
def _sparse_decode_kernel(
    q_ptr, k_ptr, v_ptr, ids_ptr, m_ptr, l_ptr, acc_ptr,
    kv_heads, group, dim, n_virtual, split_len, sink_end, n_block_tokens, window_start, block_size,
    sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, si_b, si_h, scale,
    GP: tl.constexpr, DP: tl.constexpr, BLOCK_T: tl.constexpr,
):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = bh // kv_heads
    h = bh % kv_heads
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    g_ok = g < group
    d_ok = d < dim
    q = tl.load(q_ptr + b * sq_b + (h * group + g)[:, None] * sq_h + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32) * scale  # [GP, DP]
    m = tl.full((GP,), float("-inf"), tl.float32)
    total = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, DP), tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, n_virtual)
    for t0 in range(start, end, BLOCK_T):
        v_idx = t0 + tl.arange(0, BLOCK_T)
        t_ok = v_idx < end
        j = v_idx - sink_end
        in_blocks = (j >= 0) & (j < n_block_tokens)
        blk = tl.load(ids_ptr + b * si_b + h * si_h + j // block_size, mask=in_blocks & t_ok, other=0)
        in_window = window_start + j - n_block_tokens
        pos = tl.where(j < 0, v_idx, tl.where(in_blocks, blk * block_size + j % block_size, in_window))
        tile_ok = t_ok[:, None] & d_ok[None, :]
        kt = tl.load(k_ptr + b * sk_b + h * sk_h + pos[:, None] * sk_s + d[None, :],
                     mask=tile_ok, other=0.0).to(tl.float32)  # [BLOCK_T, DP]
        s = tl.sum(q[:, None, :] * kt[None, :, :], axis=2)  # [GP, BLOCK_T]
        s = tl.where(t_ok[None, :], s, float("-inf"))
        new_m = tl.maximum(m, tl.max(s, axis=1))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        alpha = tl.exp(m - safe_m)
        p = tl.exp(s - safe_m[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_ptr + b * sv_b + h * sv_h + pos[:, None] * sv_s + d[None, :],
                     mask=tile_ok, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt[None, :, :], axis=1)
        m = new_m
    row = (bh * n_splits + split) * GP + g
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, total)
    tl.store(acc_ptr + row[:, None] * DP + d[None, :], acc)


def sparse_decode_triton(query, keys, values, plan, *, scale=None, split_len: int = 256, block_t: int = 32,
                         poison_scratch: bool = False):
    """Sparse decode attention [b, q_heads, d] of `plan`'s tokens, in the query's dtype.

    `split_len` virtual tokens per program; `poison_scratch` fills the per-split buffers with NaN first
    (tests: a program that skips its store then shows up in the result).
    """
    batch, q_heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = q_heads // kv_heads
    scale = dim**-0.5 if scale is None else scale
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    values = values if values.stride(-1) == 1 else values.contiguous()
    query = query if query.stride(-1) == 1 else query.contiguous()
    ids = plan.blocks.to(device=keys.device, dtype=torch.int32).contiguous()
    n_block_tokens = ids.shape[-1] * plan.block_size
    n_virtual = plan.n_tokens
    split_len = max(block_t, split_len // block_t * block_t)
    n_splits = max(1, triton.cdiv(n_virtual, split_len))
    gp, dp = max(2, triton.next_power_of_2(group)), triton.next_power_of_2(dim)
    alloc = torch.full if poison_scratch else (lambda shape, _, **kw: torch.empty(shape, **kw))
    m = alloc((batch * kv_heads, n_splits, gp), float("nan"), dtype=torch.float32, device=keys.device)
    lsum = alloc((batch * kv_heads, n_splits, gp), float("nan"), dtype=torch.float32, device=keys.device)
    acc = alloc((batch * kv_heads, n_splits, gp, dp), float("nan"), dtype=torch.float32, device=keys.device)
    _sparse_decode_kernel[(batch * kv_heads, n_splits)](
        query, keys, values, ids, m, lsum, acc,
        kv_heads, group, dim, n_virtual, split_len, plan.sink_end, n_block_tokens, plan.window_start,
        plan.block_size,
        query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        ids.stride(0) if ids.numel() else 0, ids.stride(1) if ids.numel() else 0, scale,
        GP=gp, DP=dp, BLOCK_T=block_t,
    )
    # Merge the splits: weights exp(m_split - m_max); empty splits carry m = -inf and weigh 0.
    top = m.amax(dim=1, keepdim=True)  # [b*kv, 1, gp]
    weight = torch.exp(m - top)
    total = (lsum * weight).sum(dim=1)  # [b*kv, gp]
    out = (acc * weight[..., None]).sum(dim=1) / total[..., None]  # [b*kv, gp, dp]
    out = out[:, :group, :dim].reshape(batch, kv_heads * group, dim)
    return out.to(query.dtype)
