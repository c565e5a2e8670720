"""Hands a finished agent episode to the feedback recorder, follows its applied edit, and lets the
agent's memory learn from what the user did with it.

The recorder (feedback/) and the agent (agent/) do not know each other; the server joins them: the
episode with its K candidates and their checks is recorded; the chosen edit is tracked to its
keep/revert checkpoints once applied, by the server (`apply: true`) or by the client, which then
says so with `squidcode.agent.applied`; and each tracked agent edit's outcome feeds the memory's
write rules: a revert or a rewrite becomes a note (a rewrite seen twice, a correction note), an
edit kept to its last checkpoint forgets the notes it contradicts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lsprotocol import types

from agent.episode import AgentResult
from agent.session import open_memory
from feedback.tracking import Observation

from .features.feedback_commands import model_id_of
from .server import SquidServer

__all__ = ["agent_edit_applied", "record_agent_result", "remember_returned_edit", "track_applied_agent_edit"]

# Edits returned to clients, waiting for `squidcode.agent.applied`: episode id -> (edit, texts before).
_RETURNED_LIMIT = 32

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
                             befores: dict[str, str], *, root: Path | None = None,
                             rels: dict[str, str] | None = None) -> None:
    """Follow each applied TextEdit of `edit` (whose documents read `befores[uri]` before it); with
    the workspace `root` (and each uri's path in it), its outcomes also teach the agent's memory."""
    if ls.feedback is None:
        return
    if root is not None:
        _watch_outcomes(ls)
        ls.agent_memory_regions[episode_id] = (root, rels or {}, set())
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


def remember_returned_edit(ls: SquidServer, episode_id: str, edit: types.WorkspaceEdit,
                           befores: dict[str, str], root: Path, rels: dict[str, str]) -> None:
    """Keep the edit returned for `episode_id` until the client reports it applied (or it ages out)."""
    returned = ls.agent_returned_edits
    returned[episode_id] = (edit, befores, root, rels)
    while len(returned) > _RETURNED_LIMIT:
        returned.pop(next(iter(returned)))


def agent_edit_applied(ls: SquidServer, episode_id: str) -> bool:
    """The client applied the edit returned for `episode_id`: follow it. False when unknown."""
    entry = ls.agent_returned_edits.pop(episode_id, None)
    if entry is None:
        return False
    edit, befores, root, rels = entry
    track_applied_agent_edit(ls, episode_id, edit, befores, root=root, rels=rels)
    return True


def _learn_from_outcome(ls: SquidServer, observation: Observation) -> None:
    """The memory's write rules, applied to one checkpoint of a tracked agent edit."""
    meta = ls.agent_memory_regions.get(observation.episode_id)
    if meta is None:
        return
    root, rels, acted = meta
    if observation.final and observation.region_id not in acted and observation.status in (
        "unchanged", "mostly_unchanged"
    ):
        kind = "kept"
    elif observation.region_id not in acted and observation.status in ("reverted", "removed", "modified"):
        kind = observation.status
    else:
        kind = None
    if kind is not None:
        acted.add(observation.region_id)
        memory = open_memory(ls.config, root)
        if memory is not None:
            rel = rels.get(observation.uri, observation.uri)
            try:
                if kind == "kept":
                    memory.observe_kept_edit(observation.new_text)
                elif kind == "modified":
                    memory.observe_reverted_edit(rel, observation.old_text, observation.new_text,
                                                 observation.kept_text)
                    memory.observe_correction(observation.new_text, observation.kept_text)
                else:
                    memory.observe_reverted_edit(rel, observation.old_text, observation.new_text, None)
                log.info("memory: learned from a %s agent edit in %s", kind, rel)
            finally:
                memory.close()
    if observation.final:
        acted.discard(observation.region_id)


def _watch_outcomes(ls: SquidServer) -> None:
    recorder = ls.feedback
    if recorder is not None and not getattr(recorder, "_agent_memory_listener", False):
        recorder.outcome_listeners.append(lambda observation: _learn_from_outcome(ls, observation))
        recorder._agent_memory_listener = True
