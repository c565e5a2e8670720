"""The decision layer: prompt building, completion, and (later) the tool-using agent loop."""

from .completion import Completion, CompletionRequest, complete, cursor_context, cut_at_boundary

__all__ = ["Completion", "CompletionRequest", "complete", "cut_at_boundary", "cursor_context"]
