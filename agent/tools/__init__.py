"""The agent's tools and their registry."""

from .code import GREP, READ_FILE, SEARCH, SYMBOLS
from .edit import EDIT
from .history import PR_HISTORY
from .lint import LINT
from .memory_tool import MEMORY
from .registry import Tool, ToolContext, ToolRegistry, ToolResult, validate_args
from .tests import RUN_TESTS

__all__ = [
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "validate_args",
    "default_registry",
    "ALL_TOOLS",
]

ALL_TOOLS = (READ_FILE, SEARCH, GREP, SYMBOLS, LINT, EDIT, RUN_TESTS, PR_HISTORY, MEMORY)


def default_registry() -> ToolRegistry:
    return ToolRegistry(list(ALL_TOOLS))
