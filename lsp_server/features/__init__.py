"""One module per LSP feature; each exposes `register(server)`."""

from . import completion, configuration, inline_completion, lifecycle

__all__ = ["register_all"]

FEATURE_MODULES = (lifecycle, configuration, inline_completion, completion)


def register_all(server) -> None:
    for module in FEATURE_MODULES:
        module.register(server)
