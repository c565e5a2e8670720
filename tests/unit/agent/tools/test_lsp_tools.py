"""The language-server tools (diagnostics, definition, references, hover, document_symbols, rename)
and the edit gate, with real basedpyright (and ty) and `ruff server` shared by the whole module."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.lsp_client import (
    PYTHON_SERVERS,
    LanguageServers,
    ServerSpec,
    close_shared_language_servers,
    python_servers,
)
from agent.lsp_client.specs import find_command
from agent.overlay import Overlay
from agent.sandbox import Workspace
from agent.tools import LSP_TOOLS, ToolContext, default_registry
from agent.tools.lsp import servers_for
from context.config import AgentConfig

pytestmark = pytest.mark.skipif(
    find_command("basedpyright-langserver") is None,
    reason="basedpyright is not installed (pip install basedpyright, or the test extra)",
)

CALC = '''"""Arithmetic helpers."""


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def twice(a: int) -> int:
    return add(a, a)
'''
MAIN = "from calc import add\n\ntotal: int = add(1, 2)\n"
REGISTRY = default_registry(language_servers=True)


@dataclass(frozen=True)
class ConfigWithTypeErrorsAllowed(AgentConfig):
    """AgentConfig with the gate's setting that `agent.tools.lsp` reads (a field the config may add)."""

    type_errors_block: bool = False


@dataclass(frozen=True)
class ConfigWithRuffServerOnly(AgentConfig):
    """AgentConfig turning the servers on, with ruff's server configured for Python (it starts fast)."""

    language_servers: bool = True
    language_server_commands: tuple[str, ...] = ("python=ruff server",)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lsp_tools")
    (root / "calc.py").write_text(CALC)
    (root / "main.py").write_text(MAIN)
    (root / "pyproject.toml").write_text('[tool.ruff.lint]\nselect = ["E", "F"]\n')
    return root


@pytest.fixture(scope="module")
def servers(workspace):
    pool = LanguageServers(workspace, specs=PYTHON_SERVERS, timeout_s=30)
    yield pool
    pool.close()


def make_ctx(workspace: Path, servers, config=None) -> ToolContext:
    space = Workspace([workspace])
    config = config or AgentConfig(tool_timeout_s=20)
    return ToolContext(space, Overlay(space), config, language_servers=servers)


@pytest.fixture
def ctx(workspace, servers) -> ToolContext:
    return make_ctx(workspace, servers)


def test_the_registry_offers_the_tools_only_when_turned_on():
    assert set(REGISTRY.names()) - set(default_registry().names()) == {t.name for t in LSP_TOOLS}


def test_diagnostics_of_the_overlay_from_both_servers(ctx, workspace):
    ctx.overlay.write(workspace / "main.py", "import os\n" + MAIN + 'label: str = add(1, 2)\n')
    result = REGISTRY.call(ctx, "diagnostics", {"path": "main.py"})
    assert result.ok and result.data["errors"] == 1 and result.data["total"] == 3, result.output
    assert "(basedpyright, ruff)" in result.output
    assert "line 1: warning F401 (ruff)" in result.output
    assert "line 5: error reportAssignmentType (basedpyright)" in result.output
    assert "label" not in (workspace / "main.py").read_text()  # nothing written


def test_definition_references_hover_and_symbols(ctx):
    found = REGISTRY.call(ctx, "definition", {"path": "main.py", "line": 3, "symbol": "calc.add"})
    assert found.ok and "calc.py:4:5  def add(a: int, b: int) -> int:" in found.output, found.output
    refs = REGISTRY.call(ctx, "references", {"path": "calc.py", "line": 4, "symbol": "add"})
    assert refs.data["count"] == 4, refs.output  # the definition, twice's call, the import, the call
    assert "main.py:3:14" in refs.output and "calc.py:10:12" in refs.output
    hover = REGISTRY.call(ctx, "hover", {"path": "main.py", "line": 2, "symbol": "add"})  # a line off
    assert "(function) def add(\n    a: int,\n    b: int\n) -> int" in hover.output, hover.output
    assert "Add two numbers." in hover.output
    symbols = REGISTRY.call(ctx, "document_symbols", {"path": "calc.py"})
    assert "function add (line 4)" in symbols.output and "  variable a (line 4)" in symbols.output


def test_a_symbol_not_near_the_line_is_the_models_mistake(ctx):
    result = REGISTRY.call(ctx, "definition", {"path": "main.py", "line": 1, "symbol": "nowhere"})
    assert not result.ok and "'nowhere' is not on line 1 of main.py" in result.output


def test_rename_is_checked_and_lands_in_the_overlay_only(ctx, workspace):
    result = REGISTRY.call(ctx, "rename", {"path": "calc.py", "line": 4, "symbol": "add", "new_name": "plus"})
    assert result.ok, result.output
    assert "checked by basedpyright, ruff: no new errors" in result.output
    assert "from calc import plus" in ctx.overlay.read(workspace / "main.py")
    assert "return plus(a, a)" in ctx.overlay.read(workspace / "calc.py")
    assert "plus" not in (workspace / "calc.py").read_text()


def test_a_rename_that_breaks_the_code_is_rejected(ctx, workspace):
    # Renaming parameter `a` to `b` duplicates a parameter: basedpyright reports it.
    result = REGISTRY.call(ctx, "rename", {"path": "calc.py", "line": 4, "symbol": "a", "new_name": "b"})
    assert not result.ok and result.data["rejected"], result.output
    assert ctx.overlay.edited() == {}


def test_the_edit_gate_rejects_a_new_type_error(ctx, workspace):
    edit = {"path": "main.py", "blocks": [{"search": "total: int", "replace": "total: str"}]}
    result = REGISTRY.call(ctx, "edit", edit)
    assert not result.ok and result.data["types"], result.output
    assert "reportAssignmentType (basedpyright)" in result.output
    assert ctx.overlay.edited() == {}
    fine = {"path": "main.py", "blocks": [{"search": "add(1, 2)", "replace": "add(2, 2)"}]}
    assert REGISTRY.call(ctx, "edit", fine).ok


def test_type_errors_can_be_shown_without_blocking(workspace, servers):
    ctx = make_ctx(workspace, servers, ConfigWithTypeErrorsAllowed(tool_timeout_s=20))
    edit = {"path": "main.py", "blocks": [{"search": "total: int", "replace": "total: str"}]}
    result = REGISTRY.call(ctx, "edit", edit)
    assert result.ok and "note: 1 new type error(s), not blocking: line 3:" in result.output, result.output


def test_without_servers_the_tools_fall_back_with_a_note(workspace):
    missing = ServerSpec("not-a-server", ("squidcode-no-such-language-server",), "python", (".py",),
                         checks_types=True)
    for servers, why in ((LanguageServers(workspace, specs=[missing]), "not-a-server is unavailable"),
                         (None, "language servers are off")):
        ctx = make_ctx(workspace, servers)
        ctx.overlay.write(workspace / "main.py", "import os\n" + MAIN)
        result = REGISTRY.call(ctx, "diagnostics", {"path": "main.py"})
        assert result.ok and result.data["fallback"] and "F401" in result.output, result.output
        assert f"note: {why}" in result.output
        edit = {"path": "main.py", "blocks": [{"search": "total: int", "replace": "total: str"}]}
        assert REGISTRY.call(ctx, "edit", edit).ok  # the parser and ruff find nothing wrong


def test_a_hanging_server_degrades_the_tools_with_a_note(workspace):
    # A stand-in that reads its input and never answers: initialize times out.
    never_answers = (sys.executable, "-c", "import sys\nfor _ in sys.stdin.buffer: pass")
    silent = ServerSpec("silent-stand-in", never_answers, "python", (".py",), checks_types=True)
    ctx = make_ctx(workspace, LanguageServers(workspace, specs=[silent], timeout_s=0.5))
    result = REGISTRY.call(ctx, "definition", {"path": "main.py", "line": 3, "symbol": "add"})
    assert result.ok and result.data["degraded"] and "did not answer initialize" in result.output
    change = {"path": "main.py", "blocks": [{"search": "(1, 2)", "replace": "(1, 3)"}]}
    edit = REGISTRY.call(ctx, "edit", change)
    assert edit.ok and "checked with the parser and ruff only" in edit.output, edit.output


def test_the_configuration_turns_on_a_shared_pool(workspace):
    ctx = make_ctx(workspace, None, ConfigWithRuffServerOnly(tool_timeout_s=20))
    try:
        pool = servers_for(ctx)
        # One pool per workspace and configuration: the servers stay warm across episodes.
        assert pool is servers_for(make_ctx(workspace, None, ConfigWithRuffServerOnly()))
        assert [s.spec.argv for s in pool.states()] == [("ruff", "server")]
        ctx.overlay.write(workspace / "main.py", "import os\n" + MAIN)
        result = REGISTRY.call(ctx, "diagnostics", {"path": "main.py"})
        assert "F401 (ruff)" in result.output and "fallback" not in result.data, result.output
    finally:
        close_shared_language_servers()


@pytest.fixture(scope="module")
def ty_servers(workspace):
    if find_command("ty") is None:
        # Only where the test extra is not installed: ./dev test (and so .ci/run) installs ty, and runs this.
        pytest.skip("ty is not installed (pip install ty, or the test extra)")
    pool = LanguageServers(workspace, specs=python_servers("ty"), timeout_s=30)
    yield pool
    pool.close()


def test_the_tools_and_the_gate_with_ty(workspace, ty_servers):
    """The same tools with ty as the type checker (`agent.type_checker`, what "auto" picks when
    ty is installed): its errors count in the gate as basedpyright's do."""
    ctx = make_ctx(workspace, ty_servers)
    ctx.overlay.write(workspace / "main.py", "import os\n" + MAIN + 'label: str = add(1, 2)\n')
    result = REGISTRY.call(ctx, "diagnostics", {"path": "main.py"})
    assert result.ok and result.data["errors"] == 1 and "(ruff, ty)" in result.output, result.output
    assert "line 5: error invalid-assignment (ty)" in result.output

    ctx = make_ctx(workspace, ty_servers)
    edit = {"path": "main.py", "blocks": [{"search": "total: int", "replace": "total: str"}]}
    rejected = REGISTRY.call(ctx, "edit", edit)
    assert not rejected.ok and rejected.data["types"] and "invalid-assignment (ty)" in rejected.output
    assert ctx.overlay.edited() == {}
    refs = REGISTRY.call(ctx, "references", {"path": "calc.py", "line": 4, "symbol": "add"})
    assert refs.data["count"] == 4 and "main.py:3:14" in refs.output, refs.output
    hover = REGISTRY.call(ctx, "hover", {"path": "main.py", "line": 3, "symbol": "add"})
    assert "def add(" in hover.output and "Add two numbers." in hover.output, hover.output
    rename = {"path": "calc.py", "line": 4, "symbol": "add", "new_name": "plus"}
    renamed = REGISTRY.call(ctx, "rename", rename)
    assert renamed.ok and "checked by ruff, ty: no new errors" in renamed.output, renamed.output
    assert "from calc import plus" in ctx.overlay.read(workspace / "main.py")


def test_the_configuration_names_the_type_checker(workspace):
    config = AgentConfig(language_servers=True, type_checker="basedpyright")
    try:
        pool = servers_for(make_ctx(workspace, None, config))
        assert [s.spec.name for s in pool.states()] == ["basedpyright", "ruff"]
        if find_command("ty") is not None:
            auto = servers_for(make_ctx(workspace, None, AgentConfig(language_servers=True)))
            assert auto is not pool and [s.spec.name for s in auto.states()] == ["ty", "ruff"]
    finally:
        close_shared_language_servers()
