"""The promotion gate: evaluate an adapter on held-out episodes and a fixed regression set, and
promote it only if it changes something (its greedy answers, and its KL from what it would replace),
the reward holds (within a tolerance of the adapter it would replace) and its KL from the base model
stays under a limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from .dataset import TrainingExample
from .policy import SampledGroup, example_prompt_ids, group_logprobs, reference_logprobs, sample_example
from .trainer import RewardFn

__all__ = ["EvalResult", "GateDecision", "decide_promotion", "eval_metrics", "evaluate"]


@dataclass(frozen=True)
class EvalResult:
    """Mean greedy-decoding reward and mean per-token k3 KL from the base model, over n examples.

    `outputs` are the greedy answers, one per example in order; `change_kl` is the mean KL from the
    adapter this one would replace (None: that is the base model, and `mean_kl` is that KL)."""

    mean_reward: float
    mean_kl: float
    n: int
    outputs: tuple[str, ...] = field(default=(), repr=False)
    change_kl: float | None = None


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reasons: tuple[str, ...]


def eval_metrics(result: EvalResult) -> dict:
    """`result` for the status file and the adapter's metadata: the numbers, not the answers."""
    metrics = asdict(result)
    del metrics["outputs"]
    return metrics


@torch.no_grad()
def evaluate(
    model, tokenizer, examples: Sequence[TrainingExample], reward_fn: RewardFn, max_new_tokens: int,
    *, adapter: bool = True, replaces: str | None = None,
) -> EvalResult:
    """Greedy answers for `examples`, scored; `adapter=False` evaluates the base model (KL 0).

    `replaces`: the name of another adapter loaded beside the active one (the one in use), whose
    KL from the active adapter's answers becomes `change_kl`."""
    if not examples:
        return EvalResult(0.0, 0.0, 0)
    rewards, kls, changes, outputs = [], [], [], []
    for example in examples:
        prompt = example_prompt_ids(tokenizer, example)
        if adapter:
            group = sample_example(model, tokenizer, example, prompt, 1, max_new_tokens, temperature=0.0)
            kls.append(_k3_kl(model, group))
            if replaces is not None:
                changes.append(_k3_kl_from_adapter(model, group, replaces))
        else:
            with model.disable_adapter():
                group = sample_example(model, tokenizer, example, prompt, 1, max_new_tokens, temperature=0.0)
            kls.append(0.0)
        outputs.append(group.texts[0])
        rewards.append(reward_fn(group.texts[0], example))
    change_kl = sum(changes) / len(changes) if changes else None
    return EvalResult(sum(rewards) / len(rewards), sum(kls) / len(kls), len(examples), tuple(outputs),
                      change_kl)


def _k3(logps: torch.Tensor, ref: torch.Tensor, group: SampledGroup) -> float:
    delta = ref - logps
    kl = (torch.exp(delta) - delta - 1) * group.mask
    return float(kl.sum() / group.mask.sum().clamp(min=1))


def _k3_kl(model, group: SampledGroup) -> float:
    return _k3(group_logprobs(model, group, 1.0), reference_logprobs(model, group, 1.0), group)


def _k3_kl_from_adapter(model, group: SampledGroup, other: str) -> float:
    """The k3 KL of the active adapter's answers from adapter `other` (loaded beside it)."""
    active = model.active_adapter
    logps = group_logprobs(model, group, 1.0)
    model.set_adapter(other)
    try:
        ref = group_logprobs(model, group, 1.0)
    finally:
        model.set_adapter(active)
    return _k3(logps, ref, group)


def _unchanged(candidate: EvalResult, baseline: EvalResult) -> int | None:
    """How many of the candidate's greedy answers equal the baseline's (None: not comparable)."""
    if not candidate.outputs or len(candidate.outputs) != len(baseline.outputs):
        return None
    return sum(a == b for a, b in zip(candidate.outputs, baseline.outputs, strict=True))


def _change(
    candidate: EvalResult, baseline: EvalResult, candidate_regression: EvalResult,
    baseline_regression: EvalResult,
) -> tuple[int | None, int, float]:
    """(answers unchanged or None, answers compared, KL from what the candidate would replace)."""
    pairs = [(candidate, baseline), (candidate_regression, baseline_regression)]
    counts = [(_unchanged(c, b), c.n) for c, b in pairs if c.n]
    same = None if not counts or any(s is None for s, _ in counts) else sum(s for s, _ in counts)
    kls = [c.mean_kl if c.change_kl is None else c.change_kl for c, _ in pairs if c.n]
    return same, sum(n for _, n in counts), max(kls, default=0.0)


def decide_promotion(
    candidate: EvalResult, baseline: EvalResult, candidate_regression: EvalResult,
    baseline_regression: EvalResult, *, tolerance: float, max_kl: float, min_kl: float = 0.0,
) -> GateDecision:
    """Promote only when the candidate changes something (some greedy answer differs from the
    baseline's, and its KL from what it would replace is at least `min_kl`), both rewards hold
    within `tolerance`, and the KL from the base model is at most `max_kl`."""
    reasons = []
    same, compared, change_kl = _change(candidate, baseline, candidate_regression, baseline_regression)
    if same is not None and compared and same == compared:
        reasons.append(f"no change: outputs identical on {same}/{compared} examples, KL {change_kl:.4f}")
    elif change_kl < min_kl:
        reasons.append(f"no change: KL {change_kl:.2g} from the model it would replace < {min_kl:g} "
                       "(train.promote_min_kl)")
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
    if reasons:
        return GateDecision(False, tuple(reasons))
    changed = "" if same is None else f", outputs changed on {compared - same}/{compared} examples"
    return GateDecision(True, (
        f"held-out reward {candidate.mean_reward:.3f} (was {baseline.mean_reward:.3f}), "
        f"regression {candidate_regression.mean_reward:.3f} (was {baseline_regression.mean_reward:.3f}), "
        f"KL {kl:.4f}{changed}",
    ))
