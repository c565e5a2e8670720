"""The agent's tools and their registry."""

from .code import GREP, READ_FILE, SEARCH, SYMBOLS
from .edit import EDIT
from .history import PR_HISTORY
from .lint import LINT
from .lsp import DIAGNOSTICS
from .lsp_navigation import DEFINITION, DOCUMENT_SYMBOLS, HOVER, REFERENCES, RENAME
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
    "LSP_TOOLS",
]

ALL_TOOLS = (READ_FILE, SEARCH, GREP, SYMBOLS, LINT, EDIT, RUN_TESTS, PR_HISTORY, MEMORY)
# From the workspace's language servers (agent.lsp_client): offered when they are turned on.
LSP_TOOLS = (DIAGNOSTICS, DEFINITION, REFERENCES, HOVER, DOCUMENT_SYMBOLS, RENAME)


def default_registry(language_servers: bool = False) -> ToolRegistry:
    return ToolRegistry(list(ALL_TOOLS) + (list(LSP_TOOLS) if language_servers else []))
