"""The feedback store as the trainer's EpisodeSource: recorded episodes become training examples.

A completion episode is trained on the prompt it was served with (`context.prompt_record.ServedPrompt`,
passed through as it was recorded: the same token ids, the same settings, the same Squid reference
documents, their texts from the store's table of them), continued without a chat template, its
samples cut where inline completions are cut (the trailing indentation of the cursor's line moves
into the answers, as the completion path regenerates it); an agent episode keeps its
instruction. The outcome at the last checkpoint supplies the reference texts a
reward compares fresh samples with: the region's final text when the user kept or modified it,
the model's output when the user reverted it. Episodes never accepted, or not yet judged, teach
nothing and are left out (`example_from_episode` skips an episode without reference texts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from context.prompt_record import ServedPrompt
from feedback.store import SERVED_PROMPT_KEY

__all__ = [
    "FeedbackStoreSource",
    "COMPLETION_INSTRUCTION",
    "NEXT_EDIT_SOURCE",
    "episode_as_example_fields",
    "episode_group",
    "next_edit_example_fields",
    "served_prompt_of",
]

NEXT_EDIT_SOURCE = "next_edit"  # `verification["source"]` of an example made of a model next edit
COMPLETION_INSTRUCTION = "Continue this code from where it stops. Answer with the code only."
_KEPT = ("unchanged", "mostly_unchanged", "modified")


def episode_as_example_fields(record: Any) -> dict[str, Any] | None:
    """The fields `example_from_episode` reads, from one `feedback.store.EpisodeOutcomes`."""
    episode, finals = record.episode, record.final_outcomes()
    if not record.accepted or not finals:
        return None
    last = finals[-1]
    extra = episode.get("extra") or {}
    if episode["kind"] == "next_edit":
        # One the deterministic path offered (a rename or repeat carried on) has no model answer to
        # learn from; the model path's teaches its rewrite of the region.
        return next_edit_example_fields(episode, last) if extra.get("next_edit_kind") == "model" else None
    if episode["kind"] == "completion" and extra.get("served_by", "local") != "local":
        # A completion server's model answered (`completion.backend`): its prompt is that model's
        # (a FIM template, a window measured in characters, no token ids), not one the local model
        # was served, and the answer is not the local model's to reinforce or discourage.
        return None
    if episode["kind"] == "completion":
        instruction = f"{COMPLETION_INSTRUCTION}\n\n```\n{episode.get('prompt_text') or ''}\n```"
    else:
        instruction = episode.get("instruction") or ""
    status = last["status"]
    prompt_text, lead, served = None, "", None
    if episode["kind"] == "completion":
        served = served_prompt_of(episode).with_texts(getattr(record, "reference_texts", None) or {})
        prompt_text = served.text.rstrip(" \t")
        lead = served.text[len(prompt_text):]
    kept = last.get("kept_text") if status in _KEPT else None
    output = episode.get("output")
    return {
        "id": episode["id"],
        "created_at": episode["ts"],
        "instruction": instruction,
        "original": extra.get("original", ""),
        "output": output,
        "outcome": "reverted" if status == "reverted" else "kept" if status in _KEPT else status,
        "kept_text": lead + kept if kept is not None else None,
        "reverted_text": lead + output if status == "reverted" and output else None,
        "candidates": tuple(c.get("diff", "") for c in episode.get("candidates") or ()),
        "language": episode.get("language") or "python",
        "prompt_text": prompt_text,
        "prompt_lead": lead,
        "served": served,
        "group": episode_group(episode.get("uri") or "", prompt_text),
    }


def next_edit_example_fields(episode: dict[str, Any], last: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of a next edit the model path suggested (`context.next_edit_model`): prompted as
    the server prompted it (`chat_prompt`), the region it rewrote as the text to change
    (`original`), the region with the developer's kept text in place of the suggestion as what to
    write (`kept_text`), and the model's rewrite as what not to write where they reverted it. None
    where the episode lacks them (recorded before they were, or stored without code)."""
    extra = episode.get("extra") or {}
    parts = [extra.get(key) for key in ("region_before", "replaces", "region_after", "rewrite")]
    prompt = episode.get("prompt_text")
    if not prompt or not all(isinstance(part, str) for part in parts):
        return None
    before, replaced, after, rewrite = parts
    region = before + replaced + after
    status = last["status"]
    kept = last.get("kept_text") if status in _KEPT else None
    if kept is None and status != "reverted":
        return None
    return {
        "id": episode["id"],
        "created_at": episode["ts"],
        "instruction": "",
        "chat_prompt": prompt,
        "original": region,
        "output": rewrite,
        "outcome": "reverted" if status == "reverted" else "kept",
        "kept_text": before + kept + after if kept is not None else None,
        "reverted_text": rewrite if status == "reverted" else None,
        "language": episode.get("language") or "python",
        "verification": {"source": NEXT_EDIT_SOURCE, "max_tokens": len(region) // 2 + 24},
        "group": episode.get("uri") or "",
    }


def served_prompt_of(episode: dict[str, Any]) -> ServedPrompt:
    """The prompt a completion episode was served with, as the recorder stored it.

    Fallback for an episode recorded before prompts were (no `extra.served_prompt`): a record of its
    `prompt_text` (the last `prefix_tokens * 6` characters before the cursor) without token ids, with
    the settings its `extra` names, and for the rest `CompletionConfig`'s defaults, except that
    `finish_tokens` is 0 where it is not named (recorded before completions were finished) and
    `max_tokens` unknown (the trainer's own budget). The trainer tokenizes that text by the serving
    rule: the served ids, unless the served window reached further back than the recorded text.
    """
    extra = episode.get("extra") or {}
    text = episode.get("prompt_text") or ""
    recorded = extra.get(SERVED_PROMPT_KEY)
    if recorded is not None:
        return ServedPrompt.from_json(recorded, text=text)
    named = {key: int(extra[key]) for key in ("prefix_tokens", "max_lines") if extra.get(key)}
    return ServedPrompt.from_text(text, finish_tokens=int(extra.get("finish_tokens") or 0), max_tokens=None,
                                  **named)


_DEFINITION = re.compile(
    r"^[ \t]*(?:async[ \t]+)?(?:def|class|function|fn|func)[ \t]+([A-Za-z_$][\w$]*)", re.M
)


def episode_group(uri: str, prompt_text: str | None) -> str:
    """What an episode was about, for the held-out split: its file, and for a completion the last
    definition opened before the cursor (the function being written)."""
    if not prompt_text:
        return uri
    names = _DEFINITION.findall(prompt_text[-20_000:])
    return f"{uri}#{names[-1]}" if names else uri


class FeedbackStoreSource:
    """Reads the local feedback store (read-only) for `run_round(..., source=...)`."""

    def __init__(self, db_path: Path | str | None = None):
        self.db_path = db_path

    def episodes_with_outcomes(self, since: float | None, until: float | None) -> Iterator[dict[str, Any]]:
        from feedback import episodes_with_outcomes

        if self.db_path is not None and not Path(self.db_path).exists():
            return
        for record in episodes_with_outcomes(self.db_path, since, until):
            fields = episode_as_example_fields(record)
            if fields is not None:
                yield fields
