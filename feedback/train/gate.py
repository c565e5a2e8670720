"""The promotion gate: evaluate an adapter on held-out episodes and a fixed regression set, and
promote it only if the reward holds (within a tolerance of the adapter it would replace) and its KL
from the base model stays under a limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .dataset import TrainingExample
from .policy import SampledGroup, example_prompt_ids, group_logprobs, reference_logprobs, sample_example
from .trainer import RewardFn

__all__ = ["EvalResult", "GateDecision", "decide_promotion", "evaluate"]


@dataclass(frozen=True)
class EvalResult:
    """Mean greedy-decoding reward and mean per-token k3 KL from the base model, over n examples."""

    mean_reward: float
    mean_kl: float
    n: int


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reasons: tuple[str, ...]


@torch.no_grad()
def evaluate(
    model, tokenizer, examples: Sequence[TrainingExample], reward_fn: RewardFn, max_new_tokens: int,
    *, adapter: bool = True,
) -> EvalResult:
    """Greedy answers for `examples`, scored; `adapter=False` evaluates the base model (KL 0)."""
    if not examples:
        return EvalResult(0.0, 0.0, 0)
    rewards, kls = [], []
    for example in examples:
        prompt = example_prompt_ids(tokenizer, example)
        if adapter:
            group = sample_example(model, tokenizer, example, prompt, 1, max_new_tokens, temperature=0.0)
            kls.append(_k3_kl(model, group))
        else:
            with model.disable_adapter():
                group = sample_example(model, tokenizer, example, prompt, 1, max_new_tokens, temperature=0.0)
            kls.append(0.0)
        rewards.append(reward_fn(group.texts[0], example))
    return EvalResult(sum(rewards) / len(rewards), sum(kls) / len(kls), len(examples))


def _k3_kl(model, group: SampledGroup) -> float:
    logps = group_logprobs(model, group, 1.0)
    ref = reference_logprobs(model, group, 1.0)
    delta = ref - logps
    kl = (torch.exp(delta) - delta - 1) * group.mask
    return float(kl.sum() / group.mask.sum().clamp(min=1))


def decide_promotion(
    candidate: EvalResult, baseline: EvalResult, candidate_regression: EvalResult,
    baseline_regression: EvalResult, *, tolerance: float, max_kl: float,
) -> GateDecision:
    """Promote only when both rewards hold within `tolerance` and the KL is at most `max_kl`."""
    reasons = []
    if candidate.mean_reward < baseline.mean_reward - tolerance:
        reasons.append(
            f"held-out reward {candidate.mean_reward:.3f} < {baseline.mean_reward:.3f} - {tolerance}"
        )
    if candidate_regression.mean_reward < baseline_regression.mean_reward - tolerance:
        reasons.append(
            f"regression reward {candidate_regression.mean_reward:.3f} < "
            f"{baseline_regression.mean_reward:.3f} - {tolerance}"
        )
    kl = max(candidate.mean_kl, candidate_regression.mean_kl)
    if kl > max_kl:
        reasons.append(f"KL {kl:.4f} > {max_kl}")
    if not reasons:
        reasons.append(
            f"held-out reward {candidate.mean_reward:.3f} (was {baseline.mean_reward:.3f}), "
            f"regression {candidate_regression.mean_reward:.3f} (was {baseline_regression.mean_reward:.3f}), "
            f"KL {kl:.4f}"
        )
        return GateDecision(True, tuple(reasons))
    return GateDecision(False, tuple(reasons))
