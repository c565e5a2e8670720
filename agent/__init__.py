"""The decision layer: completion, and the tool-using agent (loop, tools, backends, best-of-K, memory)."""

from .completion import Completion, CompletionRequest, complete, cursor_context, cut_at_boundary
from .episode import AgentResult, Candidate, EpisodeSink, StepRecord, record_episode, register_episode_sink
from .loop import AgentLoop, AgentRequest, run_agent

__all__ = [
    "Completion",
    "CompletionRequest",
    "complete",
    "cut_at_boundary",
    "cursor_context",
    "AgentLoop",
    "AgentRequest",
    "AgentResult",
    "Candidate",
    "EpisodeSink",
    "StepRecord",
    "record_episode",
    "register_episode_sink",
    "run_agent",
]
