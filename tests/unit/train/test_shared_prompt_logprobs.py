"""A group's completions scored with their shared prompt run once give the log-probs and gradients
of scoring every row whole (`token_logprobs`, the reference), padding after an end included."""

from __future__ import annotations

import torch

from feedback.train.logprobs import shared_prompt_logprobs, token_logprobs
from feedback.train.policy import attach_lora

from .conftest import tiny_model


def lora_grads(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_the_prompt_run_once_scores_as_every_row_run_whole():
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)
    for param in model.parameters():
        if param.requires_grad:  # LoRA's B starts at 0: give the adapter something to differentiate
            torch.nn.init.normal_(param, std=0.1)
    prompt = torch.tensor([[3, 4, 5, 6]])
    completions = torch.tensor([[7, 8, 1, 0], [9, 10, 11, 12], [5, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    whole = token_logprobs(model, torch.cat([prompt.expand(3, -1), completions], dim=1), mask, 0.7)
    whole.sum().backward()
    expected = lora_grads(model)
    shared = shared_prompt_logprobs(model, prompt, completions, mask, 0.7)
    shared.sum().backward()
    grads = lora_grads(model)
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)
    assert (shared[mask == 0] == 0).all() and (shared[mask == 1] < 0).all()
    assert expected.keys() == grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-4, msg=name)
