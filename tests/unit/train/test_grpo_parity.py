"""Parity of feedback.train.grpo's loss with TRL's GRPOTrainer loss (trl pinned in the test extra).

A real, minimal GRPOTrainer (a tiny random Llama) computes its loss through its own
`_compute_loss`; only the model forward that produces per-token log-probs is replaced, so that both
sides are fed the same logits, old and reference log-probs, advantages and masks. Ratios are pushed
far from 1 so both clip bounds are active.
"""

from __future__ import annotations

import pytest
import torch

from feedback.train.grpo import LOSS_TYPES, GrpoLossConfig, grpo_loss
from feedback.train.logprobs import selective_logprob

trl = pytest.importorskip("trl")

VOCAB, B, T, MAX_LEN = 32, 6, 9, 12


def _trl_trainer(loss_type: str, beta: float, grad_accum: int, kl_correction: bool, tmp_path):
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    args = GRPOConfig(
        output_dir=str(tmp_path), loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28,
        num_generations=2, per_device_train_batch_size=B, gradient_accumulation_steps=grad_accum,
        max_completion_length=MAX_LEN, use_bias_correction_kl=kl_correction, report_to=[], use_cpu=True,
    )
    # A model directory, not an instance: TRL builds its reference model from the same path.
    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(str(model_dir))
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=Dataset.from_dict({"prompt": ["t2 t3"] * B}), processing_class=tokenizer,
    )
    trainer.model.train()
    # Trainer.train() sets this at the start of each accumulation window.
    trainer.current_gradient_accumulation_steps = grad_accum
    return trainer


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, VOCAB, generator=gen) * 2
    tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
    mask = torch.ones(B, T)
    mask[1, 5:] = 0
    mask[3, 2:] = 0
    mask[4, 7:] = 0
    # Old log-probs far from the current ones: ratios well outside [0.8, 1.28] on both sides.
    base = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old = base + torch.randn(B, T, generator=gen) * 0.6
    ref = base + torch.randn(B, T, generator=gen) * 0.3
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5, 0.9, -0.3])
    return logits, tokens, mask, old, ref, advantages


def _ours(logits, tokens, mask, old, ref, adv, loss_type, beta, grad_accum, kl_correction):
    logits = logits.clone().requires_grad_(True)
    # The logits enter through the same head function the trainer uses (identity head weight).
    logps = selective_logprob(logits, torch.eye(VOCAB), tokens)
    config = GrpoLossConfig(beta=beta, epsilon_low=0.2, epsilon_high=0.28, loss_type=loss_type,
                            max_completion_length=MAX_LEN, kl_bias_correction=kl_correction)
    loss, stats = grpo_loss(logps, old, ref, adv, mask, config, grad_accum=grad_accum,
                            num_items_in_batch=float(mask.sum()))
    loss.backward()
    return loss.detach(), logits.grad, stats


def _theirs(trainer, logits, tokens, mask, old, ref, adv):
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    logits = logits.clone().requires_grad_(True)

    def per_token_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return selective_log_softmax(logits, tokens), entropy_from_logits(logits), None

    trainer._get_per_token_logps_and_entropies = per_token_logps
    inputs = {
        "prompt_ids": torch.full((B, 2), 2), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": tokens, "completion_mask": mask.long(),
        "old_per_token_logps": old, "ref_per_token_logps": ref, "advantages": adv,
        "num_items_in_batch": mask.sum(),
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), logits.grad


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize(
    ("beta", "grad_accum", "kl_correction"), [(0.04, 1, True), (0.1, 2, False), (0.0, 2, True)]
)
def test_loss_and_gradients_match_trl(loss_type, beta, grad_accum, kl_correction, tmp_path):
    trainer = _trl_trainer(loss_type, beta, grad_accum, kl_correction, tmp_path)
    if loss_type == "dapo":
        # TRL scales dapo by accumulation / steps_per_generation, which equal each other by default.
        assert trainer.args.steps_per_generation == grad_accum
    data = _inputs(seed=7)
    ours_loss, ours_grad, stats = _ours(*data, loss_type, beta, grad_accum, kl_correction)
    theirs_loss, theirs_grad = _theirs(trainer, *data)
    assert stats.clip_fraction > 0.2, "the test must exercise clipping"
    assert torch.allclose(ours_loss, theirs_loss, atol=1e-6, rtol=0), (ours_loss, theirs_loss)
    assert torch.allclose(ours_grad, theirs_grad, atol=1e-6, rtol=0)
    assert ours_grad.abs().sum() > 0
    if beta:
        trl_kl = trainer._metrics["train"]["kl"][-1]
        assert stats.kl == pytest.approx(trl_kl, abs=1e-6)
