"""The trained policy: a causal LM with a LoRA adapter (peft), sampled in groups and scored.

The reference model of the KL term is the same model with the adapter disabled, so training holds
one copy of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from context.loading import model_loading

from .logprobs import token_logprobs

__all__ = ["LORA_TARGETS", "SampledGroup", "attach_lora", "completion_mask", "prompt_ids", "sample_group"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class SampledGroup:
    """G completions of one prompt. Tensors: prompt [1, P], completions [G, C], mask [G, C]."""

    prompt: torch.Tensor
    completions: torch.Tensor
    mask: torch.Tensor
    texts: list[str]

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt.expand(self.completions.shape[0], -1), self.completions], dim=1)


def attach_lora(model, rank: int, alpha: int, adapter_path: str | None = None):
    """`model` wrapped by peft with a fresh (or the saved, trainable) LoRA adapter named default."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_path is not None:
        with model_loading():
            return PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def prompt_ids(tokenizer, messages: list[dict[str, str]]) -> torch.Tensor:
    """The chat prompt as token ids [1, P], ending where the assistant's answer starts."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return torch.tensor([list(ids)], dtype=torch.long)


def completion_mask(completions: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """1 up to and including the first end-of-sequence token of each row, 0 after it. [G, C]."""
    is_eos = torch.zeros_like(completions, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= completions == eos
    # Count the EOS tokens strictly before each position: a token is kept while that count is 0.
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (before == 0).long()


def eos_token_ids(model, tokenizer) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def sample_group(
    model, tokenizer, prompt: torch.Tensor, group_size: int, max_new_tokens: int, temperature: float,
) -> SampledGroup:
    """`group_size` completions of `prompt` [1, P]; temperature 0 decodes greedily (one row per copy)."""
    eos = eos_token_ids(model, tokenizer)
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    else:
        sampling = {"do_sample": False}
    prompts = prompt.expand(group_size, -1)  # [G, P]
    out = model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_new_tokens,
        pad_token_id=min(eos), **sampling,
    )
    completions = out[:, prompt.shape[1]:]  # [G, C]
    mask = completion_mask(completions, eos)
    texts = [
        tokenizer.decode(row[keep.bool()].tolist(), skip_special_tokens=True)
        for row, keep in zip(completions, mask, strict=True)
    ]
    return SampledGroup(prompt, completions, mask, texts)


def group_logprobs(model, group: SampledGroup, temperature: float) -> torch.Tensor:
    """Per-token log-probs [G, C] of the group's completions under `model` as it is now."""
    return token_logprobs(model, group.input_ids(), group.mask, temperature)


@torch.no_grad()
def reference_logprobs(model, group: SampledGroup, temperature: float) -> torch.Tensor:
    """The same log-probs with the adapter disabled: the reference policy of the KL term."""
    with model.disable_adapter():
        return token_logprobs(model, group.input_ids(), group.mask, temperature)
