"""One module per LSP feature; each exposes `register(server)`."""

from . import (
    adapters,
    agent_command,
    code_actions,
    completion,
    configuration,
    edit_tracking,
    feedback_commands,
    index_events,
    inline_completion,
    lifecycle,
    next_edit,
    status,
    workspace_symbol,
)

__all__ = ["register_all"]

FEATURE_MODULES = (
    lifecycle,
    configuration,
    inline_completion,
    completion,
    workspace_symbol,
    index_events,
    feedback_commands,
    edit_tracking,
    status,
    adapters,
    agent_command,
    code_actions,
    next_edit,
)


def register_all(server) -> None:
    for module in FEATURE_MODULES:
        module.register(server)
