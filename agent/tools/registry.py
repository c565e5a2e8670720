"""Tools the agent's model may call: each has a name, a JSON schema for its arguments, and a function.

A registry maps names to tools. `ToolRegistry.call` never raises for the model's mistakes: unknown
tools, arguments that do not match the schema, and errors inside a tool all come back as a failed
`ToolResult` whose text tells the model what went wrong (a failing tool is reported, never fatal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from context.errors import SquidcodeError

__all__ = ["Tool", "ToolResult", "ToolRegistry", "ToolContext", "validate_args"]

log = logging.getLogger(__name__)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclass(frozen=True)
class ToolResult:
    """What a tool answered: `output` is the text the model reads next."""

    ok: bool
    output: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ToolContext:
    """What tools work on: the sandboxed workspace, the overlay, and optional services."""

    workspace: Any  # agent.sandbox.Workspace
    overlay: Any  # agent.overlay.Overlay
    config: Any  # context.config.AgentConfig
    store: Any = None  # context.index.store.IndexStore, when the workspace is indexed
    memory: Any = None  # agent.memory.MemoryStore
    lint_cache: dict = field(default_factory=dict)
    # agent.lsp_client.LanguageServers; None = the process's shared pool when the config enables them
    language_servers: Any = None
    # (query, k) -> SearchHits: the server's search (its semantic ranker fused in once loaded) or
    # `context.index.semantic.store_searcher`; None = lexical search of `store`
    searcher: Any = None


ToolFunction = Callable[[ToolContext, dict[str, Any]], ToolResult]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]  # a JSON schema of type "object"
    run: ToolFunction

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function description of this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def validate_args(schema: Mapping[str, Any], args: Any) -> str | None:
    """Why `args` do not fit the object `schema` (required keys, property types), or None."""
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [k for k in args if k not in props]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)} (expected: {', '.join(props) or 'none'})"
    for key, value in args.items():
        wanted = props[key].get("type")
        kinds = _JSON_TYPES.get(wanted, (object,))
        if isinstance(value, bool) and wanted in ("integer", "number"):
            return f"argument {key!r} must be {wanted}, got a boolean"
        if not isinstance(value, kinds):
            return f"argument {key!r} must be {wanted}, got {type(value).__name__}"
    return None


class ToolRegistry:
    """Named tools; `call` turns every failure into a result the model can read."""

    def __init__(self, tools: list[Tool] | None = None):
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self._tools.values()]

    def call(self, context: ToolContext, name: Any, args: Any) -> ToolResult:
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return ToolResult(False, f"unknown tool {name!r}; the tools are: {', '.join(self._tools)}")
        problem = validate_args(tool.parameters, args)
        if problem is not None:
            return ToolResult(False, f"{name}: {problem}")
        try:
            return tool.run(context, args)
        except SquidcodeError as exc:
            return ToolResult(False, f"{name}: {exc}")
        except (OSError, ValueError, RuntimeError) as exc:
            # A bug or an environment problem inside one tool must not end the episode.
            log.warning("tool %s failed: %s", name, exc, exc_info=True)
            return ToolResult(False, f"{name} failed: {type(exc).__name__}: {exc}")
