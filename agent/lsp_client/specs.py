"""Which language servers the agent may start: a built-in table for Python, a mapping for the rest.

Python gets a type checker and ruff's server. The type checker is `agent.type_checker`: "ty" (`ty
server`, Rust, from PyPI), "basedpyright" (from PyPI with its own Node.js), or "auto", ty when it is
installed and basedpyright otherwise: on a 2,000-line file ty answers diagnostics of an edit in about
a tenth of basedpyright's time (docs/benchmarks.md).
Other languages come from configuration, one command per language, e.g.
`{"go": "gopls", "rust": "rust-analyzer", "typescript": "typescript-language-server --stdio"}`, or
as the configuration file writes it, a list of "language=command" strings
(`language_server_commands = ["go=gopls", "typescript=typescript-language-server --stdio"]`).
A command is looked up in the interpreter's own bin folder first (a virtual environment's tools are
found without activating it), then on PATH; `find_servers` says which are there, for `doctor`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ServerSpec",
    "PYTHON_SERVERS",
    "TY",
    "TYPE_CHECKERS",
    "python_servers",
    "KNOWN_COMMANDS",
    "ServerFound",
    "server_specs",
    "find_command",
    "find_servers",
    "parse_server_commands",
]

_LANGUAGE_SUFFIXES = {
    "python": (".py", ".pyi"),
    "go": (".go",),
    "rust": (".rs",),
    "typescript": (".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs"),
    "javascript": (".js", ".jsx", ".mjs", ".cjs"),
    "lua": (".lua",),
    "c": (".c", ".h"),
    "cpp": (".cpp", ".hpp", ".cc", ".hh", ".h"),
    "java": (".java",),
}


@dataclass(frozen=True)
class ServerSpec:
    """How to start one language server and what it is for.

    `settings` answers the server's `workspace/configuration` requests: a section such as
    "basedpyright.analysis" is looked up key by key (anything not there is answered with null).
    `checks_types` marks the servers whose errors the edit gate counts as type errors
    (configurable); ruff's server is not one: the gate already runs ruff itself.
    `pull_diagnostics`: True for a server known to answer `textDocument/diagnostic` although it
    registers it only after `initialized` (basedpyright); None: pull when the server offers it.
    `env`: variables the server is started with (contained or not), e.g. the Python environment.
    """

    name: str
    argv: tuple[str, ...]
    language: str
    suffixes: tuple[str, ...]
    checks_types: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    pull_diagnostics: bool | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def handles(self, path: Path) -> bool:
        return path.suffix.lower() in self.suffixes


# The type checkers resolve imports in the environment the workspace's tests run in (squidcode's own
# interpreter, `agent/tools/tests.py`), so an edit importing an installed package is no new error:
# basedpyright is told the interpreter; ty reads a virtual environment from VIRTUAL_ENV (it refuses a
# prefix without pyvenv.cfg, so outside a venv it finds one itself: `.venv`, or python on PATH).
_PYTHON_ENV = {"VIRTUAL_ENV": sys.prefix} if sys.prefix != sys.base_prefix else {}

# "standard" rather than basedpyright's own default ("recommended", which reports untyped code as
# errors): the gate counts new errors, and a model's plain untyped function is not one. A project's
# own [tool.basedpyright] or pyrightconfig.json still wins over these settings.
_BASEDPYRIGHT_SETTINGS = {
    "basedpyright": {
        "analysis": {
            "typeCheckingMode": "standard",
            "diagnosticMode": "openFilesOnly",
            "autoSearchPaths": True,
            "useLibraryCodeForTypes": True,
        },
        "disableOrganizeImports": True,
    },
    "python": {"pythonPath": sys.executable},
}

BASEDPYRIGHT = ServerSpec(
    "basedpyright",
    ("basedpyright-langserver", "--stdio"),
    "python",
    _LANGUAGE_SUFFIXES["python"],
    checks_types=True,
    settings=_BASEDPYRIGHT_SETTINGS,
    pull_diagnostics=True,
)
# ty registers pull diagnostics only after `initialized` (as basedpyright does), and publishes none.
TY = ServerSpec("ty", ("ty", "server"), "python", _LANGUAGE_SUFFIXES["python"], checks_types=True,
                pull_diagnostics=True, env=_PYTHON_ENV)
RUFF = ServerSpec("ruff", ("ruff", "server"), "python", _LANGUAGE_SUFFIXES["python"])
TYPE_CHECKERS = {"ty": TY, "basedpyright": BASEDPYRIGHT}
# basedpyright's pair, the servers every earlier measurement used.
PYTHON_SERVERS = (BASEDPYRIGHT, RUFF)


def python_servers(type_checker: str = "auto") -> tuple[ServerSpec, ServerSpec]:
    """(the type checker, ruff's server). "auto": ty when its command is found, else basedpyright."""
    if type_checker == "auto":
        type_checker = "ty" if find_command(TY.argv[0]) else "basedpyright"
    if type_checker not in TYPE_CHECKERS:
        raise ValueError(f"unknown type checker {type_checker!r}; one of auto, {', '.join(TYPE_CHECKERS)}")
    return TYPE_CHECKERS[type_checker], RUFF

# Suggested commands for other languages: what `doctor` looks for when none are configured.
KNOWN_COMMANDS = {
    "go": "gopls",
    "rust": "rust-analyzer",
    "typescript": "typescript-language-server --stdio",
}


def parse_server_commands(value: Any) -> tuple[dict[str, str | Sequence[str]], list[str]]:
    """(language -> command, problems) from a mapping or from "language=command" strings; a
    malformed entry is left out and named in the problems."""
    if not value:
        return {}, []
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}, []
    commands: dict[str, str | Sequence[str]] = {}
    problems = []
    for entry in value:
        language, sep, command = str(entry).partition("=")
        if not sep or not language.strip() or not command.strip():
            problems.append(f"language server command {entry!r} is not 'language=command'; ignored")
            continue
        commands[language.strip().lower()] = command.strip()
    return commands, problems


def _spec_from_command(language: str, command: str | Sequence[str]) -> ServerSpec:
    argv = tuple(shlex.split(command) if isinstance(command, str) else command)
    if not argv:
        raise ValueError(f"the language server command for {language!r} is empty")
    suffixes = _LANGUAGE_SUFFIXES.get(language, (f".{language}",))
    # A configured server is trusted to report real errors: its errors count as type errors do.
    return ServerSpec(Path(argv[0]).name, argv, language, suffixes, checks_types=True)


def server_specs(
    commands: Mapping[str, str | Sequence[str]] | None = None, python: bool = True,
    type_checker: str = "auto",
) -> list[ServerSpec]:
    """The built-in Python servers (unless `python` is False or "python" is configured) and one
    server per configured language."""
    commands = dict(commands or {})
    specs = list(python_servers(type_checker)) if python and "python" not in commands else []
    specs.extend(_spec_from_command(language, command) for language, command in commands.items())
    return specs


def find_command(program: str) -> str | None:
    """The full path of `program`: the interpreter's bin folder first, then PATH."""
    search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return shutil.which(program, path=search)


@dataclass(frozen=True)
class ServerFound:
    """Whether one server's command is installed here."""

    name: str
    language: str
    command: str
    path: str | None

    @property
    def found(self) -> bool:
        return self.path is not None


def find_servers(commands: Mapping[str, str | Sequence[str]] | None = None) -> list[ServerFound]:
    """Every built-in server (both type checkers) and every configured one (the suggested ones when
    none are configured), found or not."""
    wanted = dict(KNOWN_COMMANDS)
    wanted.update(commands or {})
    specs = [*TYPE_CHECKERS.values(), RUFF] if "python" not in wanted else []
    return [
        ServerFound(spec.name, spec.language, " ".join(spec.argv), find_command(spec.argv[0]))
        for spec in specs + server_specs(wanted, python=False)
    ]
