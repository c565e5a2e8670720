"""Hands a finished agent episode to the feedback recorder, and follows an edit the server applied.

The recorder (feedback/) and the agent (agent/) do not know each other; the server joins them: the
episode with its K candidates and their checks is recorded, and when the server itself applies the
chosen edit (`apply: true`) the edited region is tracked to its keep/revert checkpoints.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lsprotocol import types

from agent.episode import AgentResult

from .features.feedback_commands import model_id_of
from .server import SquidServer

__all__ = ["record_agent_result", "track_applied_agent_edit"]

log = logging.getLogger(__name__)


def record_agent_result(ls: SquidServer, result: AgentResult, uri: str, path: Path) -> str | None:
    """The feedback episode id of `result`, or None when nothing is recorded (off, or it failed)."""
    recorder = ls.feedback
    if recorder is None:
        return None
    chosen = result.chosen_candidate
    original = chosen.changes[0].before if chosen and chosen.changes else ""
    try:
        return recorder.record_agent_episode(
            result.instruction,
            model_id_of(ls),
            getattr(ls.runtime, "adapter_id", None),
            [{"path": str(path), "uri": uri}],
            [{**c.to_json(), "logprob": c.logprob, "text": c.text} for c in result.candidates],
            result.chosen,
            result.prompt,
            uri=uri,
            steps=[s.to_json() for s in result.steps],
            extra={
                "original": original, "agent_episode": result.episode_id, "stop_reason": result.stop_reason
            },
        )
    except Exception:  # noqa: BLE001 - feedback must never cost the user the agent's answer
        log.exception("feedback: could not record an agent episode")
        return None


def track_applied_agent_edit(ls: SquidServer, episode_id: str, edit: types.WorkspaceEdit,
                             befores: dict[str, str]) -> None:
    """Follow each applied TextEdit of `edit` (whose documents read `befores[uri]` before it)."""
    if ls.feedback is None:
        return
    for uri, text_edits in (edit.changes or {}).items():
        before = befores.get(uri)
        if before is None:
            continue
        lines = before.splitlines(keepends=True)
        for text_edit in text_edits:
            start, end = text_edit.range.start, text_edit.range.end
            old_text = "".join(lines[start.line : end.line])
            opened = ls.open_document_text(uri)
            ls.feedback.track_applied_edit(
                episode_id, uri, ((start.line, start.character), (end.line, end.character)),
                text_edit.new_text, old_text, document_text=opened[0] if opened else None,
            )
