"""Token loops over the decode engine: one sequence (with prompt-lookup drafts) or K candidates.

The loops own what happens between forward passes: sampling on the last position only, the
caller's cancellation poll before every emitted token, end-of-sequence, stop sequences, the token
budget, token healing, a caller's decoding constraint (`Constrain`: the tokens allowed next), and
the log-probability of what was chosen. The model math is in
`context.decode`; the runtime (`context.runtime`) prepares the cache and calls these.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from .decode import DecodeEngine, KVCache
from .lookup import DraftLengths, PromptLookup

__all__ = [
    "Constrain",
    "Emitted",
    "constraint_mask",
    "SequenceLoop",
    "earliest_stop",
    "emit",
    "healing_tokens",
    "pick_token",
    "run_batch",
    "sample_rows",
]


def healing_tokens(token_texts: list[str], remaining: str) -> list[int]:
    """Token healing: the ids whose text agrees with `remaining`, the text still to regenerate
    (it starts with the token's text, or the token's text starts with it).

    Cut spaces or tabs are where the cursor stands (its line's indentation, the space after
    `return`): a token that regenerates them may not go on with more of them, which would put the
    suggestion's code in another column than the cursor (seen on real code: at a dedent, where an
    `except` was due, a longer indentation token satisfied the heal and the model wrote the deeper
    block's next line)."""
    n = len(remaining)
    blank_end = remaining[-1:] in (" ", "\t")

    def agrees(text: str) -> bool:
        if remaining.startswith(text):
            return True
        return text.startswith(remaining) and not (blank_end and text[n:n + 1] in (" ", "\t"))

    return [i for i, text in enumerate(token_texts) if text and agrees(text)]


def pick_token(logits: torch.Tensor, temperature: float, top_p: float, generator) -> int:
    """Greedy (temperature 0) or nucleus sampling from one row of logits [1, vocab]."""
    logits = logits[0].float()  # [vocab]
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    # Keep the smallest set of tokens whose mass reaches top_p (always at least one).
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
    return int(order[choice])


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    """One token per row of logits [rows, vocab], greedy or nucleus; returns [rows]."""
    logits = logits.float()
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(-1, keepdim=True), 1, generator=generator)
    return order.gather(-1, choice)[:, 0]


def earliest_stop(text: str, stop: tuple[str, ...]) -> int | None:
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


@dataclass
class Emitted:
    """What a loop produced for one sequence."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    reason: str = "length"
    logprob: float = 0.0
    done: bool = False
    drafted: int = 0
    accepted: int = 0


class SequenceLoop:
    """Generate one sequence after the prompt held in `cache` (prefilled up to its last token)."""

    def __init__(self, engine: DecodeEngine, cache: KVCache, *, decode: Callable[[list[int]], str],
                 eos_ids: set[int], healing_mask: Callable[[str, int], torch.Tensor],
                 constrain: Constrain | None = None, draft_token_cost: float = 0.2):
        """`draft_token_cost`: what a drafted token adds to a verify pass, in decoding steps
        (`DraftLengths.token_cost`; measured per machine by `context.tuning`)."""
        self.engine, self.cache = engine, cache
        self.draft_token_cost = draft_token_cost
        self.decode, self.eos_ids, self.healing_mask = decode, eos_ids, healing_mask
        # A mask picks among exact logits wherever it limits the pick (`_constrained_ahead`); a draft
        # is kept as far as the masked argmax would have picked it (`_accept_draft`).
        self.constrain = constrain

    def run(self, logits: torch.Tensor, *, max_new_tokens: int, stop: tuple[str, ...], temperature: float,
            top_p: float, generator, should_stop, heal: str, lookup: PromptLookup | None) -> Emitted:
        out = Emitted()
        greedy = temperature <= 0
        self.lengths = DraftLengths(lookup.max_draft, self.draft_token_cost) if lookup is not None else None
        while not out.done:
            if should_stop():
                out.reason, out.done = "stopped_by_caller", True
                break
            healing = len(self.decode(out.ids)) < len(heal) if heal else False
            step_logits = logits
            if healing:
                step_logits = logits + self.healing_mask(heal[len(self.decode(out.ids)) :], logits.shape[-1])
            elif len(out.ids) >= max_new_tokens:
                break
            elif self.constrain is not None:
                step_logits = logits + constraint_mask(self.constrain(out.text), logits)
            next_id = pick_token(step_logits, temperature, top_p, generator)
            if not emit(out, next_id, _logprob(logits[0], next_id), self.decode, self.eos_ids, heal, stop,
                        max_new_tokens):
                break
            draft: list[int] = []
            # A token healing still constrains picks the argmax among a few allowed tokens: exact logits.
            healing_next = bool(heal) and len(self.decode(out.ids)) < len(heal)
            if greedy and lookup is not None:
                lookup.append(next_id)
                if not healing_next:
                    source = lookup.source
                    draft = lookup.draft(self.lengths.length(source, max_new_tokens - len(out.ids)))
            step = torch.tensor([[next_id, *draft]], device=self.engine.device)
            exact = healing_next or self._constrained_ahead(out.ids + [*draft], len(draft), heal)
            all_logits = self.engine.forward(step, self.cache, all_logits=bool(draft),
                                             greedy=greedy and not exact)[0]  # [T, vocab]
            if not draft:
                logits = all_logits[-1:]
                continue
            logits = self._accept_draft(out, draft, all_logits, lookup, should_stop, heal, stop,
                                        max_new_tokens, source)
        return out

    def _accept_draft(self, out: Emitted, draft, all_logits, lookup, should_stop, heal, stop, max_new_tokens,
                      source):
        """Keep the draft's longest prefix that greedy decoding would have produced."""
        predicted = all_logits.argmax(-1).tolist()  # predicted[i] follows draft[i - 1]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == self._greedy_pick(
                predicted[accepted], all_logits[accepted : accepted + 1], out.ids + draft[:accepted], heal):
            accepted += 1
        out.drafted += len(draft)
        out.accepted += accepted
        self.lengths.record(source, len(draft), accepted)
        # Keys of rejected draft tokens are dropped; the next forward pass overwrites them.
        self.cache.crop(self.cache.length - (len(draft) - accepted))
        for index in range(accepted):
            if should_stop():
                out.reason, out.done = "stopped_by_caller", True
                break
            token = draft[index]
            logprob = _logprob(all_logits[index], token)
            if not emit(out, token, logprob, self.decode, self.eos_ids, heal, stop, max_new_tokens):
                break
            lookup.append(token)
        # When the sequence ended inside the draft the cache still holds valid keys for every
        # accepted token (it describes `cache.ids`), so nothing needs undoing.
        return all_logits[accepted : accepted + 1]


    def _constrained_ahead(self, ids: list[int], drafted: int, heal: str) -> bool:
        """Whether the constraint limits a pick after `ids` or after any of its first `drafted`
        tokens cut off its end (the positions the next forward pass scores): only then does it need
        exact logits; elsewhere the argmax of the cheaper greedy head is the pick."""
        if self.constrain is None:
            return False
        return any(self.constrain(self.decode(ids[: len(ids) - cut])[len(heal) :])
                   for cut in range(drafted + 1))

    def _greedy_pick(self, argmax: int, logits: torch.Tensor, ids: list[int], heal: str) -> int:
        """The token greedy decoding picks after `ids` from `logits` [1, vocab] (whose argmax is
        `argmax`): the argmax among what the constraint allows there."""
        if self.constrain is None:
            return argmax
        allowed = self.constrain(self.decode(ids)[len(heal) :])
        if not allowed or argmax in allowed:
            return argmax
        return int((logits + constraint_mask(allowed, logits)).argmax(-1))


# A decoding constraint: given the text generated so far, the token ids allowed next (None: any).
Constrain = Callable[[str], Collection[int] | None]


def constraint_mask(allowed: Collection[int] | None, logits: torch.Tensor) -> torch.Tensor:
    """0 where a token is allowed, -inf elsewhere (all 0 for None, or for an empty set: a
    constraint that allows nothing lets the model go on rather than emit garbage); `logits`'
    shape [1, vocab]."""
    mask = torch.zeros_like(logits)
    if allowed:
        mask.fill_(float("-inf"))
        mask[..., list(allowed)] = 0.0
    return mask


def _logprob(logits: torch.Tensor, token: int) -> float:
    return float(torch.log_softmax(logits.float(), dim=-1)[token])


def emit(out: Emitted, token: int, logprob: float, decode, eos_ids, heal: str, stop, max_new_tokens) -> bool:
    """Append `token` to `out` if it continues the sequence; False when the sequence is finished."""
    if token in eos_ids:
        out.reason, out.done = "eos", True
        return False
    out.ids.append(token)
    out.logprob += logprob
    full = decode(out.ids)
    out.text = full[len(heal) :]
    cut = earliest_stop(out.text, stop)
    if cut is not None:
        out.text, out.reason, out.done = out.text[:cut], "stop", True
        return False
    if len(full) >= len(heal) and len(out.ids) >= max_new_tokens:
        out.reason, out.done = "length", True
        return False
    return True


def run_batch(engine: DecodeEngine, cache: KVCache, logits: torch.Tensor, rows: int, *, max_new_tokens: int,
              stop: tuple[str, ...], temperature: float, top_p: float, generator, should_stop,
              decode, eos_ids, constrain: Constrain | None = None) -> list[Emitted]:
    """Decode `rows` candidates after the prompt in `cache`'s shared row, all in one batch."""
    outs = [Emitted() for _ in range(rows)]
    cache.start_rows(rows, max_new_tokens)
    try:
        logits = logits.expand(rows, -1)  # [rows, vocab]: every candidate starts from the prompt
        while True:
            if should_stop():
                for out in outs:
                    if not out.done:
                        out.reason, out.done = "stopped_by_caller", True
                break
            picked = logits
            if constrain is not None:
                allowed = [None if out.done else constrain(out.text) for out in outs]
                # [rows, vocab]
                picked = logits + torch.cat([constraint_mask(a, logits[:1]) for a in allowed])
            tokens = sample_rows(picked, temperature, top_p, generator)  # [rows]
            logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, None])[:, 0]
            for out, token, logprob in zip(outs, tokens.tolist(), logprobs.tolist(), strict=True):
                if not out.done:
                    emit(out, token, logprob, decode, eos_ids, "", stop, max_new_tokens)
            if all(out.done for out in outs):
                break
            # Finished rows keep decoding alongside (their tokens are ignored): the batch stays whole.
            logits = engine.forward(tokens[:, None], cache, rows=True)[:, -1]
    finally:
        cache.end_rows()
    return outs
