"""What an agent episode produced, in the shapes the CLI, the LSP command and the feedback store use.

The feedback recorder lives in another package (`feedback/`); the agent hands every finished episode
to the registered `EpisodeSink`s through `record_episode`. A sink that fails is logged and skipped.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from .overlay import FileChange

__all__ = [
    "StepRecord",
    "Candidate",
    "AgentResult",
    "EpisodeSink",
    "register_episode_sink",
    "unregister_episode_sink",
    "record_episode",
    "new_episode_id",
]

log = logging.getLogger(__name__)


def new_episode_id() -> str:
    return f"agent-{uuid.uuid4().hex[:16]}"


@dataclass
class StepRecord:
    """One tool call the episode made (`output` is what the model read back). A step whose answer
    could not be parsed is tool "invalid": `output` says why, `answer` is the model's raw answer."""

    tool: str
    args: dict[str, Any]
    ok: bool
    output: str = ""
    seconds: float = 0.0
    answer: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "args": self.args, "ok": self.ok}
        if self.answer:
            out.update(error=self.output, answer=self.answer)
        return out


@dataclass
class Candidate:
    """One sampled edit with its verification: `checks` maps a check to True, False or None (not run)."""

    diff: str
    verified: bool
    checks: dict[str, bool | None]
    text: str = ""  # the model's answer
    logprob: float | None = None
    temperature: float = 0.0
    detail: str = ""  # why a check failed
    changes: list[FileChange] = field(default_factory=list, repr=False)
    failing: int = 0  # tests still failing with it (all of them failing before any edit too)

    def to_json(self) -> dict[str, Any]:
        return {"diff": self.diff, "verified": self.verified, "checks": dict(self.checks)}


@dataclass
class AgentResult:
    """The outcome of one episode; `chosen` indexes `candidates` (None: nothing verified)."""

    episode_id: str
    instruction: str
    steps: list[StepRecord]
    candidates: list[Candidate]
    chosen: int | None
    stop_reason: str  # verified | unverified | done | step_budget | token_budget | unparsable | backend_error
    tokens: int = 0
    seconds: float = 0.0
    backend: str = ""
    prompt: str = ""  # the prompt the candidates were sampled from (for training)
    error: str | None = None

    @property
    def chosen_candidate(self) -> Candidate | None:
        return self.candidates[self.chosen] if self.chosen is not None else None

    @property
    def diff(self) -> str:
        chosen = self.chosen_candidate
        return chosen.diff if chosen else ""

    @property
    def changes(self) -> list[FileChange]:
        chosen = self.chosen_candidate
        return chosen.changes if chosen else []

    def to_json(self) -> dict[str, Any]:
        """The CLI's `--json` object (exactly these keys; `error` is None unless the backend failed)."""
        return {
            "diff": self.diff,
            "steps": [s.to_json() for s in self.steps],
            "candidates": [c.to_json() for c in self.candidates],
            "chosen": self.chosen,
            "stop_reason": self.stop_reason,
            "error": self.error,
        }


class EpisodeSink(Protocol):
    """Where finished episodes go (the feedback recorder implements this)."""

    def record_agent_episode(self, episode: AgentResult, context: dict[str, Any]) -> None: ...


_SINKS: list[EpisodeSink] = []


def register_episode_sink(sink: EpisodeSink) -> None:
    if sink not in _SINKS:
        _SINKS.append(sink)


def unregister_episode_sink(sink: EpisodeSink) -> None:
    if sink in _SINKS:
        _SINKS.remove(sink)


def record_episode(episode: AgentResult, context: dict[str, Any] | None = None) -> int:
    """Hand `episode` to every registered sink; returns how many took it."""
    taken = 0
    for sink in list(_SINKS):
        try:
            sink.record_agent_episode(episode, dict(context or {}))
            taken += 1
        except Exception:  # noqa: BLE001 - a broken sink is logged and skipped, never fatal
            log.exception("episode sink %r failed; skipped", sink)
    return taken
