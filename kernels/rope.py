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

This module holds the plain-torch reference; it is the test oracle and the CPU path.
"""

from __future__ import annotations

import torch

__all__ = ["ROPE_LAYOUTS", "rope_shift"]

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
    (float64 angles) and the result has the dtype of `keys`.
    """
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"unknown rope layout {layout!r}; expected one of {ROPE_LAYOUTS}")
    if keys.dim() != 4:
        raise ValueError(f"keys must be [batch, kv_heads, seq, head_dim], got shape {tuple(keys.shape)}")
    batch, _, seq, head_dim = keys.shape
    half = inv_freq.shape[-1]
    rot = 2 * half
    if rot > head_dim:
        raise ValueError(f"inv_freq has {half} frequencies, more than head_dim {head_dim} allows")
    angles = _shift_angles(delta, inv_freq.to(keys.device), batch, seq)
    cos = angles.cos().to(torch.float32)  # [b, 1, seq, half]
    sin = angles.sin().to(torch.float32)
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
    elif out.shape != keys.shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, keys {tuple(keys.shape)}")
    elif rot < head_dim and out is not keys:
        out[..., rot:] = keys[..., rot:]
    out[..., :rot] = rotated.to(out.dtype)
    return out
