"""The trained policy: a causal LM with a LoRA adapter (peft), sampled in groups and scored.

The reference model of the KL term is the same model with the adapter disabled, so training holds
one copy of the weights.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import torch

from context.boundary import boundary_cut, is_mid_line, opens_block, suggestion
from context.generation import healing_tokens
from context.loading import model_loading
from context.prompt_record import ServedPrompt, TokenizerCodec

from .heap import TrimHeap, release_freed_heap
from .logprobs import shared_prompt_logprobs, unwrap_causal_lm
from .references import ReferencePrefix, composer_for
from .shared_rows import share_rows
from .store_source import NEXT_EDIT_SOURCE

__all__ = [
    "LORA_TARGETS",
    "SampledGroup",
    "attach_lora",
    "completion_mask",
    "example_prompt_ids",
    "guided_group",
    "prefilled",
    "prompt_ids",
    "completion_prompt",
    "reference_prefix",
    "sample_example",
    "sample_group",
    "served_prompt",
    "user_text_group",
]


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class SampledGroup:
    """G completions of one prompt. Tensors: prompt [1, P], completions [G, C], mask [G, C].

    `context`: the Squid reference documents the prompt follows (a completion served with some),
    composed as the server composed them; the prompt's first token comes at position
    `context.length`. None: the prompt starts at position 0."""

    prompt: torch.Tensor
    completions: torch.Tensor
    mask: torch.Tensor
    texts: list[str]
    context: ReferencePrefix | None = None

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt.expand(self.completions.shape[0], -1), self.completions], dim=1)

    def past(self) -> tuple[object, int]:
        """(a fresh one-row cache of the context, composed by the weights active now, its length);
        (None, 0) without one."""
        if self.context is None:
            return None, 0
        context = self.context.current()
        return context.cache(1), context.length


def attach_lora(model, rank: int, alpha: int, adapter_path: str | None = None, seed: int = 0):
    """`model` wrapped by peft with a fresh (or the saved, trainable) LoRA adapter named default.

    A fresh adapter's random half (LoRA's A; B starts at zero) is drawn from `seed` (`train.seed`),
    not from whatever state torch's generator is in: the same seed gives the same adapter in every
    process (each data-parallel worker, a round run again), and the caller's generator is left as
    it was."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_path is not None:
        with model_loading():
            return PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                        task_type="CAUSAL_LM")
    # `manual_seed` seeds every device; a model on a GPU draws there, so that generator is saved too.
    gpus = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=gpus):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def prompt_ids(tokenizer, messages: list[dict[str, str]]) -> torch.Tensor:
    """The chat prompt as token ids [1, P], ending where the assistant's answer starts."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return torch.tensor([list(ids)], dtype=torch.long)


def example_prompt_ids(tokenizer, example) -> torch.Tensor:
    """The prompt of a training example [1, P]: the chat prompt, or for a completion episode the
    prompt the completion path builds (`completion_prompt`)."""
    if example.chat_prompt is not None:
        ids = tokenizer(example.chat_prompt, add_special_tokens=False)["input_ids"]
        return torch.tensor([list(ids)], dtype=torch.long)
    if example.prompt_text is None:
        from .dataset import prompt_messages

        return prompt_ids(tokenizer, prompt_messages(example))
    return completion_prompt(tokenizer, example)[0]


def served_prompt(example) -> ServedPrompt:
    """The prompt a completion example was served with; for one built by hand, a record of its text
    with the default settings."""
    return example.served or ServedPrompt.from_text(example.prompt_text + example.prompt_lead)


def reference_prefix(model, tokenizer, example) -> ReferencePrefix | None:
    """The Squid reference documents a completion example was served with, composed by `model`'s
    active weights as the server composed them (`feedback.train.references`); None without any."""
    served = example.served
    if example.prompt_text is None or served is None or not served.references:
        return None
    return composer_for(model, tokenizer).compose(served)


def completion_prompt(tokenizer, example) -> tuple[torch.Tensor, str]:
    """(ids [1, P], heal) of a completion example: the prompt ids the completion was answered from,
    as recorded (`ServedPrompt.model_ids`; the raw text before the cursor, no chat template), and the
    whitespace cut off their end (`heal`) that every answer must start by regenerating."""
    ids, heal = served_prompt(example).model_ids(TokenizerCodec(tokenizer))
    return torch.tensor([ids], dtype=torch.long), heal


def sample_example(model, tokenizer, example, prompt: torch.Tensor, group_size: int,
                   max_new_tokens: int, temperature: float) -> SampledGroup:
    """`sample_group` for a training example. A completion's samples are generated and cut as the
    completion path did it (`completion_prompt`, `context.boundary.suggestion` with the served
    settings and the text after the cursor), so the reward judges what a user would have seen; their
    tokens past it are masked out of the loss, except those by which the sample itself decided where
    it ends (a dedent, a second blank line, its end-of-sequence token: `shown_suggestion`), so that
    where a suggestion ends is trained as what it says is. Each text starts with the example's
    `prompt_lead`, as its `kept_text` does. A completion gets at most the tokens it was served with
    (`max_tokens`)."""
    if example.chat_prompt is not None and example.verification.get("source") == NEXT_EDIT_SOURCE:
        return _next_edit_group(model, tokenizer, example, prompt, group_size, max_new_tokens, temperature)
    if example.chat_prompt is not None:
        return _agent_step_group(model, tokenizer, example, prompt, group_size, max_new_tokens, temperature)
    if example.prompt_text is None:
        return sample_group(model, tokenizer, prompt, group_size, max_new_tokens, temperature)
    served = served_prompt(example)
    _, heal = completion_prompt(tokenizer, example)
    lead = example.prompt_lead
    ctx = served.cursor_context()
    if served.max_tokens is not None:
        max_new_tokens = min(max_new_tokens, served.max_tokens)
    finish = served.finish_tokens if not is_mid_line(ctx) and opens_block(ctx.line_prefix) else 0
    context = reference_prefix(model, tokenizer, example)
    group = sample_group(model, tokenizer, prompt, group_size, max_new_tokens + finish, temperature, heal,
                         context=context)
    eos = eos_token_ids(model, tokenizer)
    texts = []
    for row in range(group.completions.shape[0]):
        length = int(group.mask[row].sum())
        ids = group.completions[row, :length].tolist()
        first_eos = next((i for i, token in enumerate(ids) if token in eos), None)
        generated = tokenizer.decode(ids, skip_special_tokens=True)[len(heal):]
        shown, decided = shown_suggestion(tokenizer, ids, first_eos, heal, max_new_tokens, finish, ctx,
                                          served.max_lines, example.language)
        # The text after `prompt_text`: the lead, then what the completion path would insert.
        texts.append(lead + shown)
        if decided is not None:
            group.mask[row, decided:] = 0
            continue
        group.mask[row, _tokens_covering(tokenizer, ids, len(heal) + _shown_end(generated, shown)):] = 0
    return SampledGroup(group.prompt, group.completions, group.mask, texts, context)


def _agent_step_group(model, tokenizer, example, prompt: torch.Tensor, group_size: int,
                      max_new_tokens: int, temperature: float) -> SampledGroup:
    """An agent step's samples as the local backend returns them: the prompt's opening fence, then
    the text up to where the backend stops a step (the closing fence; its tokens past that are
    masked out of the loss). Such a step gets `verification["max_tokens"]` tokens when it names more
    than `max_new_tokens` (an edit block is longer than a line of code). A repair task's step is
    decoded as the agent's is (`repair_tasks.repair_step_constraint`: its edit block's search text a
    copy of the file), so the samples rewarded are answers the agent could give."""
    from agent.backends import LOCAL_PREFILL, cut_at_step_stop

    from .repair_tasks import repair_step_constraint

    budget = max(max_new_tokens, int(example.verification.get("max_tokens", 0)))
    constrain = repair_step_constraint(example, lambda: _copy_vocabulary(tokenizer))
    group = sample_group(model, tokenizer, prompt, group_size, budget, temperature, constrain=constrain)
    texts = []
    for row in range(group.completions.shape[0]):
        length = int(group.mask[row].sum())
        ids = group.completions[row, :length].tolist()
        generated = tokenizer.decode(ids, skip_special_tokens=True)
        shown, used = cut_at_step_stop(generated)
        texts.append(LOCAL_PREFILL + shown)
        if used is not None:
            group.mask[row, _tokens_covering(tokenizer, ids, used):] = 0
    return SampledGroup(group.prompt, group.completions, group.mask, texts, group.context)


_COPY_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _copy_vocabulary(tokenizer) -> dict[str, list[int]]:
    from agent.copy_search import copy_vocabulary

    vocabulary = _COPY_VOCABULARIES.get(tokenizer)
    if vocabulary is None:
        vocabulary = _COPY_VOCABULARIES[tokenizer] = copy_vocabulary(token_texts(tokenizer))
    return vocabulary


def _next_edit_group(model, tokenizer, example, prompt: torch.Tensor, group_size: int,
                     max_new_tokens: int, temperature: float) -> SampledGroup:
    """A model next edit's samples as `context.next_edit_model.predict_with_model` reads them: the
    rewrite up to the closing fence (its tokens past that masked out of the loss), with the budget
    the episode names for its region (`verification["max_tokens"]`)."""
    from context.next_edit_model import answer_of

    budget = max(max_new_tokens, int(example.verification.get("max_tokens", 0)))
    group = sample_group(model, tokenizer, prompt, group_size, budget, temperature)
    texts = []
    for row in range(group.completions.shape[0]):
        length = int(group.mask[row].sum())
        ids = group.completions[row, :length].tolist()
        rewrite, used = answer_of(tokenizer.decode(ids, skip_special_tokens=True))
        texts.append(rewrite)
        if used is not None:
            group.mask[row, _tokens_covering(tokenizer, ids, used):] = 0
    return SampledGroup(group.prompt, group.completions, group.mask, texts, group.context)


def guided_group(tokenizer, example, group: SampledGroup, guide: str) -> SampledGroup:
    """`group` with its last sample replaced by `guide`, a known good answer to `example` (a repair
    task's fix as an edit block): the text its reward judges, and its tokens after the prompt (for
    an agent step, after the opening fence the prompt ends with, through the closing fence's line
    break, where the backend stops). Rows are padded to the longer of the two, masked out."""
    if example.chat_prompt is not None:
        from agent.backends import LOCAL_PREFILL

        body = guide.removeprefix(LOCAL_PREFILL) + "\n"
    else:
        body = guide
    return _last_row_replaced(tokenizer, group, tokenizer.encode(body, add_special_tokens=False), guide)


def user_text_group(tokenizer, example, group: SampledGroup, max_new_tokens: int) -> SampledGroup | None:
    """`group` with its last sample replaced by what the user ended with at a completion they kept
    or rewrote (`kept_text`), as tokens the completion path would have shown as that text: the
    healed whitespace, the user's text, then what decided its end, where the completion path reads
    it (the document's next line as the user left it, two blank lines, or an end-of-sequence token).
    The tokens through that decision are trained, as a sample's own ending is (`shown_suggestion`).

    None when there is nothing to add: not a completion, reverted, nothing kept, a sample already
    shows that text, or no such tokens make the completion path show it (longer than the samples'
    budget, `max_new_tokens` or the completion's own, or cut by the boundary rules where the user
    did not stop)."""
    if example.prompt_text is None or example.chat_prompt is not None or example.reverted:
        return None
    lead, kept = example.prompt_lead, example.kept_text
    if kept is None or not kept.startswith(lead) or not kept[len(lead):].strip():
        return None
    wanted = kept[len(lead):].rstrip()
    if any(text.rstrip() == lead + wanted for text in group.texts):
        return None
    served = served_prompt(example)
    _, heal = completion_prompt(tokenizer, example)
    ctx = served.cursor_context()
    budget = min(max_new_tokens, served.max_tokens) if served.max_tokens is not None else max_new_tokens
    finish = served.finish_tokens if not is_mid_line(ctx) and opens_block(ctx.line_prefix) else 0
    eos = tokenizer.eos_token_id
    if eos is None:
        return None
    # What ends it, most natural first: the first word of the document's next line with code, as the
    # user left it (a dedent ends a body there; only that word, not the rest of a line the model
    # cannot see from the cursor); two blank lines; an end-of-sequence token. Each is followed by an
    # end-of-sequence token, so that the text is not taken for one the budget cut.
    after = ctx.line_suffix + "".join("\n" + line for line in ctx.following_lines)
    document = re.match(r"\s*?\n\s*(\w+|\S)", after)
    for ending in (*([document.group(0)] if document else []), "\n\n\n", ""):
        ids = tokenizer.encode(heal + wanted + ending, add_special_tokens=False) + [eos]
        text, decided = shown_suggestion(tokenizer, ids, len(ids) - 1, heal, budget, finish, ctx,
                                         served.max_lines, example.language)
        if text != wanted or decided is None:
            continue
        if ending:
            decided = min(decided, len(ids) - 1)  # the ending decided; the closing token only marks it
        return _last_row_replaced(tokenizer, group, ids[:decided], lead + wanted)
    return None


def _last_row_replaced(tokenizer, group: SampledGroup, ids: list[int], text: str) -> SampledGroup:
    """`group` with its last row's tokens `ids` (all trained) and text `text`; rows are padded to
    the longer of the two, masked out."""
    rows, width = group.completions.shape
    width = max(width, len(ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    completions = torch.full((rows, width), int(pad), dtype=group.completions.dtype)  # [G, C']
    mask = torch.zeros((rows, width), dtype=group.mask.dtype)
    completions[:, : group.completions.shape[1]] = group.completions
    mask[:, : group.mask.shape[1]] = group.mask
    completions[-1] = int(pad)
    completions[-1, : len(ids)] = torch.tensor(ids, dtype=completions.dtype)
    mask[-1] = 0
    mask[-1, : len(ids)] = 1
    return SampledGroup(group.prompt, completions, mask, [*group.texts[:-1], text], group.context)


def shown_suggestion(tokenizer, ids: list[int], first_eos: int | None, heal: str, budget: int,
                     finish: int, ctx, max_lines: int, language: str) -> tuple[str, int | None]:
    """The suggestion the completion path would have made of one sampled row (`ids`, its first
    end-of-sequence token at `first_eos`): its first `budget` tokens, `finish` more when it ran
    out inside something it opened; and, when the row's own tokens ended it (a line indented less
    than the block, a second blank line, its end-of-sequence token: `boundary_cut`), how many of
    them it took to decide that (those tokens stay in the loss), else None."""

    def text(count: int) -> str:
        return tokenizer.decode(ids[:count], skip_special_tokens=True)[len(heal):]

    def more() -> tuple[str, bool]:
        total = budget + finish
        return text(total), first_eos is None or first_eos >= total

    ran_out = first_eos is None or first_eos >= budget
    raw = text(budget)
    shown = suggestion(raw, ctx, max_lines, ran_out, language, more if finish else None)
    if not shown.strip():
        return shown, None
    # The text it was cut from: the budget's, or the finished one's (it ran out inside something
    # it opened); a suggestion cut back to what closes, or in other ways, is no cut of either.
    for source in ((lambda: (raw, ran_out)), *((more,) if finish else ())):
        read, read_ran_out = source()  # the finished text is decoded only when the budget's is not it
        cut = boundary_cut(read, ctx, max_lines, read_ran_out)
        if cut.text == shown:
            break
    else:
        return shown, None
    if cut.decided is None:
        return shown, None
    if cut.decided >= len(read):
        return shown, first_eos + 1  # not out of tokens: the end-of-sequence token ended it
    return shown, _tokens_covering(tokenizer, ids, len(heal) + cut.decided)


def _shown_end(generated: str, shown: str) -> int:
    """Where in `generated` the part of `shown` the model wrote ends: after the longest leading part
    of `shown` found there (all of it, but for the closing quotes `context.boundary.suggestion`
    adds to a docstring's summary). 0 when nothing is shown."""
    for size in range(len(shown), 0, -1):
        at = generated.find(shown[:size])
        if at >= 0:
            return at + size
    return 0


def _tokens_covering(tokenizer, ids: list[int], end: int) -> int:
    """How many leading tokens of `ids` decode to at least `end` characters (at least 1)."""
    # The decoded length grows with the token count: bisect for the first count that covers `end`.
    low, high = 1, max(len(ids), 1)
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
    heal: str = "", context: ReferencePrefix | None = None, constrain=None,
) -> SampledGroup:
    """`group_size` completions of `prompt` [1, P]; temperature 0 decodes greedily (one row per copy).
    With `heal`, each completion's first tokens are held to those that regenerate that text. With a
    `context`, the prompt continues its composed cache (as `ModelRuntime.generate(past=...)` does).
    With `constrain` (`context.generation.Constrain`), each row's next token is one it allows after
    the row's text so far, as the runtime's own loop decodes with it.
    The group's tensors are on the model's device (a prompt made on the CPU goes there)."""
    prompt = prompt.to(model_device(model))
    eos = eos_token_ids(model, tokenizer)
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    else:
        sampling = {"do_sample": False}
    full, cache = prompt, None
    if context is not None:
        head = torch.tensor([context.token_ids], dtype=prompt.dtype, device=prompt.device)
        full, cache = torch.cat([head, prompt], dim=1), context.cache(1)  # [1, context + P]
    # generate() reads what the cache holds and runs the rest after it: the prompt's last token.
    sampling["cache"] = prefilled(model, prompt, cache, full.shape[1] - prompt.shape[1], group_size)
    from transformers import LogitsProcessorList

    release_freed_heap()  # what composing and prefilling freed, before the cache grows G rows at a time
    if heal:
        constrain = _healing(tokenizer, heal, constrain)
    processors = [_Constrained(tokenizer, constrain, full.shape[1])] if constrain is not None else []
    sampling["logits_processor"] = LogitsProcessorList([*processors, TrimHeap()])
    prompts = full.expand(group_size, -1)  # [G, context + P]
    out = model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_new_tokens,
        pad_token_id=min(eos), **sampling,
    )
    completions = out[:, full.shape[1]:]  # [G, C]
    mask = completion_mask(completions, eos)
    texts = [
        tokenizer.decode(row[keep.bool()].tolist(), skip_special_tokens=True)
        for row, keep in zip(completions, mask, strict=True)
    ]
    return SampledGroup(prompt, completions, mask, texts, context)


def prefilled(model, prompt: torch.Tensor, cache, start: int, rows: int):
    """`cache` (one row of `start` positions, or a new one when None) extended by `prompt` [1, P]
    but its last token, run once, then shared by `rows` samples (`shared_rows.share_rows`): generating
    G samples runs the prompt once instead of G times, no [G, P] activations are made, and the
    common positions are held once."""
    from transformers import DynamicCache

    lm = unwrap_causal_lm(model)
    cache = cache if cache is not None else DynamicCache(config=lm.config)
    if prompt.shape[1] > 1:
        positions = torch.arange(start, start + prompt.shape[1] - 1, device=prompt.device)[None]  # [1, P - 1]
        lm.model(input_ids=prompt[:, :-1], position_ids=positions, cache=cache, use_cache=True)
    if rows > 1:
        share_rows(cache, rows)  # [1, kv_heads, start + P - 1, head_dim] per layer, read by every row
    return cache


class _Constrained:
    """A logits processor for a decoding constraint (`context.generation.Constrain`): each row's
    scores kept only where the constraint allows a token after the row's text so far (all kept
    where it allows any, or none)."""

    def __init__(self, tokenizer, constrain, prompt_length: int):
        self.tokenizer, self.constrain, self.prompt_length = tokenizer, constrain, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for row in range(input_ids.shape[0]):
            allowed = self.constrain(self.tokenizer.decode(input_ids[row, self.prompt_length:].tolist()))
            if not allowed:
                continue
            allowed = [token for token in allowed if token < scores.shape[-1]]
            masked = torch.full_like(scores[row], float("-inf"))
            masked[allowed] = scores[row, allowed]
            scores[row] = masked
        return scores


def _healing(tokenizer, heal: str, then=None):
    """Token healing as a constraint, as the runtime's own loop heals: while a row's new text is
    shorter than `heal`, only tokens that agree with the rest of it; after that `then` (or any)."""
    texts = token_texts(tokenizer)
    allowed: dict[str, list[int]] = {}  # rows share them: one scan per text

    def constrain(done: str):
        if len(done) >= len(heal):
            return then(done) if then is not None else None
        rest = heal[len(done):]
        if rest not in allowed:
            allowed[rest] = healing_tokens(texts, rest)
        return allowed[rest]

    return constrain


_TOKEN_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_texts(tokenizer) -> list[str]:
    """The text of every token id of `tokenizer` (decoded once per tokenizer)."""
    texts = _TOKEN_TEXTS.get(tokenizer)
    if texts is None:
        texts = _TOKEN_TEXTS[tokenizer] = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return texts


def group_logprobs(model, group: SampledGroup, temperature: float) -> torch.Tensor:
    """Per-token log-probs [G, C] of the group's completions under `model` as it is now (after its
    context, composed by the weights active now)."""
    past, offset = group.past()
    device = model_device(model)  # a group built by hand (supervised targets) may be on the CPU
    return shared_prompt_logprobs(model, group.prompt.to(device), group.completions.to(device),
                                  group.mask.to(device), temperature, past=past, past_length=offset)


def model_device(model) -> torch.device:
    """Where `model`'s weights are (the device every input of it must be on)."""
    return next(model.parameters()).device


@torch.no_grad()
def reference_logprobs(model, group: SampledGroup, temperature: float) -> torch.Tensor:
    """The same log-probs with the adapter disabled: the reference policy of the KL term (its context
    composed by the base model, as a server without the adapter would)."""
    with model.disable_adapter():
        return group_logprobs(model, group, temperature)
