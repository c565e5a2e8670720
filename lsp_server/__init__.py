"""The squidcode language server (pygls): LSP in, core calls out."""

from importlib.metadata import PackageNotFoundError, version

from .server import SquidServer

try:
    __version__ = version("squidcode")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["SquidServer", "create_server", "__version__"]


def create_server() -> SquidServer:
    from .features import register_all

    server = SquidServer(__version__)
    register_all(server)
    return server
