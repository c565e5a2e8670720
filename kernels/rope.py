"""RoPE re-rotation of cached keys: move keys encoded at positions p to positions p + delta.

Rotary embeddings rotate each pair of key channels by an angle proportional to the position, so
rotations compose: R(p + d) = R(d) R(p). A key cached at position p is moved to p + d by rotating it
by d alone, without the un-rotated key. This is what lets Squid attention encode a document once and
place it anywhere in a request.

Two channel layouts exist:
- "rotate_half" (Llama, Mistral, Qwen in transformers): channel i pairs with channel i + rotary_dim/2;
- "interleaved" (GPT-J, the original RoFormer): channel 2i pairs with channel 2i + 1.

`inv_freq` is the model's own inverse-frequency vector (`model.model.rotary_emb.inv_freq`), which
already carries its rope scaling (llama3, linear, dynamic at load time). A model's attention scaling
factor (yarn, longrope) multiplies cos and sin equally at encode time; a pure rotation keeps that
factor, so the shift itself uses unscaled rotations. Channels past `2 * len(inv_freq)` (partial
rotary models) are not rotated.

Three formulations live here: `rope_shift_reference` (plain torch, the test oracle and the CPU path),
a Triton kernel (`rope_shift_triton`, one read and one write of each key, used automatically for CUDA
tensors when Triton imports) and `rope_shift_naive`, the un-rotate-then-rotate route the shift
replaces, kept for the benchmark.
"""

from __future__ import annotations

import torch

from ._triton import use_triton

__all__ = ["ROPE_LAYOUTS", "rope_shift", "rope_shift_naive", "rope_shift_reference", "rope_shift_triton"]

ROPE_LAYOUTS = ("rotate_half", "interleaved")


def _shift_angles(delta: torch.Tensor | int, inv_freq: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """Angles [batch or 1, 1, seq, rotary_dim / 2] in float64, so large positions keep their precision."""
    delta = torch.as_tensor(delta, device=inv_freq.device)
    if delta.dim() == 0:
        delta = delta.expand(seq)
    if delta.dim() == 1:
        delta = delta.unsqueeze(0)  # [1, seq]
    if delta.shape[-1] != seq or delta.shape[0] not in (1, batch):
        raise ValueError(
            f"delta of shape {tuple(delta.shape)} does not fit keys with batch {batch}, seq {seq}"
        )
    angles = delta.to(torch.float64)[..., None] * inv_freq.to(torch.float64)  # [b, seq, half]
    return angles.unsqueeze(1)  # [b, 1, seq, half]


def rope_shift(
    keys: torch.Tensor,
    delta: torch.Tensor | int,
    inv_freq: torch.Tensor,
    *,
    layout: str = "rotate_half",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate `keys` [batch, kv_heads, seq, head_dim] from their positions to positions + `delta`.

    `delta` is an int (one shift for everything), a [seq] tensor (one shift per cached position,
    so several documents move by their own deltas in one call) or a [batch, seq] tensor.
    `out=keys` shifts in place; `out=None` returns a new tensor. The arithmetic is done in float32
    (float64 angles) and the result has the dtype of `keys`. CUDA tensors take the Triton kernel
    when Triton imports; everything else takes the torch reference.
    """
    if use_triton(keys):
        return rope_shift_triton(keys, delta, inv_freq, layout=layout, out=out)
    return rope_shift_reference(keys, delta, inv_freq, layout=layout, out=out)


def _check(keys: torch.Tensor, inv_freq: torch.Tensor, layout: str, out: torch.Tensor | None) -> int:
    """Validate the arguments; returns the number of rotated channels."""
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"unknown rope layout {layout!r}; expected one of {ROPE_LAYOUTS}")
    if keys.dim() != 4:
        raise ValueError(f"keys must be [batch, kv_heads, seq, head_dim], got shape {tuple(keys.shape)}")
    half = inv_freq.shape[-1]
    if 2 * half > keys.shape[-1]:
        raise ValueError(f"inv_freq has {half} frequencies, more than head_dim {keys.shape[-1]} allows")
    if out is not None and out.shape != keys.shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, keys {tuple(keys.shape)}")
    return 2 * half


def rope_shift_reference(
    keys: torch.Tensor,
    delta: torch.Tensor | int,
    inv_freq: torch.Tensor,
    *,
    layout: str = "rotate_half",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`rope_shift` in plain torch: the oracle for the kernel and the path for CPU tensors."""
    rot = _check(keys, inv_freq, layout, out)
    batch, _, seq, head_dim = keys.shape
    half = rot // 2
    angles = _shift_angles(delta, inv_freq.to(keys.device), batch, seq)
    cos = angles.cos().to(torch.float32)  # [b, 1, seq, half]
    sin = angles.sin().to(torch.float32)
    separate = out is None or (out.dtype == torch.float32
                               and out.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr())
    if layout == "rotate_half" and keys.dtype == torch.float32 and separate:
        # Written straight into `out`, half by half, with no temporaries: on the CPU the shift is
        # bound by memory traffic, and composing a request moves every document's keys.
        if out is None:
            out = torch.empty_like(keys)
        x1, x2 = keys[..., :half], keys[..., half:rot]
        o1, o2 = out[..., :half], out[..., half:rot]
        torch.mul(x1, cos, out=o1)
        o1.addcmul_(x2, sin, value=-1)
        torch.mul(x2, cos, out=o2)
        o2.addcmul_(x1, sin)
        if rot < head_dim:
            out[..., rot:] = keys[..., rot:]
        return out
    x = keys[..., :rot].to(torch.float32)  # [batch, kv_heads, seq, rot]
    if layout == "rotate_half":
        x1, x2 = x[..., :half], x[..., half:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        # [batch, kv_heads, seq, half, 2] -> [batch, kv_heads, seq, rot]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    if out is None:
        out = keys.clone() if rot < head_dim else torch.empty_like(keys)
    elif rot < head_dim and out is not keys:
        out[..., rot:] = keys[..., rot:]
    out[..., :rot] = rotated.to(out.dtype)
    return out


def rope_shift_triton(
    keys: torch.Tensor,
    delta: torch.Tensor | int,
    inv_freq: torch.Tensor,
    *,
    layout: str = "rotate_half",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`rope_shift` through the Triton kernel (CUDA tensors, or CPU ones under TRITON_INTERPRET=1).

    The cos/sin table is built from float64 angles in torch, [1 or batch, 1 or seq, rotary_dim / 2],
    so large positions keep the reference's precision; the kernel reads each key once and writes it once.
    """
    from ._rope_triton import rotate_pairs

    rot = _check(keys, inv_freq, layout, out)
    batch, _, seq, head_dim = keys.shape
    if isinstance(delta, int) or (isinstance(delta, torch.Tensor) and delta.dim() == 0):
        angles = _shift_angles(delta, inv_freq.to(keys.device), 1, 1)  # one angle row for every position
    else:
        angles = _shift_angles(delta, inv_freq.to(keys.device), batch, seq)
    angles = angles[:, 0]  # [1 or batch, 1 or seq, half]
    cos = angles.cos().to(torch.float32).contiguous()
    sin = angles.sin().to(torch.float32).contiguous()
    if out is None:
        out = torch.empty_like(keys)
    if rot < head_dim and out is not keys:
        out[..., rot:] = keys[..., rot:]
    rotate_pairs(keys, out, cos, sin, interleaved=layout == "interleaved")
    return out


def _rotate_to(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate channels [.., seq, rot] by `positions` [b or 1, seq] the way a model's encoder does."""
    freqs = positions.to(torch.float32)[:, None, :, None] * inv_freq.to(torch.float32)  # [b, 1, seq, half]
    if layout == "rotate_half":
        emb = torch.cat((freqs, freqs), dim=-1)  # [b, 1, seq, rot]
        half = x.shape[-1] // 2
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * emb.cos() + rotated_half * emb.sin()
    emb = torch.repeat_interleave(freqs, 2, dim=-1)
    pairs = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * emb.cos() + pairs * emb.sin()


def rope_shift_naive(
    keys: torch.Tensor,
    positions: torch.Tensor,
    delta: torch.Tensor | int,
    inv_freq: torch.Tensor,
    *,
    layout: str = "rotate_half",
) -> torch.Tensor:
    """The route the shift replaces: un-rotate keys from `positions` [seq], then rotate to positions + delta.

    Float32 angles, as a model's own rotary embedding uses; for the benchmark, not for production.
    """
    rot = _check(keys, inv_freq, layout, None)
    positions = torch.as_tensor(positions, device=keys.device).reshape(1, -1)  # [1, seq]
    target = positions + torch.as_tensor(delta, device=keys.device)
    x = keys[..., :rot].float()
    plain = _rotate_to(x, -positions, inv_freq, layout)
    moved = _rotate_to(plain, target.reshape(-1, positions.shape[-1]), inv_freq, layout)
    return torch.cat((moved.to(keys.dtype), keys[..., rot:]), dim=-1)
