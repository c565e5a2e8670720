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


def context_cache(model, ids: list[int]):
    """A one-row transformers cache of `ids` run through `model` (a Squid context stands in)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


def saved_bytes(fn) -> tuple[torch.Tensor, int]:
    """`fn()`'s result and the bytes autograd saved for its backward pass (outside checkpoints)."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return out, total


def test_after_a_context_the_packed_checkpointed_group_scores_as_every_row_run_whole():
    """The memory-saving path (one packed row, the context read once and never extended, decoder
    layers checkpointed) gives the log-probs and gradients of the plain one: every row whole after
    its own copy of the context. And it is active: autograd keeps a fraction of the plain path's."""
    torch.manual_seed(0)
    lm = tiny_model()
    model = attach_lora(lm, 4, 8)
    for param in model.parameters():
        if param.requires_grad:
            torch.nn.init.normal_(param, std=0.1)
    context = [int(t) for t in torch.randint(2, 32, (48,))]
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8]])
    completions = torch.randint(2, 32, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[3, 4:] = 0
    model.train()

    def plain():
        past = context_cache(lm, context)
        past.batch_repeat_interleave(4)
        return token_logprobs(model, torch.cat([prompt.expand(4, -1), completions], dim=1), mask, 0.9,
                              past=past, past_length=len(context))

    whole, plain_bytes = saved_bytes(plain)
    whole.sum().backward()
    expected = lora_grads(model)
    past = context_cache(lm, context)
    packed, packed_bytes = saved_bytes(lambda: shared_prompt_logprobs(
        model, prompt, completions, mask, 0.9, past=past, past_length=len(context)))
    packed.sum().backward()
    grads = lora_grads(model)
    torch.testing.assert_close(packed, whole, rtol=1e-5, atol=1e-5)
    assert (packed[mask == 0] == 0).all() and (packed[mask == 1] < 0).all()
    assert expected.keys() == grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-4, msg=name)
    assert past.get_seq_length() == len(context)  # read, not extended: a recomputation sees the same
    assert packed_bytes * 4 < plain_bytes, (packed_bytes, plain_bytes)
    assert not any(getattr(layer, "gradient_checkpointing", False) for layer in lm.modules())  # as before


def test_the_packed_group_mask():
    from feedback.train.logprobs import group_mask

    visible = group_mask(2, torch.tensor([[1, 1], [1, 0]]), past_length=1).int()
    # Keys: context | prompt p0 p1 | row 0: a0 a1 | row 1: b0 b1 (b1 past the end, seen by no one).
    assert visible.tolist() == [
        [1, 1, 0, 0, 0, 0, 0],  # p0
        [1, 1, 1, 0, 0, 0, 0],  # p1
        [1, 1, 1, 1, 0, 0, 0],  # a0
        [1, 1, 1, 1, 1, 0, 0],  # a1
        [1, 1, 1, 0, 0, 1, 0],  # b0
        [1, 1, 1, 0, 0, 1, 0],  # b1
    ]
