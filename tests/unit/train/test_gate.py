"""The promotion gate never promotes an adapter that changes nothing: identical greedy answers, or a
KL from the model it would replace under `train.promote_min_kl`; one that changes answers and holds
its rewards is promoted. `evaluate` on a tiny model records the answers and both KLs."""

from __future__ import annotations

import torch

from feedback.train.dataset import TrainingExample
from feedback.train.gate import EvalResult, decide_promotion, eval_metrics, evaluate
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


def test_evaluate_measures_the_kl_from_the_adapter_it_would_replace():
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    from peft import LoraConfig

    # A second adapter with B at zero stands for an adapter in use that equals the base model.
    model.add_adapter("in_use", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.set_adapter("default")
    reward = lambda text, example: 0.5  # noqa: E731
    candidate = evaluate(model, tiny_tokenizer(), EXAMPLES, reward, 4, replaces="in_use")
    assert model.active_adapter == "default"
    assert candidate.mean_kl > 1e-3
    assert abs(candidate.change_kl - candidate.mean_kl) < 1e-5
