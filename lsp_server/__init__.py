"""The squidcode language server (pygls): LSP in, core calls out."""

import os as _os
import sys as _sys

# `python -m lsp_server serve` puts the current folder first on sys.path, and an editor starts it in
# the workspace: a workspace file named like a module imported later (`json.py`, `types.py`) would
# run in its place, code from a repository cloned from anywhere. While `-m` imports this package
# (sys.argv[0] is "-m" then), that folder is dropped unless squidcode itself lives there.
if (_sys.argv[:1] == ["-m"] and _sys.path
        and _os.path.abspath(_sys.path[0] or _os.curdir) == _os.path.abspath(_os.getcwd())
        and _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))) != _os.path.abspath(_os.getcwd())):
    del _sys.path[0]

from importlib.metadata import PackageNotFoundError, version  # noqa: E402

from .server import SquidServer  # noqa: E402

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
