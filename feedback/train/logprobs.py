"""Per-token log-probs of completion tokens under a causal LM: the one seam to the numerics.

`token_logprobs` runs the model's body once and scores only the completion positions against the
LM head, so the full [batch, seq, vocab] logits of the prompt are never built. The head step is
`kernels.selective_logprob`: chunked over the completion rows in forward and backward, so not even
the completion's [rows, vocab] float32 logits are kept for backward (Triton on CUDA, torch elsewhere).
"""

from __future__ import annotations

import torch

from kernels import selective_logprob

# Completion rows scored per chunk: 64 rows of a 49k vocabulary is a 12 MiB float32 workspace, and
# peak memory was 14x lower than a full log_softmax at this size (docs/benchmarks.md, kernels).
LOGPROB_CHUNK_ROWS = 64

__all__ = ["selective_logprob", "token_logprobs", "unwrap_causal_lm"]


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
