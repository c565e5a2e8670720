"""`memory`: the model recalls notes about the project, or stores one (see `agent.memory`)."""

from __future__ import annotations

from ..errors import ToolError
from .registry import Tool, ToolContext, ToolResult

__all__ = ["MEMORY"]


def memory(ctx: ToolContext, args: dict) -> ToolResult:
    if ctx.memory is None:
        raise ToolError("memory is turned off (agent.memory = false)")
    action = args["action"]
    if action == "recall":
        notes = ctx.memory.recall(args.get("query", ""))
        if not notes:
            return ToolResult(True, "no notes")
        return ToolResult(True, "\n".join(f"- [{n.kind}] {n.body}" for n in notes), {"notes": len(notes)})
    if action == "store":
        subject, body = args.get("subject", "").strip(), args.get("body", "").strip()
        if not subject or not body:
            raise ToolError("store needs a subject and a body")
        note_id = ctx.memory.remember(f"agent:{subject[:80]}", body[:500], "agent")
        return ToolResult(True, f"stored note {note_id}", {"id": note_id})
    raise ToolError(f"unknown action {action!r}: use recall or store")


MEMORY = Tool(
    "memory",
    "Recall notes about this project (conventions, past corrections) or store one.",
    {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["recall", "store"]},
            "query": {"type": "string"},
            "subject": {"type": "string"},
            "body": {"type": "string"},
        },
        "required": ["action"],
    },
    memory,
)
