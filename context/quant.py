"""Weight-only int8 and int4 quantization for the decode engine, and the quality check that gates it.

int8: each weight matrix as int8 with one scale per output channel (symmetric, max-abs / 127), in
torch's int8-weight kernel (`_weight_int8pack_mm`, bfloat16 activations). int4: 4-bit codes with a
scale and offset per group of 32 inputs (`_weight_int4pack_mm_for_cpu`); the embedded model ships
as GGUF Q4_1, which is exactly that layout, so its projections are recovered without loss (only
the bfloat16 activations and scales round). Fewer bytes per token is what speeds decode up on a
memory-bound CPU.

`logit_agreement` compares a quantized (or bfloat16) engine with the float32 one on real code:
top-1 agreement and the mean KL divergence of the next-token distributions, the figures that decide
whether a weight format may become a default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode import DecodeEngine, Linear

__all__ = ["QualityReport", "int4_linear", "int8_linear", "logit_agreement", "quantize_int4", "quantize_int8"]


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: (int8 [out, in], scales [out]) with weight ~ q * scale."""
    weight = weight.detach().float().contiguous()  # the runtime may keep weights transposed in memory
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    quantized = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized, scales


def int8_linear(weight: torch.Tensor) -> Linear:
    """A projection x @ weight.T computed from an int8 copy of `weight` (the original is not kept)."""
    quantized, scales = quantize_int8(weight)
    scales = scales.to(torch.bfloat16)
    out_features, in_features = quantized.shape

    def apply(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, in_features).to(torch.bfloat16)  # [rows, in]
        out = torch._weight_int8pack_mm(flat, quantized, scales)  # [rows, out]
        return out.view(*x.shape[:-1], out_features).to(x.dtype)

    return apply


INT4_GROUP = 32


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per group of `group` inputs: (codes int32 [out, in], [in/group, out, 2]).

    The group's minimum and range/15 are its offset and step (the GGUF Q4_1 layout), so a weight
    dequantized from Q4_1, as the embedded model's are, is recovered exactly. The second tensor
    holds (scale, zero) in the kernel's convention: weight = (code - 8) * scale + zero.
    """
    weight = weight.detach().float().contiguous()
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // group, group)  # [out, in/group, group]
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    codes = codes.to(torch.int32).view(out_features, in_features)
    scales_and_zeros = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
    return codes, scales_and_zeros


def int4_linear(weight: torch.Tensor) -> Linear:
    """A projection from 4-bit group-wise codes of `weight` (int8 where the shape does not fit)."""
    out_features, in_features = weight.shape
    if in_features % INT4_GROUP or out_features % 16 or weight.device.type != "cpu":
        return int8_linear(weight)
    codes, scales_and_zeros = quantize_int4(weight)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 2)
    scales_and_zeros = scales_and_zeros.to(torch.bfloat16)

    def apply(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, in_features).to(torch.bfloat16)  # [rows, in]
        out = torch._weight_int4pack_mm_for_cpu(flat, packed, INT4_GROUP, scales_and_zeros)
        return out.view(*x.shape[:-1], out_features).to(x.dtype)

    return apply


@dataclass(frozen=True)
class QualityReport:
    """How close a weight format's next-token distributions are to float32's on the same text."""

    positions: int
    top1_agreement: float  # share of positions whose argmax token is the same
    mean_kl: float  # mean KL(float32 || candidate), nats
    max_kl: float


def logit_agreement(reference: DecodeEngine, candidate: DecodeEngine, ids: list[int], chunk: int = 256):
    """Score `candidate` against `reference` on the next-token distributions over `ids`."""
    with torch.inference_mode():
        ref_logits = _all_logits(reference, ids, chunk)
        cand_logits = _all_logits(candidate, ids, chunk)
    ref_logp = torch.log_softmax(ref_logits, dim=-1)  # [positions, vocab]
    cand_logp = torch.log_softmax(cand_logits, dim=-1)
    kl = (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1)  # [positions]
    agree = (ref_logits.argmax(-1) == cand_logits.argmax(-1)).float().mean()
    return QualityReport(len(ids), float(agree), float(kl.mean()), float(kl.max()))


def _all_logits(engine: DecodeEngine, ids: list[int], chunk: int) -> torch.Tensor:
    cache = engine.new_cache()
    parts = []
    for start in range(0, len(ids), chunk):
        step = torch.tensor([ids[start : start + chunk]], device=engine.device)
        parts.append(engine.forward(step, cache, all_logits=True)[0].float().cpu())
    return torch.cat(parts)
