"""One module per LSP feature; each exposes `register(server)`."""

from . import (
    agent_command,
    code_actions,
    completion,
    configuration,
    index_events,
    inline_completion,
    lifecycle,
    workspace_symbol,
)

__all__ = ["register_all"]

FEATURE_MODULES = (lifecycle, configuration, inline_completion, completion, workspace_symbol, index_events)
FEATURE_MODULES += (agent_command, code_actions)


def register_all(server) -> None:
    for module in FEATURE_MODULES:
        module.register(server)
