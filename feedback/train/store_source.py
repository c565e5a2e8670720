"""The feedback store as the trainer's EpisodeSource: recorded episodes become training examples.

A completion episode is trained as the server completes: the raw text before the cursor, continued
without a chat template, its samples cut where inline completions are cut (the trailing
indentation of the cursor's line moves into the answers, as the completion path regenerates it);
an agent episode keeps its instruction. The outcome at the last checkpoint supplies the reference texts a
reward compares fresh samples with: the region's final text when the user kept or modified it,
the model's output when the user reverted it. Episodes never accepted, or not yet judged, teach
nothing and are left out (`example_from_episode` skips an episode without reference texts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["FeedbackStoreSource", "COMPLETION_INSTRUCTION", "episode_as_example_fields", "episode_group"]

COMPLETION_INSTRUCTION = "Continue this code from where it stops. Answer with the code only."
_KEPT = ("unchanged", "mostly_unchanged", "modified")


def episode_as_example_fields(record: Any) -> dict[str, Any] | None:
    """The fields `example_from_episode` reads, from one `feedback.store.EpisodeOutcomes`."""
    episode, finals = record.episode, record.final_outcomes()
    if not record.accepted or not finals:
        return None
    last = finals[-1]
    extra = episode.get("extra") or {}
    if episode["kind"] == "completion":
        instruction = f"{COMPLETION_INSTRUCTION}\n\n```\n{episode.get('prompt_text') or ''}\n```"
    else:
        instruction = episode.get("instruction") or ""
    status = last["status"]
    prompt_text, lead, max_lines, budget, finish = None, "", 8, 1024, 0
    if episode["kind"] == "completion":
        prefix = episode.get("prompt_text") or ""
        prompt_text = prefix.rstrip(" \t")
        lead = prefix[len(prompt_text):]
        max_lines = int(extra.get("max_lines") or 8)
        budget = int(extra.get("prefix_tokens") or 1024)
        finish = int(extra.get("finish_tokens") or 0)
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
        "max_lines": max_lines,
        "prompt_tokens": budget,
        "finish_tokens": finish,
        "group": episode_group(episode.get("uri") or "", prompt_text),
    }


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
