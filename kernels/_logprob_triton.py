"""Triton kernels for selective log-probabilities: one pass over the vocabulary per block of rows.

Each program owns a block of rows and walks the vocabulary in tiles, keeping an online softmax
(running max m and running sum l of exp(logit - m)) and picking up the target logit when its tile
passes; neither the logits nor the probabilities are ever written to memory. The head variant also
computes each logit tile on the fly as a [rows, d] x [d, tile] product (tl.dot), so it reads the
hidden rows and the head weight once per row block and writes two floats per row.

Imported only when a Triton path is taken (see kernels/logprob.py for the reference and the backward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton import interpreting

__all__ = ["head_lse_target", "logits_lse_target"]


def _outputs(n_rows: int, device, lse, target):
    for name, buf in (("lse", lse), ("target", target)):
        bad = buf is not None and (buf.shape != (n_rows,) or buf.dtype != torch.float32)
        if bad or (buf is not None and not buf.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous float32 [{n_rows}] buffer")
    lse = torch.empty(n_rows, dtype=torch.float32, device=device) if lse is None else lse
    target = torch.empty(n_rows, dtype=torch.float32, device=device) if target is None else target
    return lse, target


@triton.jit
def _logits_lse_kernel(
    logits_ptr, tok_ptr, lse_ptr, target_ptr,
    n_rows, vocab, stride_row, inv_temp,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    tok = tl.load(tok_ptr + row)
    cols = tl.arange(0, BLOCK_V)
    m = tl.full((BLOCK_V,), float("-inf"), tl.float32)  # per-lane running max
    s = tl.zeros((BLOCK_V,), tl.float32)  # per-lane running sum of exp(x - m)
    target = tl.zeros((BLOCK_V,), tl.float32)
    for start in range(0, vocab, BLOCK_V):
        idx = start + cols
        valid = idx < vocab
        x = tl.load(logits_ptr + row * stride_row + idx, mask=valid, other=float("-inf")).to(tl.float32)
        x = x * inv_temp
        new_m = tl.maximum(m, x)
        # Lanes that have seen only -inf keep s = 0 (exp(-inf - -inf) would be NaN).
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)
        s = s * tl.exp(m - safe_m) + tl.where(valid, tl.exp(x - safe_m), 0.0)
        m = new_m
        target += tl.where(idx == tok, x, 0.0)
    top = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - top), axis=0)
    tl.store(lse_ptr + row, top + tl.log(total))
    tl.store(target_ptr + row, tl.sum(target, axis=0))


def logits_lse_target(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, *, lse=None,
                      target=None):
    """(log-sum-exp, target logit) float32 [n] of logit rows [n, vocab] scaled by 1 / temperature.

    `lse` and `target` are optional float32 [n] output buffers.
    """
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    n_rows, vocab = logits.shape
    lse, target = _outputs(n_rows, logits.device, lse, target)
    if n_rows:
        block_v = min(4096, triton.next_power_of_2(vocab))
        _logits_lse_kernel[(n_rows,)](
            logits, tokens.contiguous(), lse, target, n_rows, vocab, logits.stride(0),
            1.0 / temperature, BLOCK_V=block_v,
        )
    return lse, target


@triton.jit
def _head_lse_kernel(
    h_ptr, w_ptr, b_ptr, tok_ptr, m_ptr, s_ptr, target_ptr,
    n_rows, vocab, dim, stride_h, stride_w, inv_temp, split_vocab,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Program (row block, vocabulary split): its rows' partial (max, sum, target) over one slice of
    # the vocabulary, so a few thousand rows still fill a large GPU.
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    tok = tl.load(tok_ptr + rows, mask=row_ok, other=-1)
    cols = tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BLOCK_K)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_M,), tl.float32)
    target = tl.zeros((BLOCK_M,), tl.float32)
    v_end = tl.minimum(vocab, (split + 1) * split_vocab)
    for v0 in range(split * split_vocab, v_end, BLOCK_V):
        vidx = v0 + cols
        v_ok = vidx < vocab
        acc = tl.zeros((BLOCK_M, BLOCK_V), tl.float32)  # [rows, tile] logits
        for k0 in range(0, dim, BLOCK_K):
            kidx = k0 + ks
            k_ok = kidx < dim
            h = tl.load(h_ptr + rows[:, None] * stride_h + kidx[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            w = tl.load(w_ptr + vidx[:, None] * stride_w + kidx[None, :],
                        mask=v_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_V, BLOCK_K]
            if UPCAST:
                h = h.to(tl.float32)
                w = w.to(tl.float32)
            if IEEE:
                acc = tl.dot(h, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(h, tl.trans(w), acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + vidx, mask=v_ok, other=0.0).to(tl.float32)[None, :]
        x = tl.where((vidx < v_end)[None, :], acc * inv_temp, float("-inf"))
        new_m = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m[:, None]), axis=1)
        m = new_m
        target += tl.sum(tl.where(vidx[None, :] == tok[:, None], x, 0.0), axis=1)
    out = split * n_rows + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s_ptr + out, s, mask=row_ok)
    tl.store(target_ptr + out, target, mask=row_ok)


def _vocab_splits(row_blocks: int, vocab_tiles: int, device) -> int:
    """Enough vocabulary splits for about four programs per multiprocessor (2 without a GPU)."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(vocab_tiles, triton.cdiv(4 * sms, row_blocks)))
    return min(2, vocab_tiles)


def head_lse_target(hidden, weight, bias, tokens, temperature: float, *, lse=None, target=None,
                    splits: int | None = None, poison_scratch: bool = False):
    """(log-sum-exp, target logit) float32 [n] of (hidden [n, d] @ weight.T + bias) / temperature.

    `splits` divides the vocabulary among programs (default: enough to fill the device); the
    partial results are merged here. `poison_scratch` fills the partial buffers with NaN first (tests).
    """
    weight = weight.contiguous()
    hidden = hidden.to(weight.dtype).contiguous()  # tl.dot wants one input dtype
    n_rows, dim = hidden.shape
    vocab = weight.shape[0]
    lse, target = _outputs(n_rows, hidden.device, lse, target)
    if not n_rows:
        return lse, target
    block_m, block_v, block_k = (16 if n_rows <= 16 else 64), 128, 64
    row_blocks, vocab_tiles = triton.cdiv(n_rows, block_m), triton.cdiv(vocab, block_v)
    splits = splits or _vocab_splits(row_blocks, vocab_tiles, hidden.device)
    split_vocab = triton.cdiv(vocab_tiles, splits) * block_v
    splits = triton.cdiv(vocab, split_vocab)
    fill = float("nan") if poison_scratch else 0.0
    part_m, part_s, part_t = (
        torch.full((splits, n_rows), fill, dtype=torch.float32, device=hidden.device) for _ in range(3)
    )
    _head_lse_kernel[(row_blocks, splits)](
        hidden, weight, bias if bias is not None else hidden, tokens.contiguous(), part_m, part_s, part_t,
        n_rows, vocab, dim, hidden.stride(0), weight.stride(0), 1.0 / temperature, split_vocab,
        HAS_BIAS=bias is not None, IEEE=hidden.dtype == torch.float32,
        # Triton 3.9's interpreter computes bfloat16/float16 tl.dot wrongly (tiles of garbage); under it,
        # half-precision tiles are widened to float32 first. On a GPU they go to the tensor cores as is.
        UPCAST=interpreting() and hidden.dtype != torch.float32,
        BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k,
    )
    top = part_m.amax(dim=0)
    lse.copy_(top + (part_s * torch.exp(part_m - top)).sum(dim=0).log())
    target.copy_(part_t.sum(dim=0))  # only the split holding the token contributes
    return lse, target
