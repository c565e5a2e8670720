"""Per-token log-probs of completion tokens under a causal LM: the one seam to the numerics.

`token_logprobs` runs the model's body once and scores only the completion positions against the
LM head, so the full [batch, seq, vocab] logits of the prompt are never built. The head step is
`kernels.selective_logprob`: chunked over the completion rows in forward and backward, so not even
the completion's [rows, vocab] float32 logits are kept for backward (Triton on CUDA, torch elsewhere).

`shared_prompt_logprobs` scores a group (G completions of one prompt) as one packed row: the prompt
once, then the G completions, each masked to see the prompt and itself (`group_mask`). The prompt's
activations, and a long context before it (Squid reference documents, a prefilled cache), are held
once instead of G times, the context only read (`read_only_context`). With gradients it checkpoints
the decoder layers (`checkpointed_layers`): the backward pass runs each layer's forward again
instead of keeping every layer's activations, one more forward of the body for a fraction of the
memory (docs/benchmarks.md, trainer memory). `token_logprobs` is its reference.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from kernels import selective_logprob

# Completion rows scored per chunk: 64 rows of a 49k vocabulary is a 12 MiB float32 workspace, and
# peak memory was 14x lower than a full log_softmax at this size (docs/benchmarks.md, kernels).
LOGPROB_CHUNK_ROWS = 64

__all__ = [
    "checkpointed_layers",
    "group_mask",
    "read_only_context",
    "selective_logprob",
    "shared_prompt_logprobs",
    "token_logprobs",
    "unwrap_causal_lm",
]


def unwrap_causal_lm(model):
    """The transformers *ForCausalLM inside a peft wrapper (LoRA layers stay injected in it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    attention_mask: torch.Tensor | None = None,
    *,
    past=None,
    past_length: int = 0,
) -> torch.Tensor:
    """Log-probs [b, C] of the last C tokens of `input_ids` [b, L], C = completion_mask.shape[1].

    Positions where `completion_mask` is 0 (padding after the end of a completion) are returned
    as 0. `attention_mask` [b, L] defaults to the prompt (all ones) followed by `completion_mask`.
    `past`: a transformers cache (b rows) of `past_length` positions that `input_ids` continue (a
    Squid-composed context; extended in place, so a fresh one per call), read as constants.
    """
    lm = unwrap_causal_lm(model)
    completion_len = completion_mask.shape[1]
    if attention_mask is None:
        prompt_ones = torch.ones(
            input_ids.shape[0], input_ids.shape[1] - completion_len, dtype=completion_mask.dtype,
            device=input_ids.device,
        )
        attention_mask = torch.cat([prompt_ones, completion_mask], dim=1)  # [b, L]
    extra = {}
    if past is not None:
        context_ones = torch.ones(input_ids.shape[0], past_length, dtype=attention_mask.dtype,
                                  device=input_ids.device)
        attention_mask = torch.cat([context_ones, attention_mask], dim=1)  # [b, past_length + L]
        positions = torch.arange(past_length, past_length + input_ids.shape[1], device=input_ids.device)
        extra = {"cache": past, "position_ids": positions[None].expand(input_ids.shape[0], -1)}
    hidden = lm.model(input_ids=input_ids, attention_mask=attention_mask,
                      **extra).last_hidden_state  # [b, L, d]
    # The hidden state at position t predicts token t + 1.
    scoring = hidden[:, -completion_len - 1 : -1, :]  # [b, C, d]
    targets = input_ids[:, -completion_len:]  # [b, C]
    head = lm.get_output_embeddings()
    logps = selective_logprob(
        scoring, head.weight, targets, bias=getattr(head, "bias", None), temperature=temperature,
        chunk_size=LOGPROB_CHUNK_ROWS,
    )
    return logps * completion_mask.to(logps.dtype)


def shared_prompt_logprobs(
    model,
    prompt: torch.Tensor,
    completions: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    past=None,
    past_length: int = 0,
    checkpoint: bool = True,
) -> torch.Tensor:
    """`token_logprobs` of the G rows `prompt` [1, P] + `completions` [G, C], the prompt run once.

    One packed row: the prompt, then the G completions one after another, each at the positions it
    would have alone and seeing the context, the prompt and its own earlier tokens (`group_mask`). So
    the context is attended as one row, never repeated G times. `past`: a transformers cache of one
    row holding `past_length` positions before the prompt (a Squid-composed context), only read.
    With gradients on and `checkpoint`, each decoder layer keeps only its input for the backward pass
    and runs again there (`checkpointed_layers`). Returns [G, C], 0 where `completion_mask` is 0.
    """
    lm = unwrap_causal_lm(model)
    rows, completion_len = completions.shape
    prompt_len = prompt.shape[1]
    device = prompt.device
    end = past_length + prompt_len
    ids = torch.cat([prompt, completions.reshape(1, -1)], dim=1)  # [1, P + G*C]
    positions = torch.cat([
        torch.arange(past_length, end, device=device),
        torch.arange(end, end + completion_len, device=device).repeat(rows),
    ])[None]  # [1, P + G*C]
    dtype = lm.get_output_embeddings().weight.dtype
    visible = group_mask(prompt_len, completion_mask.to(device), past_length)  # [P + G*C, past + P + G*C]
    additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(
        ~visible, torch.finfo(dtype).min)[None, None]  # [1, 1, P + G*C, past + P + G*C]
    context = None if past is None else read_only_context(past)
    with checkpointed_layers(lm, checkpoint and torch.is_grad_enabled()):
        hidden = lm.model(input_ids=ids, attention_mask=additive, position_ids=positions, cache=context,
                          use_cache=False).last_hidden_state  # [1, P + G*C, d]
    # Position t's hidden state predicts token t + 1: the prompt's last one predicts each first token.
    first = hidden[:, prompt_len - 1 : prompt_len, :].expand(rows, -1, -1)  # [G, 1, d]
    tails = hidden[0, prompt_len:, :].reshape(rows, completion_len, -1)[:, :-1, :]  # [G, C - 1, d]
    scoring = torch.cat([first, tails], dim=1)  # [G, C, d]
    out = lm.get_output_embeddings()
    logps = selective_logprob(
        scoring, out.weight, completions, bias=getattr(out, "bias", None), temperature=temperature,
        chunk_size=LOGPROB_CHUNK_ROWS,
    )
    return logps * completion_mask.to(logps.dtype)


def group_mask(prompt_len: int, completion_mask: torch.Tensor, past_length: int = 0) -> torch.Tensor:
    """Which keys each query of a packed group sees (True), [P + G*C, past + P + G*C]: every query
    the context; the prompt causally; completion g's token t the whole prompt and g's tokens up to t
    that `completion_mask` [G, C] keeps (as a batch of G rows with that attention mask would)."""
    rows, completion_len = completion_mask.shape
    device = completion_mask.device
    queries = prompt_len + rows * completion_len
    visible = torch.zeros(queries, past_length + queries, dtype=torch.bool, device=device)
    visible[:, :past_length] = True
    visible[:prompt_len, past_length : past_length + prompt_len] = torch.ones(
        prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
    visible[prompt_len:, past_length : past_length + prompt_len] = True
    causal = torch.ones(completion_len, completion_len, dtype=torch.bool, device=device).tril()  # [C, C]
    keep = completion_mask.bool()
    for row in range(rows):
        start = prompt_len + row * completion_len
        key = past_length + start
        # [C, C]: its own kept tokens, causally
        visible[start : start + completion_len, key : key + completion_len] = causal & keep[row][None, :]
    return visible


def read_only_context(cache):
    """A view of `cache` (a transformers DynamicCache of context) that a forward pass reads and never
    extends: each layer's keys and values are the context's followed by the new ones, and nothing is
    stored. A layer run again in the backward pass (gradient checkpointing) then sees exactly what it
    saw the first time, which the DynamicCache itself, extended by every call, cannot give."""
    view = object.__new__(_read_only_cache_class())
    view.__dict__.update(cache.__dict__)  # the same layers, not copied
    return view


@functools.cache
def _read_only_cache_class():
    from transformers import DynamicCache

    class ReadOnlyCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return (torch.cat([layer.keys, key_states], dim=-2),  # [b, kv_heads, past + L, head_dim]
                    torch.cat([layer.values, value_states], dim=-2))

    return ReadOnlyCache


@contextmanager
def checkpointed_layers(lm, enabled: bool):
    """Gradient checkpointing of `lm`'s decoder layers while inside (non-reentrant torch checkpoint,
    a read-only context cache allowed); as they were after. The recomputation in the backward pass
    runs the layer's own forward and does not need this to be active."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)] if enabled else []
    names = ("gradient_checkpointing", "_gradient_checkpointing_func", "_can_checkpoint_with_cache")
    before = [{name: m.__dict__[name] for name in names if name in m.__dict__} for m in layers]
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = functools.partial(torch_checkpoint, use_reentrant=False)
        layer._can_checkpoint_with_cache = True  # the cache is read-only (`read_only_context`)
    try:
        yield
    finally:
        for layer, attrs in zip(layers, before, strict=True):
            for name in names:
                if name in attrs:
                    setattr(layer, name, attrs[name])
                else:
                    layer.__dict__.pop(name, None)
