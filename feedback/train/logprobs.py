"""Per-token log-probs of completion tokens under a causal LM: the one seam to the numerics.

`token_logprobs` runs the model's body once and scores only the completion positions against the
LM head, so the full [batch, seq, vocab] logits of the prompt are never built. The head step is
`kernels.selective_logprob`: chunked over the completion rows in forward and backward, so not even
the completion's [rows, vocab] float32 logits are kept for backward (Triton on CUDA, torch elsewhere).

`shared_prompt_logprobs` scores a group (G completions of one prompt) with the prompt run once: the
activations autograd keeps for it, and the attention of its tokens over a long context (Squid
reference documents before it), are held once instead of G times. `token_logprobs` is its reference.
"""

from __future__ import annotations

import torch

from kernels import selective_logprob

# Completion rows scored per chunk: 64 rows of a 49k vocabulary is a 12 MiB float32 workspace, and
# peak memory was 14x lower than a full log_softmax at this size (docs/benchmarks.md, kernels).
LOGPROB_CHUNK_ROWS = 64

__all__ = ["selective_logprob", "shared_prompt_logprobs", "token_logprobs", "unwrap_causal_lm"]


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
) -> torch.Tensor:
    """`token_logprobs` of the G rows `prompt` [1, P] + `completions` [G, C], the prompt run once.

    `past`: a transformers cache of one row holding `past_length` positions before the prompt (a
    Squid-composed context; extended in place, so a fresh one per call). Returns [G, C], 0 where
    `completion_mask` is 0.
    """
    from transformers import DynamicCache

    lm = unwrap_causal_lm(model)
    rows, completion_len = completions.shape
    device = prompt.device
    cache = past if past is not None else DynamicCache(config=lm.config)
    end = past_length + prompt.shape[1]
    seen = torch.ones(1, end, dtype=completion_mask.dtype, device=device)  # [1, past + P]
    positions = torch.arange(past_length, end, device=device)[None]  # [1, P]
    head = lm.model(input_ids=prompt, attention_mask=seen, position_ids=positions, cache=cache,
                    use_cache=True).last_hidden_state[:, -1:, :]  # [1, 1, d]: predicts the first token
    if rows > 1:
        cache.batch_repeat_interleave(rows)  # [G, kv_heads, past + P, head_dim] per layer
    attention = torch.cat([seen.expand(rows, -1), completion_mask], dim=1)  # [G, past + P + C]
    positions = torch.arange(end, end + completion_len, device=device)[None].expand(rows, -1)
    tail = lm.model(input_ids=completions, attention_mask=attention, position_ids=positions, cache=cache,
                    use_cache=True).last_hidden_state  # [G, C, d]
    # Position t's hidden state predicts token t + 1: the prompt's last one predicts the first.
    scoring = torch.cat([head.expand(rows, -1, -1), tail[:, :-1, :]], dim=1)  # [G, C, d]
    out = lm.get_output_embeddings()
    logps = selective_logprob(
        scoring, out.weight, completions, bias=getattr(out, "bias", None), temperature=temperature,
        chunk_size=LOGPROB_CHUNK_ROWS,
    )
    return logps * completion_mask.to(logps.dtype)
