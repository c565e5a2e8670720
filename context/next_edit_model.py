"""Next-edit suggestions, the model path (in the shape of Zed's Zeta): the model rewrites the region
around the cursor after reading the edits just made.

The prompt holds the document's recent edits (newest last: what was replaced by what, the newest
with its line) and the editable region, `REGION_LINES` lines each side of the cursor's line, with a
cursor marker; the model writes the region again as it will be after the developer's next edit.
The suggestion is the one replacement that turns the region into that rewrite (common prefix and
suffix kept). Nothing is offered when the rewrite equals the region, is not a near copy of it (a
model that wandered off: more than `MAX_CHANGE` of it differs), or undoes one of the recent edits.

Related code goes before the edits, as completions get it: the definitions of the names around the
cursor (the same selection as a completion's references, `context.squid.references`), each a
Squid-composed cache that follows the prompt's head (its system turn and the start of its user
turn), so that only the edits and the region are prefilled. The recorded prompt
(`ModelAnswer.prompt`, what the trainer reads) holds those documents as text in the same place.

The deterministic path (`context.next_edit.predict`) answers first; this one runs only when it has
nothing (`completion.next_edit_model`).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Sequence

from .next_edit import Edit, ModelAnswer, Prediction, difference, undone

__all__ = ["ANSWER_OPENING", "ANSWER_STOP", "CURSOR", "REGION_LINES", "answer_of", "model_prompt",
           "predict_with_model", "prompt_parts", "reference_block", "rewrite_reward",
           "suggestion_from_rewrite"]

log = logging.getLogger(__name__)

CURSOR = "<|user_cursor_is_here|>"
REGION_LINES = 4
MAX_CHANGE = 0.4  # at most this share of the region's characters may change
MAX_EDITS = 4  # recent edits shown to the model
ANSWER_OPENING, ANSWER_STOP = "```\n", "```"  # the prompt ends with the one; the rewrite stops at the other
_SYSTEM = ("You predict the next edit a developer makes in a file, from the edits they just made. "
           "Answer with the region rewritten as it will be after that edit, and nothing else.")


def region_bounds(text: str, cursor: int, lines: int = REGION_LINES) -> tuple[int, int]:
    """[start, end) of the cursor's line and `lines` lines each side of it (whole lines)."""
    start = text.rfind("\n", 0, cursor) + 1
    for _ in range(lines):
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    end = cursor
    for _ in range(lines + 1):
        if end >= len(text):
            break
        found = text.find("\n", end)
        end = len(text) if found < 0 else found + 1
    return start, end


def _widened(region: str, rewrite: str, s: int, e: int) -> tuple[int, int, str]:
    """The replacement grown to whole words on both sides (`sub` inserted before `total` is the
    word `total` becoming `subtotal`), so that an undo of a rename reads as one."""
    def word(char: str) -> bool:
        return char.isalnum() or char == "_"
    while s > 0 and word(region[s - 1]):
        s -= 1
    while e < len(region) and word(region[e]):
        e += 1
    return s, e, rewrite[s : len(rewrite) - (len(region) - e)]


def _describe(edit: Edit) -> str:
    if edit.before:  # the newest edit keeps its document: show its whole line
        line_start = edit.before.rfind("\n", 0, edit.start) + 1
        line_end = edit.before.find("\n", edit.start + len(edit.old))
        line_end = len(edit.before) if line_end < 0 else line_end
        old_line = edit.before[line_start:line_end]
        at = edit.start - line_start
        new_line = old_line[:at] + edit.new + old_line[at + len(edit.old):]
        if "\n" not in edit.old + edit.new:
            return f"-{old_line}\n+{new_line}"
    return f"-{edit.old}\n+{edit.new}"


def reference_block(text: str) -> str:
    """One related document as the prompt shows it, before the edits (a reference document names
    its file in its first line: `# path:line`)."""
    return f"Related code:\n```\n{text.rstrip()}\n```\n\n"


def model_prompt(edits: Sequence[Edit], text: str, cursor: int,
                 documents: str = "") -> tuple[list[dict], int, int]:
    """(chat messages, region start, region end) for a rewrite of the region around `cursor`;
    `documents`: related code (`reference_block`s) that opens the user turn."""
    start, end = region_bounds(text, cursor)
    region = text[start:cursor] + CURSOR + text[cursor:end]
    shown = "\n\n".join(f"Edit {i + 1}:\n{_describe(e)}" for i, e in enumerate(edits[-MAX_EDITS:]))
    user = (f"{documents}The developer just made these edits, in order:\n\n{shown}\n\n"
            f"The region around the cursor:\n```\n{region}```\n"
            "Rewrite the region as it will be after the developer's next edit.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}], start, end


# Stands in for the related documents while the prompt is rendered, to find where they go.
_DOCUMENTS_MARK = "\x00squid-documents\x00"


def prompt_parts(tokenizer, edits: Sequence[Edit], text: str,
                 cursor: int) -> tuple[str, str, int, int] | None:
    """(head, tail, region start, region end): the prompt cut where related documents go, the head
    the same for every request (the documents' caches follow it), the tail ending where the answer
    begins; None when the chat template does not keep the user turn's text in one piece."""
    messages, start, end = model_prompt(edits, text, cursor, _DOCUMENTS_MARK)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head, mark, tail = rendered.partition(_DOCUMENTS_MARK)
    return (head, tail + ANSWER_OPENING, start, end) if mark else None


def suggestion_from_rewrite(edits: Sequence[Edit], text: str, start: int, end: int,
                            rewrite: str) -> Prediction | None:
    """The replacement turning text[start:end] into `rewrite`, or None (see the module docstring)."""
    region = text[start:end]
    rewrite = rewrite.replace(CURSOR, "")
    if region.endswith("\n") and not rewrite.endswith("\n"):
        rewrite += "\n"
    if not rewrite.strip() or rewrite == region:
        return None
    if difflib.SequenceMatcher(None, region, rewrite, autojunk=False).ratio() < 1 - MAX_CHANGE:
        return None
    s, e, new = _widened(region, rewrite, *difference(region, rewrite)[:2])
    old = region[s:e]
    after = text[: start + s] + new + text[start + e:]
    if undone(edits, old, new) or (edits and after == edits[-1].before) or not (old or new).strip():
        return None
    return Prediction(start + s, start + e, new, "model")


# compose(head, text before the cursor) -> (the composed documents' context, their text as
# `reference_block`s), or None: related code for the model path (`lsp_server.squid_context`).
ComposeReferences = Callable[[str, str], "tuple[object, str] | None"]


def predict_with_model(runtime, edits: Sequence[Edit], text: str, cursor: int,
                       should_stop=None, references: ComposeReferences | None = None) -> Prediction | None:
    """The model path's suggestion at `cursor` of `text` after `edits` (a document's
    `EditHistory.edits` and `text`, taken together), or None. `references`: related documents
    composed from Squid caches in front of the prompt (none, or failing: the prompt alone)."""
    if not edits:
        return None
    parts = prompt_parts(runtime.tokenizer, edits, text, cursor) if references is not None else None
    composed = None
    if parts is not None:
        head, tail, start, end = parts
        try:
            composed = references(head, text[:cursor])
        except Exception as exc:  # noqa: BLE001 - related code only helps; the prompt alone still answers
            log.warning("next edit: related documents unavailable (%s); predicting without them", exc)
    if composed is not None:
        context, documents = composed
        prompt, served, past = tail, head + documents + tail, context.new_cache()
    else:
        messages, start, end = model_prompt(edits, text, cursor)
        prompt = runtime.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt += ANSWER_OPENING
        served, past = prompt, None
    region_tokens = len(runtime.encode(text[start:end]))
    result = runtime.generate(prompt, max_new_tokens=region_tokens + 24, stop=(ANSWER_STOP,),
                              temperature=0.0, should_stop=should_stop, past=past)
    if result.stop_reason not in ("stop", "eos"):
        return None  # ran out before the region's end, or cancelled: not a whole rewrite
    found = suggestion_from_rewrite(edits, text, start, end, result.text)
    return found and dataclasses.replace(found, answer=ModelAnswer(served, start, end, result.text))


def answer_of(generated: str) -> tuple[str, int | None]:
    """(the rewrite, the characters of `generated` it used) of a continuation of the model path's
    prompt, cut where `predict_with_model` stops it (the closing fence); None used: it never closed."""
    at = generated.find(ANSWER_STOP)
    return (generated, None) if at < 0 else (generated[:at], at + len(ANSWER_STOP))


def rewrite_reward(rewrite: str, region: str, kept: str | None, reverted: str | None) -> float:
    """What a rewrite of `region` earns against what the developer did with the suggestion made of
    one, in [-1, 1]: how far it moves the region towards the region as they kept it (`kept`: 1 for
    that text, 0 for the region written back unchanged, below 0 for a change away from it), less how
    far it moves it towards a rewrite they reverted (`reverted`). Moves, not plain similarity: every
    rewrite of a region is most of the region, so plain similarity would pay any change."""
    rewrite = rewrite.replace(CURSOR, "")
    if region.endswith("\n") and not rewrite.endswith("\n"):
        rewrite += "\n"

    def towards(target: str) -> float:
        here = difflib.SequenceMatcher(None, region, target, autojunk=False).ratio()
        there = difflib.SequenceMatcher(None, rewrite, target, autojunk=False).ratio()
        return (there - here) / (1.0 - here) if here < 1.0 else 0.0

    total = towards(kept) if kept is not None else 0.0
    if reverted is not None:
        total -= max(0.0, towards(reverted.replace(CURSOR, "")))
    return max(-1.0, min(1.0, total))
