"""agent.lsp_client against real servers: basedpyright, ty and `ruff server` on a tiny workspace.

One basedpyright is started for the whole module (its first analysis costs about 2 s); ruff's server
starts in milliseconds, so the crash tests restart it freely. Two stand-ins, named for what they
are, play the servers that cannot be had on purpose: one that never answers anything, and one that
answers `initialize` and then nothing.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.errors import LanguageServerError, LanguageServerTimeout
from agent.lsp_client import (
    PYTHON_SERVERS,
    TY,
    LanguageServerClient,
    LanguageServers,
    ServerSpec,
    apply_text_edits,
    definition,
    file_diagnostics,
    find_servers,
    lsp_position,
    python_servers,
    server_specs,
)
from agent.lsp_client.jsonrpc import encode_message, read_message
from agent.lsp_client.positions import TextEdit, python_column, utf16_column
from agent.lsp_client.specs import find_command, parse_server_commands
from agent.overlay import Overlay
from agent.sandbox import Workspace

BASEDPYRIGHT, RUFF = PYTHON_SERVERS
pytestmark = pytest.mark.skipif(
    find_command("basedpyright-langserver") is None,
    reason="basedpyright is not installed (pip install basedpyright, or the test extra)",
)

CALC = 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n    return a + b\n'
MAIN = "from calc import add\n\ntotal = add(1, 2)\n"

# Reads framed messages and never answers: a server hung from the start.
SILENT = "import sys\nfor _ in sys.stdin.buffer:\n    pass\n"
# Answers initialize (offering definitions), then nothing: a server that hangs on requests.
ANSWERS_INITIALIZE_ONLY = textwrap.dedent(
    """
    import json, sys
    def read():
        length = None
        while (line := sys.stdin.buffer.readline().strip()):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return json.loads(sys.stdin.buffer.read(length)) if length else None
    while (message := read()) is not None:
        if message.get("method") == "initialize":
            answer = {"capabilities": {"definitionProvider": True, "textDocumentSync": 1}}
            body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": answer}).encode()
            sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
            sys.stdout.buffer.flush()
    """
)


def stand_in(name: str, script: str) -> ServerSpec:
    return ServerSpec(name, (sys.executable, "-c", script), "python", (".py",), checks_types=True)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lsp_ws")
    (root / "calc.py").write_text(CALC)
    (root / "main.py").write_text(MAIN)
    (root / "pyproject.toml").write_text('[tool.ruff.lint]\nselect = ["E", "F"]\n')
    return root


@pytest.fixture(scope="module")
def servers(workspace):
    pool = LanguageServers(workspace, specs=[BASEDPYRIGHT], timeout_s=30)
    yield pool
    pool.close()


@pytest.fixture
def overlay(workspace) -> Overlay:
    return Overlay(Workspace([workspace]))


def test_framing_round_trips_a_message():
    import io

    message = {"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"text": "é\n"}}
    assert read_message(io.BytesIO(encode_message(message))) == message
    assert read_message(io.BytesIO(b"")) is None


def test_positions_count_utf16_units_and_edits_apply_from_the_end():
    line = "s = '😀' + name"
    assert utf16_column(line, line.index("name")) == line.index("name") + 1
    assert python_column(line, utf16_column(line, line.index("name"))) == line.index("name")
    text = "a = 1\nb = a\n"
    edits = [TextEdit(0, 0, 0, 1, "x"), TextEdit(1, 4, 1, 5, "x")]
    assert apply_text_edits(text, edits) == "x = 1\nb = x\n"


def test_the_overlay_is_what_the_type_checker_sees(servers, overlay, workspace):
    main = workspace / "main.py"
    notes: list[str] = []
    assert [d for d in file_diagnostics(servers, overlay, main, notes) if d.is_error] == []
    overlay.write(main, MAIN + 'label: str = add(1, 2)\n')  # proposed, never on disk
    found = file_diagnostics(servers, overlay, main, notes)
    assert notes == []
    errors = [d for d in found if d.is_error]
    assert len(errors) == 1 and errors[0].line == 4 and "str" in errors[0].message, found
    assert errors[0].server == "basedpyright" and errors[0].type_check
    # A new overlay (the edit discarded) brings the server back to the file's own text.
    assert [d for d in file_diagnostics(servers, Overlay(overlay.workspace), main, notes) if d.is_error] == []


def test_definition_across_files_follows_the_overlay(servers, overlay, workspace):
    main = workspace / "main.py"
    text = overlay.read(main)
    notes: list[str] = []
    at_add = lsp_position(text, 3, text.split("\n")[2].index("add") + 1)
    found = definition(servers, overlay, main, at_add, notes)
    assert [(loc.path.name, loc.line) for loc in found] == [("calc.py", 1)], notes
    # calc.py edited in the overlay only: the definition moves with it.
    overlay.write(workspace / "calc.py", "# a comment\n\n" + CALC)
    found = definition(servers, overlay, main, lsp_position(text, 3, 9), notes)
    assert [(loc.path.name, loc.line) for loc in found] == [("calc.py", 3)]


def test_ruff_server_reports_lint_in_the_overlay(workspace, overlay):
    pool = LanguageServers(workspace, specs=[RUFF], timeout_s=10)
    try:
        main = workspace / "main.py"
        overlay.write(main, "import os\n" + MAIN)
        found = file_diagnostics(pool, overlay, main, [])
        assert [d.code for d in found] == ["F401"] and found[0].server == "ruff" and not found[0].type_check
    finally:
        pool.close()


def test_a_crashed_server_is_restarted_then_given_up(workspace, overlay):
    pool = LanguageServers(workspace, specs=[RUFF], timeout_s=10, max_restarts=1)
    main = workspace / "main.py"
    overlay.write(main, "import os\n" + MAIN)
    try:
        assert len(file_diagnostics(pool, overlay, main, [])) == 1
        for expected in ("was restarted", "no longer used"):
            pool.states()[0].client.process.kill()
            pool.states()[0].client.process.wait(5)
            notes: list[str] = []
            found = file_diagnostics(pool, overlay, main, notes)
            assert any(expected in n for n in notes), notes
        assert found == [] and pool.states()[0].degraded
    finally:
        pool.close()


def test_killing_basedpyright_mid_session_restarts_it(servers, overlay, workspace):
    process = servers.states()[0].client.process
    process.kill()
    process.wait(5)
    notes: list[str] = []
    overlay.write(workspace / "main.py", MAIN + "label: str = add(1, 2)\n")
    errors = [d for d in file_diagnostics(servers, overlay, workspace / "main.py", notes) if d.is_error]
    assert any("restarted" in n for n in notes) and len(errors) == 1, (notes, errors)


def test_a_missing_server_degrades_with_a_note(workspace, overlay):
    spec = ServerSpec("not-a-server", ("squidcode-no-such-language-server",), "python", (".py",))
    pool = LanguageServers(workspace, specs=[spec])
    notes: list[str] = []
    assert file_diagnostics(pool, overlay, workspace / "main.py", notes) == []
    assert notes == ["not-a-server is unavailable (squidcode-no-such-language-server is not installed "
                     "(not found on PATH))"]


def test_a_silent_server_times_out_on_initialize(workspace, overlay):
    pool = LanguageServers(workspace, specs=[stand_in("silent-stand-in", SILENT)], timeout_s=0.5)
    began = time.monotonic()
    notes: list[str] = []
    assert file_diagnostics(pool, overlay, workspace / "main.py", notes) == []
    assert "did not answer initialize within 0.5 s" in notes[0] and time.monotonic() - began < 5
    assert pool.states()[0].client is None or not pool.states()[0].client.alive  # killed, not left behind


def test_a_server_that_hangs_on_requests_times_out_with_a_note(workspace, overlay):
    spec = stand_in("hangs-after-initialize-stand-in", ANSWERS_INITIALIZE_ONLY)
    pool = LanguageServers(workspace, specs=[spec], timeout_s=0.5)
    main = workspace / "main.py"
    try:
        notes: list[str] = []
        assert definition(pool, overlay, main, {"line": 2, "character": 9}, notes) == []
        assert "did not answer textDocument/definition within 0.5 s" in notes[0]
        notes.clear()
        assert file_diagnostics(pool, overlay, main, notes) == []
        assert "published no diagnostics of main.py within 0.5 s" in notes[0]
    finally:
        pool.close()


def test_client_raises_named_errors(workspace):
    client = LanguageServerClient(stand_in("hangs-after-initialize-stand-in", ANSWERS_INITIALIZE_ONLY),
                                  workspace, timeout_s=5).start()
    try:
        with pytest.raises(LanguageServerTimeout):
            client.request("textDocument/hover", {}, timeout_s=0.2)
    finally:
        client.close(grace_s=0.2)
    with pytest.raises(LanguageServerError, match="not running"):
        client.request("textDocument/hover", {})


def test_specs_and_doctor_say_which_servers_are_found():
    specs = server_specs({"go": "gopls", "rust": ["rust-analyzer"]}, type_checker="basedpyright")
    assert [s.name for s in specs] == ["basedpyright", "ruff", "gopls", "rust-analyzer"]
    assert specs[2].handles(Path("x.go")) and not specs[2].handles(Path("x.py"))
    assert parse_server_commands(["go=gopls", "typescript = tsserver --stdio", "nonsense"]) == (
        {"go": "gopls", "typescript": "tsserver --stdio"},
        ["language server command 'nonsense' is not 'language=command'; ignored"],
    )
    found = {s.name: s for s in find_servers({"go": "squidcode-no-such-gopls"})}
    assert found["basedpyright"].found and found["ruff"].found
    assert not found["squidcode-no-such-gopls"].found

    from context.config import AgentConfig, SquidConfig
    from lsp_server.doctor import check_language_servers

    check = check_language_servers(SquidConfig(agent=AgentConfig(type_checker="basedpyright")))
    assert check.ok and "basedpyright (python)" in check.detail and not check.required
    assert "Python type checker: basedpyright (agent.type_checker = basedpyright)" in check.detail


def test_auto_picks_ty_when_it_is_installed_and_basedpyright_otherwise(monkeypatch):
    from agent.lsp_client import specs as specs_module
    from context.config import AgentConfig, SquidConfig
    from lsp_server.doctor import check_language_servers

    if find_command("ty") is None:
        # Only where the test extra is not installed: ./dev test (and so .ci/run) installs ty, and runs this.
        pytest.skip("ty is not installed (pip install ty, or the test extra)")
    assert [s.name for s in python_servers("auto")] == ["ty", "ruff"]
    assert [s.name for s in server_specs()] == ["ty", "ruff"]
    assert [s.name for s in python_servers("basedpyright")] == ["basedpyright", "ruff"]
    with pytest.raises(ValueError, match="unknown type checker 'mypy'"):
        python_servers("mypy")
    check = check_language_servers(SquidConfig())
    assert check.ok and "Python type checker: ty (agent.type_checker = auto)" in check.detail

    # ty not installed here: auto falls back to basedpyright; asking for ty by name fails the check.
    real = specs_module.find_command
    monkeypatch.setattr(specs_module, "find_command", lambda prog: None if prog == "ty" else real(prog))
    assert [s.name for s in python_servers("auto")] == ["basedpyright", "ruff"]
    check = check_language_servers(SquidConfig(agent=AgentConfig(type_checker="ty")))
    assert not check.ok and "ty (python)" in check.detail.split("not found:")[1]


@pytest.fixture(scope="module")
def ty_servers(workspace):
    if find_command("ty") is None:
        # Only where the test extra is not installed: ./dev test (and so .ci/run) installs ty, and runs this.
        pytest.skip("ty is not installed (pip install ty, or the test extra)")
    pool = LanguageServers(workspace, specs=[TY], timeout_s=30)
    yield pool
    pool.close()


def test_ty_checks_the_overlay_and_its_errors_are_type_errors(ty_servers, overlay, workspace):
    """ty answers pulled diagnostics (it registers them after `initialized` and publishes none) of
    the text the agent proposes, not the disk's, and finds definitions across files."""
    main = workspace / "main.py"
    notes: list[str] = []
    assert [d for d in file_diagnostics(ty_servers, overlay, main, notes) if d.is_error] == [], notes
    overlay.write(main, MAIN + 'label: str = add(1, 2)\n')
    errors = [d for d in file_diagnostics(ty_servers, overlay, main, notes) if d.is_error]
    assert notes == []
    assert len(errors) == 1 and errors[0].line == 4 and "str" in errors[0].message, errors
    assert errors[0].server == "ty" and errors[0].type_check
    text = overlay.read(main)
    found = definition(ty_servers, overlay, main, lsp_position(text, 3, 9), notes)
    assert [(loc.path.name, loc.line) for loc in found] == [("calc.py", 1)], notes
    on_disk = file_diagnostics(ty_servers, Overlay(overlay.workspace), main, notes)
    assert [d for d in on_disk if d.is_error] == []


@pytest.mark.parametrize("checker", ["ty", "basedpyright"])
def test_the_type_checker_resolves_what_the_tests_can_import(checker, workspace, overlay):
    """The workspace's tests run under squidcode's interpreter, so its packages resolve for the type
    checker too (contained as it is): importing an installed package is no error, a missing one is."""
    spec = python_servers(checker)[0]
    if find_command(spec.argv[0]) is None:
        # Only where the test extra is not installed: ./dev test installs both checkers, and runs this.
        pytest.skip(f"{checker} is not installed")
    pool = LanguageServers(workspace, specs=[spec], timeout_s=30)
    try:
        main = workspace / "main.py"
        overlay.write(main, "import httpx\nimport squidcode_no_such_module\n\nclient: int = httpx.Client\n")
        notes: list[str] = []
        errors = [d for d in file_diagnostics(pool, overlay, main, notes) if d.is_error]
        assert notes == [] and sorted({d.line for d in errors}) == [2, 4], errors
    finally:
        pool.close()
