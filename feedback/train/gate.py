"""The promotion gate: evaluate an adapter on held-out episodes and a fixed regression set, and
promote it only if it changes something (its greedy answers, and its KL from what it would replace),
the user would keep more of what it shows than of what the adapter it would replace shows (by a
margin above the noise of that estimate), the regression reward holds (within a tolerance) and its
KL from the base model stays under a limit.

What the user would keep is estimated per example (`keep_estimate`), from what the user did where
that is known and from their learned preference where it is not: an answer equal to the text the
user ended with at a held-out episode would have been kept; one equal to the answer they undid
(reverted, or rewrote) would not; anything else, and every answer at a gate spot (a position in a
file no episode is about, prompted as the server prompts it there), is scored by the learned
P(kept). Nothing shown keeps nothing. The held-out reward (the training reward over the held-out
episodes) did not predict what users keep (bench/gate_vs_keep.py: r = -0.10 over 39 promoted
rounds), so it is reported, and it decides only when no preference could be learned.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from .dataset import TrainingExample
from .policy import SampledGroup, example_prompt_ids, group_logprobs, reference_logprobs, sample_example
from .trainer import RewardFn

__all__ = ["EvalResult", "GateDecision", "KeepEstimate", "decide_promotion", "eval_metrics", "evaluate",
           "keep_estimate", "keep_estimates", "keep_gain"]

GATE_SPOT = "gate_spot"  # `TrainingExample.verification["source"]` of a gate spot


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
    *, adapter: bool = True, replaces: str | None = None, kl: bool = True,
) -> EvalResult:
    """Greedy answers for `examples`, scored; `adapter=False` evaluates the base model (KL 0), and
    so does `kl=False` (the answers alone, no KL measured).

    `replaces`: the name of another adapter loaded beside the active one (the one in use), whose
    KL from the active adapter's answers becomes `change_kl`."""
    if not examples:
        return EvalResult(0.0, 0.0, 0)
    rewards, kls, changes, outputs = [], [], [], []
    for example in examples:
        prompt = example_prompt_ids(tokenizer, example)
        if adapter:
            group = sample_example(model, tokenizer, example, prompt, 1, max_new_tokens, temperature=0.0)
            kls.append(_k3_kl(model, group) if kl else 0.0)
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


def _norm(text: str) -> str:
    """A text as the user sees it: trailing blanks and blank lines at either end dropped, and the
    first line's indentation (the cursor's, which an answer may or may not repeat)."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return ""
    lines[0] = lines[0].lstrip()
    return "\n".join(lines)


def keep_estimate(answer: str, example: TrainingExample,
                  preference: Callable[[str], float] | None) -> tuple[float | None, str]:
    """(how likely the user keeps `answer` as shown at `example`, how that was decided): "silent"
    (nothing shown: 0), "kept" (the text the user ended with there: 1), "undone" (the answer they
    reverted or rewrote there: 0), "estimated" (the learned preference's P(kept)), or "unknown"
    (None: no preference). A gate spot has no outcome: the preference alone decides."""
    shown = _norm(answer)
    if not shown:
        return 0.0, "silent"
    if example.verification.get("source") != GATE_SPOT:
        if example.kept_text is not None and shown == _norm(example.kept_text):
            return 1.0, "kept"
        undone = example.reverted_text if example.reverted else (
            example.output if example.output is not None and example.kept_text is not None
            and _norm(example.output) != _norm(example.kept_text) else None)
        if undone is not None and shown == _norm(undone):
            return 0.0, "undone"
    if preference is None:
        return None, "unknown"
    return preference(textwrap.dedent(answer)), "estimated"


@dataclass(frozen=True)
class KeepEstimate:
    """`keep_estimate` over a model's greedy answers, one per example in order."""

    scores: tuple[float | None, ...]
    kinds: tuple[str, ...]

    @property
    def mean(self) -> float:
        known = [s for s in self.scores if s is not None]
        return sum(known) / len(known) if known else 0.0

    def counts(self) -> dict[str, int]:
        return {kind: self.kinds.count(kind) for kind in sorted(set(self.kinds))}


def keep_estimates(outputs: Sequence[str], examples: Sequence[TrainingExample],
                   preference: Callable[[str], float] | None) -> KeepEstimate:
    pairs = [keep_estimate(answer, ex, preference) for answer, ex in zip(outputs, examples, strict=True)]
    return KeepEstimate(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def keep_gain(candidate: KeepEstimate, baseline: KeepEstimate) -> tuple[float, float, int]:
    """(mean gain, its standard error, examples compared): paired over the examples both answers
    could be judged at."""
    diffs = [c - b for c, b in zip(candidate.scores, baseline.scores, strict=True)
             if c is not None and b is not None]
    if not diffs:
        return 0.0, 0.0, 0
    mean = sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, math.inf, 1
    variance = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    return mean, math.sqrt(variance / len(diffs)), len(diffs)


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
    keep: tuple[KeepEstimate, KeepEstimate] | None = None, keep_margin: float = 1.0,
) -> GateDecision:
    """Promote only when the candidate changes something (some greedy answer differs from the
    baseline's, and its KL from what it would replace is at least `min_kl`), the regression reward
    holds within `tolerance`, the KL from the base model is at most `max_kl`, and the user would
    keep more: with `keep` ((candidate, baseline) estimates), a mean gain above 0 and at least
    `keep_margin` standard errors of it; without (no preference learned), the held-out reward
    holding within `tolerance`."""
    reasons = []
    same, compared, change_kl = _change(candidate, baseline, candidate_regression, baseline_regression)
    if same is not None and compared and same == compared:
        reasons.append(f"no change: outputs identical on {same}/{compared} examples, KL {change_kl:.4f}")
    elif change_kl < min_kl:
        reasons.append(f"no change: KL {change_kl:.2g} from the model it would replace < {min_kl:g} "
                       "(train.promote_min_kl)")
    gain = se = compared_keep = None
    if keep is not None:
        gain, se, compared_keep = keep_gain(*keep)
        if compared_keep == 0:
            reasons.append("no answer the user's keeping could be judged at")
        elif gain <= 0 or gain < keep_margin * se:
            reasons.append(f"kept (estimated) {keep[0].mean:.3f} against {keep[1].mean:.3f}: a gain of "
                           f"{gain:+.3f} is not above {keep_margin:g} standard errors ({se:.3f}) over "
                           f"{compared_keep} answers")
    elif candidate.mean_reward < baseline.mean_reward - tolerance:
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
    kept = "" if keep is None else (f"kept (estimated) {keep[0].mean:.3f} (was {keep[1].mean:.3f}, "
                                    f"{gain:+.3f} +- {se:.3f} over {compared_keep} answers), ")
    return GateDecision(True, (
        f"{kept}held-out reward {candidate.mean_reward:.3f} (was {baseline.mean_reward:.3f}), "
        f"regression {candidate_regression.mean_reward:.3f} (was {baseline_regression.mean_reward:.3f}), "
        f"KL {kl:.4f}{changed}",
    ))
