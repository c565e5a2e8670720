"""The trained policy: a causal LM with a LoRA adapter (peft), sampled in groups and scored.

The reference model of the KL term is the same model with the adapter disabled, so training holds
one copy of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from context.boundary import cursor_context, cut_at_boundary
from context.loading import model_loading

from .logprobs import token_logprobs

__all__ = [
    "LORA_TARGETS",
    "SampledGroup",
    "attach_lora",
    "completion_mask",
    "example_prompt_ids",
    "prompt_ids",
    "sample_example",
    "sample_group",
]


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


def example_prompt_ids(tokenizer, example) -> torch.Tensor:
    """The prompt of a training example [1, P]: its raw text for a completion episode (its nearest
    `prompt_tokens` kept, no chat template: what the inline completion path feeds the model), the
    chat prompt otherwise."""
    if example.prompt_text is None:
        from .dataset import prompt_messages

        return prompt_ids(tokenizer, prompt_messages(example))
    budget_tokens = example.prompt_tokens
    ids = tokenizer(example.prompt_text[-budget_tokens * 8:], add_special_tokens=False)["input_ids"]
    return torch.tensor([list(ids)[-budget_tokens:]], dtype=torch.long)


def sample_example(model, tokenizer, example, prompt: torch.Tensor, group_size: int,
                   max_new_tokens: int, temperature: float) -> SampledGroup:
    """`sample_group` for a training example; a completion's samples are cut where the inline
    completion path cuts them (its texts are what a user would have seen) and their tokens past
    the cut are masked out of the loss."""
    group = sample_group(model, tokenizer, prompt, group_size, max_new_tokens, temperature)
    if example.prompt_text is None:
        return group
    ctx = cursor_context(example.prompt_text, len(example.prompt_text), 0)
    texts = []
    for row, text in enumerate(group.texts):
        truncated = bool(group.mask[row].all())  # no end-of-sequence token: ran out of tokens
        shown = cut_at_boundary(text, ctx, example.max_lines, truncated=truncated)
        texts.append(shown)
        keep = _tokens_covering(tokenizer, group.completions[row], int(group.mask[row].sum()),
                                text, shown)
        group.mask[row, keep:] = 0
    return SampledGroup(group.prompt, group.completions, group.mask, texts)


def _tokens_covering(tokenizer, row: torch.Tensor, length: int, text: str, shown: str) -> int:
    """How many leading tokens of `row` produce the text up to the end of `shown` (at least 1)."""
    end = text.find(shown) + len(shown) if shown else 0
    ids = row[:length].tolist()
    # The decoded length grows with the token count: bisect for the first count that covers `end`.
    low, high = 1, max(length, 1)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(ids[:middle], skip_special_tokens=True)) >= end:
            high = middle
        else:
            low = middle + 1
    return low


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
