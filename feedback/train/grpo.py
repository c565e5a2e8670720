"""The GRPO objective: group advantages and the clipped, KL-regularised policy loss.

Pure tensor code, no model: the trainer computes per-token log-probs (policy, old policy, reference)
and hands them here. The formulas follow DeepSeekMath's GRPO with the variants in use since:

- advantages: reward minus the group mean, divided by the standard deviation (N-1, plus 1e-4)
  of the group, of the whole batch, or by nothing (Dr. GRPO);
- ratio r = exp(logp - logp_old), clipped to [1 - eps_low, 1 + eps_high] (DAPO's asymmetric clip);
- KL against the reference with the k3 estimator exp(ref - logp) - (ref - logp) - 1, optionally
  weighted by the ratio (the samples come from the old policy, so the unweighted estimate is biased
  once the policy moves; TRL's `use_bias_correction_kl`, on by default there and here);
- aggregation: `grpo` (mean per sequence, then over sequences), `bnpo` (mean over the micro-batch's
  tokens), `dr_grpo` (sum over tokens / (sequences x max completion length)), `dapo` (sum over tokens /
  the tokens of the whole accumulated batch, across processes).

Every loss is already divided by the gradient-accumulation count where that applies, so summing
`backward()` over the micro-batches of one optimizer step gives the full-batch gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LOSS_TYPES", "SCALE_MODES", "GrpoLossConfig", "LossStats", "group_advantages", "grpo_loss"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALE_MODES = ("group", "batch", "none")
STD_EPS = 1e-4


@dataclass(frozen=True)
class GrpoLossConfig:
    """The knobs of the objective (defaults as in TRL's GRPOConfig, with DAPO's eps_high)."""

    beta: float = 0.04
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    loss_type: str = "dapo"
    max_completion_length: int = 64
    kl_bias_correction: bool = True

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {self.loss_type!r}")


@dataclass(frozen=True)
class LossStats:
    """What one loss evaluation measured, for the logs and curves (plain floats)."""

    policy_loss: float
    kl: float  # mean k3 KL per completion token
    clip_fraction: float  # share of completion tokens whose ratio was clipped


def group_advantages(rewards: torch.Tensor, scale: str = "group") -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages for `rewards` [groups, G] and which groups carry any signal.

    Returns (advantages [groups, G], informative [groups] bool). A group whose rewards are all equal
    has zero advantage everywhere, so it would only cost a backward pass: the trainer skips it.
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {', '.join(SCALE_MODES)}, got {scale!r}")
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G] with G >= 2, got {tuple(rewards.shape)}")
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [groups, G]
    group_std = rewards.std(dim=1, keepdim=True)  # unbiased (N-1), [groups, 1]
    informative = ~torch.isclose(group_std.squeeze(1), torch.zeros_like(group_std.squeeze(1)))
    if scale == "group":
        return centred / (group_std + STD_EPS), informative
    if scale == "batch":
        batch_std = rewards.std() if rewards.numel() > 1 else torch.zeros(())
        return centred / (batch_std + STD_EPS), informative
    return centred, informative


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GrpoLossConfig,
    *,
    grad_accum: int = 1,
    num_items_in_batch: float | None = None,
    world_size: int = 1,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of one micro-batch: per-token log-probs [b, T], advantages [b], mask [b, T].

    `old_logps` None means the sampling policy is the current one (one update per generation): the
    ratio is then exp(logp - logp.detach()) = 1 with the policy gradient intact. `ref_logps` may be
    None when beta is 0. `num_items_in_batch` (dapo only) is the number of completion tokens in the
    whole accumulated batch summed over all `world_size` processes.
    """
    mask = mask.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old_logps)  # [b, T]
    clipped = torch.clamp(ratio, 1 - config.epsilon_low, 1 + config.epsilon_high)
    adv = advantages.reshape(-1, 1).to(logps.device, logps.dtype)  # [b, 1]; rewards are scored on the CPU
    per_token = -torch.min(ratio * adv, clipped * adv)  # [b, T]
    kl = None
    if config.beta != 0.0:
        if ref_logps is None:
            raise ValueError("ref_logps are needed when beta != 0")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1  # k3, [b, T]
        if config.kl_bias_correction:
            kl = kl * ratio
        per_token = per_token + config.beta * kl
    loss = _aggregate(per_token, mask, config, grad_accum, num_items_in_batch, world_size)
    tokens = mask.sum().clamp(min=1.0)
    low = (ratio < 1 - config.epsilon_low) & (adv < 0)
    high = (ratio > 1 + config.epsilon_high) & (adv > 0)
    was_clipped = low | high
    stats = LossStats(
        policy_loss=float(loss.detach()) * (grad_accum if config.loss_type != "dapo" else 1),
        kl=float((kl.detach() * mask).sum() / tokens) if kl is not None else 0.0,
        clip_fraction=float((was_clipped.to(mask.dtype) * mask).sum() / tokens),
    )
    return loss, stats


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    config: GrpoLossConfig,
    grad_accum: int,
    num_items_in_batch: float | None,
    world_size: int,
) -> torch.Tensor:
    masked = per_token * mask
    if config.loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / grad_accum
    if config.loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0) / grad_accum
    if config.loss_type == "dr_grpo":
        return masked.sum() / (per_token.size(0) * config.max_completion_length) / grad_accum
    # dapo: every token of the accumulated, data-parallel batch weighs the same. Each process's
    # gradient is averaged over `world_size` afterwards, hence the multiplication.
    items = float(num_items_in_batch) if num_items_in_batch is not None else float(mask.sum()) * grad_accum
    return masked.sum() / max(items, 1.0) * world_size
