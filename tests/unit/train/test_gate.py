"""The promotion gate never promotes an adapter that changes nothing: identical greedy answers, or a
KL from the model it would replace under `train.promote_min_kl`; one that changes answers and holds
its rewards is promoted. `evaluate` on a tiny model records the answers and both KLs."""

from __future__ import annotations

import pytest
import torch

from feedback.train.dataset import TrainingExample
from feedback.train.gate import (
    GATE_SPOT,
    EvalResult,
    KeepEstimate,
    decide_promotion,
    eval_metrics,
    evaluate,
    keep_estimate,
    keep_estimates,
    keep_gain,
)
from feedback.train.policy import attach_lora

from .conftest import tiny_model, tiny_tokenizer

LIMITS = {"tolerance": 0.02, "max_kl": 0.1, "min_kl": 1e-4}
HELD_OUT = ("return a + b", "return total / len(data)", "yield from items")
REGRESSION = ("def f(x):\n    return x", "def g():\n    pass")


def evaluated(reward: float, outputs: tuple[str, ...], kl: float = 0.0, change_kl: float | None = None):
    return EvalResult(reward, kl, len(outputs), outputs, change_kl)


def test_identical_outputs_are_not_promoted_even_with_rewards_holding():
    decision = decide_promotion(
        evaluated(0.9, HELD_OUT, kl=0.00002), evaluated(0.9, HELD_OUT),
        evaluated(0.389, REGRESSION, kl=0.00001), evaluated(0.389, REGRESSION), **LIMITS,
    )
    assert not decision.promote
    assert decision.reasons == ("no change: outputs identical on 5/5 examples, KL 0.0000",)


def test_identical_outputs_are_not_promoted_over_an_adapter_in_use():
    # Far from the base model (mean_kl), but answering as the adapter it would replace does.
    decision = decide_promotion(
        evaluated(0.9, HELD_OUT, kl=0.05, change_kl=0.00003), evaluated(0.9, HELD_OUT, kl=0.05),
        evaluated(0.4, REGRESSION, kl=0.04, change_kl=0.00002), evaluated(0.4, REGRESSION, kl=0.04), **LIMITS,
    )
    assert not decision.promote
    assert decision.reasons[0] == "no change: outputs identical on 5/5 examples, KL 0.0000"


def test_a_kl_below_the_threshold_is_not_promoted():
    changed = ("return b + a", *HELD_OUT[1:])
    decision = decide_promotion(
        evaluated(0.95, changed, kl=0.00005), evaluated(0.9, HELD_OUT),
        evaluated(0.389, REGRESSION, kl=0.00004), evaluated(0.389, REGRESSION), **LIMITS,
    )
    assert not decision.promote
    assert decision.reasons == (
        "no change: KL 5e-05 from the model it would replace < 0.0001 (train.promote_min_kl)",
    )


def test_changed_outputs_with_rewards_holding_are_promoted():
    changed = ('"""Add."""\nreturn a + b', *HELD_OUT[1:])
    decision = decide_promotion(
        evaluated(0.92, changed, kl=0.013), evaluated(0.9, HELD_OUT),
        evaluated(0.387, REGRESSION, kl=0.011), evaluated(0.389, REGRESSION), **LIMITS,
    )
    assert decision.promote
    assert decision.reasons == (
        "held-out reward 0.920 (was 0.900), regression 0.387 (was 0.389), KL 0.0130, "
        "outputs changed on 1/5 examples",
    )


def test_changed_outputs_that_lose_reward_are_still_rejected_for_the_reward():
    changed = tuple(f"{text}  # changed" for text in HELD_OUT)
    decision = decide_promotion(
        evaluated(0.7, changed, kl=0.02), evaluated(0.9, HELD_OUT),
        evaluated(0.389, REGRESSION, kl=0.02), evaluated(0.389, REGRESSION), **LIMITS,
    )
    assert not decision.promote and decision.reasons == ("held-out reward 0.700 < 0.900 - 0.02",)


EXAMPLES = [
    TrainingExample(id=f"e{i}", created_at=i, instruction=f"t{3 + i} t4", original="") for i in range(3)
]


def test_evaluate_keeps_the_answers_and_a_fresh_adapter_is_rejected_as_no_change():
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)  # LoRA's B starts at zero: the base model's answers
    tokenizer, reward = tiny_tokenizer(), (lambda text, example: 0.5)
    candidate = evaluate(model, tokenizer, EXAMPLES, reward, 4)
    base = evaluate(model, tokenizer, EXAMPLES, reward, 4, adapter=False)
    assert len(candidate.outputs) == 3 and candidate.outputs == base.outputs
    assert candidate.mean_kl == 0.0 and candidate.change_kl is None
    decision = decide_promotion(candidate, base, candidate, base, **LIMITS)
    assert not decision.promote and decision.reasons == (
        "no change: outputs identical on 6/6 examples, KL 0.0000",
    )
    assert "outputs" not in eval_metrics(candidate) and eval_metrics(candidate)["n"] == 3


def perturbed_lora_model(std: float):
    """The tiny model with a LoRA adapter whose B weights are drawn with `std` (0 would be the base)."""
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, std)
    return model


def test_evaluate_measures_the_kl_from_the_adapter_it_would_replace():
    model = perturbed_lora_model(0.5)
    from peft import LoraConfig

    # A second adapter with B at zero stands for an adapter in use that equals the base model.
    model.add_adapter("in_use", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.set_adapter("default")
    reward = lambda text, example: 0.5  # noqa: E731
    candidate = evaluate(model, tiny_tokenizer(), EXAMPLES, reward, 4, replaces="in_use")
    assert model.active_adapter == "default"
    assert candidate.mean_kl > 1e-3
    assert abs(candidate.change_kl - candidate.mean_kl) < 1e-5


# What the user would keep: the gate's measure when a preference was learned.

def episode(i: int, *, output: str, kept: str | None = None, reverted: bool = False) -> TrainingExample:
    """A held-out completion episode as the store gives it: the answer served without the cursor's
    indentation (`output`), the text the user ended with, with it (`kept_text`)."""
    return TrainingExample(id=f"h{i}", created_at=i, instruction="", original="", output=output,
                           kept_text=None if kept is None else "    " + kept, reverted=reverted,
                           reverted_text="    " + output if reverted else None, prompt_text="def f():\n",
                           prompt_lead="    ")


def short(text: str) -> float:
    """A preference standing in for a learned one: P(kept) falls with the number of lines."""
    return 1.0 / len(text.strip().splitlines())


KEPT = episode(0, output="return a + b", kept="return a + b")
MODIFIED = episode(1, output="x = 1\n    return x", kept="x = 1")
REVERTED = episode(2, output="return None\n    pass", reverted=True)
SPOT = TrainingExample(id="spot-1", created_at=0, instruction="", original="", kept_text="    return a + b",
                       verification={"source": GATE_SPOT})


def test_an_answer_the_user_ended_with_is_kept_and_one_they_undid_is_not():
    # The cursor's indentation and trailing blanks do not make an answer a different one.
    assert keep_estimate("    return a + b\n", KEPT, short) == (1.0, "kept")
    assert keep_estimate("x = 1", MODIFIED, short) == (1.0, "kept")  # what stood after their rewrite
    assert keep_estimate("    x = 1\n    return x", MODIFIED, short) == (0.0, "undone")  # what they rewrote
    assert keep_estimate("return None\n    pass", REVERTED, short) == (0.0, "undone")
    assert keep_estimate("  \n", KEPT, short) == (0.0, "silent")  # nothing shown keeps nothing


def test_an_answer_nobody_judged_is_scored_by_the_preference_or_not_at_all():
    assert keep_estimate("return a - b\n    # two", KEPT, short) == (0.5, "estimated")
    assert keep_estimate("raise ValueError", REVERTED, short) == (1.0, "estimated")
    assert keep_estimate("raise ValueError", REVERTED, None) == (None, "unknown")
    # A gate spot has no outcome: the code that stands there is not what a user kept.
    assert keep_estimate("return a + b\n    # and more", SPOT, short) == (0.5, "estimated")
    assert keep_estimate("return a + b", SPOT, short) == (1.0, "estimated")


def test_the_gain_is_paired_over_the_answers_both_models_could_be_judged_at():
    examples = [KEPT, MODIFIED, REVERTED]
    candidate = keep_estimates(["return a + b", "x = 1", "raise ValueError"], examples, None)
    served = ["return a + b", "x = 1\n    return x", "return None\n    pass"]
    baseline = keep_estimates(served, examples, None)
    assert candidate.scores == (1.0, 1.0, None) and candidate.counts() == {"kept": 2, "unknown": 1}
    assert baseline.scores == (1.0, 0.0, 0.0)
    gain, se, compared = keep_gain(candidate, baseline)
    assert (gain, compared) == (0.5, 2) and se == pytest.approx(0.5)


def keep_of(scores: list[float]) -> KeepEstimate:
    return KeepEstimate(tuple(scores), ("estimated",) * len(scores))


CHANGED = ("return b + a", *HELD_OUT[1:])


def test_a_gain_within_its_noise_is_not_promoted_whatever_the_held_out_reward():
    # The held-out reward rose by 0.003 (a round promoted so cost 12.5 points of what users kept);
    # what they would keep rose by one answer and fell by another: no gain at all.
    baseline = keep_of([1, 0, 0.4, 0.6, 0.3, 0.2, 0.8, 0.5, 0.1])
    candidate = keep_of([0, 1, 0.4, 0.6, 0.3, 0.2, 0.8, 0.5, 0.12])
    decision = decide_promotion(
        evaluated(0.427, CHANGED, kl=0.013), evaluated(0.424, HELD_OUT),
        evaluated(0.431, REGRESSION, kl=0.011), evaluated(0.396, REGRESSION), **LIMITS,
        keep=(candidate, baseline), keep_margin=1.0,
    )
    assert not decision.promote
    assert decision.reasons == ("kept (estimated) 0.436 against 0.433: a gain of +0.002 is not above 1 "
                                "standard errors (0.167) over 9 answers",)


def test_a_held_out_reward_that_rose_while_keeping_fell_is_not_promoted():
    baseline = keep_of([1, 1, 0.5, 0.5])
    candidate = keep_of([0, 1, 0.4, 0.3])
    decision = decide_promotion(
        evaluated(0.488, CHANGED, kl=0.013), evaluated(0.352, HELD_OUT),
        evaluated(0.396, REGRESSION, kl=0.011), evaluated(0.390, REGRESSION), **LIMITS,
        keep=(candidate, baseline),
    )
    assert not decision.promote and decision.reasons[0].startswith("kept (estimated) 0.425 against 0.750")


def test_a_clear_gain_in_what_users_keep_is_promoted_though_the_held_out_reward_fell():
    baseline = keep_of([0, 0, 0.2, 0.5, 0.3, 1])
    candidate = keep_of([1, 1, 0.4, 0.6, 0.3, 1])
    decision = decide_promotion(
        evaluated(0.391, CHANGED, kl=0.013), evaluated(0.409, HELD_OUT),
        evaluated(0.389, REGRESSION, kl=0.011), evaluated(0.390, REGRESSION), **LIMITS,
        keep=(candidate, baseline),
    )
    assert decision.promote
    assert decision.reasons[0].startswith(
        "kept (estimated) 0.717 (was 0.333, +0.383 +- 0.197 over 6 answers)")
    # The same gain with a margin of 3 standard errors is not enough; the regression set still binds.
    held = (evaluated(0.391, CHANGED, kl=0.013), evaluated(0.409, HELD_OUT))
    assert not decide_promotion(*held, evaluated(0.389, REGRESSION, kl=0.011), evaluated(0.390, REGRESSION),
                                **LIMITS, keep=(candidate, baseline), keep_margin=3.0).promote
    lost = decide_promotion(*held, evaluated(0.30, REGRESSION, kl=0.011), evaluated(0.390, REGRESSION),
                            **LIMITS, keep=(candidate, baseline))
    assert lost.reasons == ("regression reward 0.300 < 0.390 - 0.02",)


# The product's KL cap (`train.promote_max_kl`): a bound on a broken adapter, not on a changed one.

def test_the_products_kl_cap_refuses_a_broken_adapter_and_not_one_that_moved_where_answers_end():
    from context.config import TrainConfig

    limits = {"tolerance": TrainConfig().promote_tolerance, "max_kl": TrainConfig().promote_max_kl,
              "min_kl": TrainConfig().promote_min_kl}
    # A measured round (the oneline user, seed 0, the user's text in its group at 4e-4): KL 0.441
    # held out and 0.220 on the regression set, the keep estimate +0.075 (se 0.063), the regression
    # reward 0.496 against 0.389. The old cap of 0.1 refused it for the KL alone.
    baseline = keep_of([0, 0, 0.2, 0.5, 0.3, 1])
    candidate = keep_of([1, 0, 0.3, 0.5, 0.3, 1])
    measured = (evaluated(0.40, CHANGED, kl=0.441), evaluated(0.35, HELD_OUT),
                evaluated(0.496, REGRESSION, kl=0.220), evaluated(0.389, REGRESSION))
    assert decide_promotion(*measured, **limits, keep=(candidate, baseline)).promote
    assert decide_promotion(*measured, **{**limits, "max_kl": 0.1}, keep=(candidate, baseline)).reasons == (
        "KL 0.4410 > 0.1",)
    # An adapter whose LoRA weights blew up answers what the base model would not: far over the cap.
    model = perturbed_lora_model(20.0)
    reward = lambda text, example: 0.5  # noqa: E731
    broken = evaluate(model, tiny_tokenizer(), EXAMPLES, reward, 4)
    base = evaluate(model, tiny_tokenizer(), EXAMPLES, reward, 4, adapter=False)
    assert broken.outputs != base.outputs and broken.mean_kl > limits["max_kl"]
    decision = decide_promotion(broken, base, broken, base, **limits)
    assert not decision.promote and decision.reasons[-1] == f"KL {broken.mean_kl:.4f} > 1.0"
