"""The Neovim plugin as a user sets it up (`require('squidcode').setup({...})`), in a real headless
Neovim against the real server: attach, status notification and statusline, ghost text accepted with
the plugin's accept key, :Squid status / feedback / record, :checkhealth squidcode, a next edit
previewed and accepted (:Squid next), and an agent edit on a range. One run of
tests/e2e/nvim/plugin.lua (module fixture); each test judges one part.
Parts that need a server command this server does not offer are skipped with the command's name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import DEMO_WORKSPACE, REPO, SERVER_CMD
from tests.e2e.editor_support import (
    ACCEPT,
    AGENT_RUN,
    FEEDBACK_SET_RECORD,
    FEEDBACK_STATUS,
    FakeOpenAIServer,
    edit_block,
    server_commands,
)
from tests.e2e.test_neovim import find_nvim

pytestmark = [pytest.mark.e2e, pytest.mark.nvim, pytest.mark.timeout(400)]

SCRIPT = REPO / "tests" / "e2e" / "nvim" / "plugin.lua"
CLIENT_DIR = REPO / "editor-clients" / "nvim"
RUN_TIMEOUT_S = 360
OLD_DOCSTRING = '"""A tiny inventory module: the example workspace squidcode\'s demo completes in."""'
# A file that imports inventory.py's in_stock: renaming it goes on here.
IMPORTER_TEXT = "from inventory import in_stock\n\n\ndef restock(items):\n    return in_stock(items)\n"
NEW_DOCSTRING = '"""Inventory: items, their total value and average price."""'


class PluginRun:
    def __init__(self, report: dict, stderr: str, returncode: int, commands: list[str],
                 fake: FakeOpenAIServer):
        self.report, self.stderr, self.returncode = report, stderr, returncode
        self.commands, self.fake = commands, fake

    def context(self) -> str:
        return (f"\n--- report ---\n{json.dumps(self.report, indent=1, ensure_ascii=False)[-6000:]}"
                f"\n--- nvim exit status {self.returncode}; stderr ---\n{self.stderr[-3000:]}")


@pytest.fixture(scope="module")
def plugin_run(model_cache_dir, tmp_path_factory) -> PluginRun:
    nvim = find_nvim()
    commands = server_commands(SERVER_CMD)
    base = tmp_path_factory.mktemp("nvim-plugin")
    workspace = base / "workspace"
    workspace.mkdir()
    target = workspace / "inventory.py"
    text = (DEMO_WORKSPACE / "inventory.py").read_text(encoding="utf-8")
    assert text.splitlines()[0] == OLD_DOCSTRING, "the demo file's first line changed"
    target.write_text(text, encoding="utf-8")
    (workspace / ".squidcode.toml").write_text("# workspace root for the Neovim plugin test\n")
    (workspace / "uses_inventory.py").write_text(IMPORTER_TEXT, encoding="utf-8")
    fake = FakeOpenAIServer(edit_block("inventory.py", OLD_DOCSTRING, NEW_DOCSTRING))
    setup = {"cmd": SERVER_CMD, "settings": {"completion": {"max_tokens": 8, "max_lines": 1}},
             "accept_key": "<Tab>"}
    if AGENT_RUN in commands:
        setup["backend_url"] = fake.base_url
    result_path = base / "result.json"
    env = dict(os.environ, SQUIDCODE_TEST_FILE=str(target), SQUIDCODE_SETUP=json.dumps(setup),
               SQUIDCODE_RESULT=str(result_path), SQUIDCODE_CLIENT_DIR=str(CLIENT_DIR),
               SQUIDCODE_TIMEOUT_MS="120000",
               SQUIDCODE_IMPORTER_FILE=str(workspace / "uses_inventory.py"),
               XDG_CONFIG_HOME=str(base / "config"),
               XDG_STATE_HOME=str(base / "state"), XDG_DATA_HOME=str(base / "data"))
    with fake:
        proc = subprocess.Popen([nvim, "--headless", "--clean", "-l", str(SCRIPT)], cwd=workspace, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
    report = json.loads(result_path.read_text()) if result_path.exists() else {}
    run = PluginRun(report, stderr or "", proc.returncode, commands, fake)
    if not report:
        pytest.fail(f"Neovim wrote no report{run.context()}", pytrace=False)
    return run


def _messages(run: PluginRun) -> list[str]:
    return [m.get("msg") or "" for m in run.report["messages"]]


def test_setup_registers_server_commands_and_accept_key(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    assert r["errors"] == [] and plugin_run.returncode == 0, ctx
    setup = r["setup"]
    assert setup["lsp_enabled"] and setup["inline_enabled"], ctx
    assert setup["squid_desc"].startswith("squidcode: agent {instruction}"), ctx
    assert setup["squid_range"] == ".", ctx
    assert setup["accept_map_desc"] == "squidcode: accept the inline completion (and report it)", ctx
    assert sorted(setup["completions"]) == ["agent", "another", "feedback", "next", "record", "share",
                                            "status"], ctx
    assert setup["statusline_before"] == "", ctx  # no client yet
    client = r["client"]
    assert client["cmd"] == SERVER_CMD, ctx
    assert client["init_options"]["completion"] == {"max_tokens": 8, "max_lines": 1}, ctx
    assert sorted(client["commands"]) == sorted(plugin_run.commands), ctx
    assert r["stopped"] is True, ctx


def test_status_notification_drives_the_statusline(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    assert r["model_loaded"] is True, ctx
    model = r["status_notification"]["model"]
    assert model["name"] == "SmolLM2-135M-Instruct" and model["device"] == "cpu", ctx
    assert r["statuslines"][-1] == "squid: SmolLM2-135M-Instruct", ctx
    # Before the model was ready the statusline said what the server was busy with.
    assert r["statuslines"][0].startswith("squid: ") and r["statuslines"][0] != r["statuslines"][-1], ctx


def test_ghost_text_accepted_with_the_plugins_key(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    ghost = r.get("ghost_text")
    assert ghost and ghost.strip(), ctx
    assert r["accept_returned"] is True, ctx
    # The indented empty last line now holds the suggestion.
    assert r["accepted_line"] == "    " + ghost, ctx


def test_acceptance_is_reported_to_the_server(plugin_run: PluginRun):
    # The server offers every command of docs/protocol.md; a missing one is a regression, not a skip.
    assert ACCEPT in plugin_run.commands, plugin_run.context()
    r, ctx = plugin_run.report, plugin_run.context()
    accepted = r["accepted"]  # the ghost text's, then the next edits' (below)
    assert len(accepted) == 5 and all(entry["ok"] is True for entry in accepted), ctx
    assert accepted[0]["args"]["episodeId"], ctx


def test_squid_status_feedback_and_record_commands(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    status = r["status_output"]
    assert status.splitlines()[1] == "model: SmolLM2-135M-Instruct (loaded, cpu, float32)", ctx
    assert "index: ready: 3 files" in status, ctx  # inventory.py, uses_inventory.py, .squidcode.toml
    messages = _messages(plugin_run)
    if FEEDBACK_STATUS in plugin_run.commands:
        assert r["feedback_output"].startswith("squidcode feedback: "), ctx
    else:
        assert r["feedback_output"] == "", ctx
        assert any(f"does not offer {FEEDBACK_STATUS}" in m for m in messages), ctx
    if FEEDBACK_SET_RECORD in plugin_run.commands:
        assert r["feedback_state"]["record"] is True, ctx
        assert r["record_output"].startswith("squidcode feedback: recording"), ctx
    else:
        assert any(f"does not offer {FEEDBACK_SET_RECORD}" in m for m in messages), ctx
    # Bad input is answered with a usage message, not an error trace.
    assert "squidcode: :Squid record on|off" in messages, ctx
    assert any(m.startswith("squidcode: usage: :Squid agent") for m in messages), ctx


def test_checkhealth_squidcode_passes(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    health = r["health"]
    assert "ERROR" not in health, ctx
    for expected in ("OK Neovim 0.12", "OK server command: ", "OK server version: squidcode 0.1.0",
                     "OK model: SmolLM2-135M-Instruct (loaded, cpu, float32)", "OK index: ready: 3 files"):
        assert expected in health, f"{expected!r} missing{ctx}"


def test_agent_edit_on_a_range_is_applied(plugin_run: PluginRun):
    assert AGENT_RUN in plugin_run.commands, plugin_run.context()
    r, ctx = plugin_run.report, plugin_run.context()
    agent = r["agent"]
    assert agent.get("error") is None and agent["applied"] is True, ctx
    assert agent["args"]["range"]["start"] == {"line": 0, "character": 0}, ctx
    assert agent["args"]["range"]["end"]["line"] == 0, ctx
    assert len(plugin_run.fake.requests) >= 1, ctx
    before, after = r["before_agent"], r["after_agent"]
    assert after == [NEW_DOCSTRING] + before[1:], ctx


def test_a_next_edit_is_previewed_and_accepted(plugin_run: PluginRun):
    r, ctx = plugin_run.report, plugin_run.context()
    edit = r["next_edit"]
    assert edit and edit["newText"] == "stock" and edit["kind"] == "rename", ctx
    assert edit["range"]["start"]["line"] == edit["range"]["end"]["line"], ctx
    assert r["next_edit_marks"] == 1, ctx
    # Waved off (:Squid another): the use after it, in in_stock's docstring; then none is left.
    another = r["another_edit"]
    assert another and another["newText"] == "stock" and r["another_marks"] == 1, ctx
    assert another["range"]["start"]["line"] == edit["range"]["start"]["line"] - 1, ctx
    assert r["another_left"] is None, ctx
    assert r["next_edit_again"]["range"] == edit["range"], ctx  # asked afresh: the first again
    assert r["next_edit_accepted"] is True, ctx
    # Accepting it ran its command: the server follows the edit (recording is off yet: no episode).
    assert r["accepted"][1]["ok"] is True, ctx
    # The next `items` in code is in in_stock's body (its docstring's words come after the code);
    # `item` is another name and stays.
    assert r["after_next_edit"] == "    return [item for item in stock if item.quantity > 0]", ctx


def test_a_next_edit_on_the_cursors_line_is_an_inline_completion_with_a_range(plugin_run: PluginRun):
    # Neovim's own inline completion shows an item whose range starts before the cursor over the
    # text it replaces (an overlay), and the plugin's accept key applies it there.
    r, ctx = plugin_run.report, plugin_run.context()
    shown = r["inline_next_edit"]
    edit = shown["edit"]
    assert edit["newText"] == "stock" and edit["range"]["start"]["line"] == edit["range"]["end"]["line"], ctx
    start, end = edit["range"]["start"]["character"], edit["range"]["end"]["character"]
    assert shown["before"][start:end] == "items" and end < len(shown["before"]), ctx  # before the cursor
    assert shown["mark_row"] == shown["row"] and shown["overlay"] is True, ctx
    assert shown["accept_returned"] is True, ctx
    assert shown["after"] == shown["before"][:start] + "stock" + shown["before"][end:], ctx
    # Its acceptance reported too (recording is on by then: its episode is followed like a completion's).
    episode = edit["command"]["arguments"][0]["episodeId"]
    (accepted,) = [entry for entry in r["accepted"] if entry["args"]["episodeId"] == episode]
    assert accepted["ok"] is True, ctx



def test_a_renamed_function_goes_on_in_the_file_that_imports_it(plugin_run: PluginRun):
    # in_stock renamed at its def, no use left in inventory.py: the next edit is in the file that
    # imports it, hinted at the cursor; :Squid next goes there and previews it; again accepts it.
    r, ctx = plugin_run.report, plugin_run.context()
    shown = r["elsewhere"]
    assert shown["target"].endswith("/uses_inventory.py") and shown["hint_marks"] == 1, ctx
    assert shown["edit"]["newText"] == "available", ctx
    assert shown["went"] == "uses_inventory.py" and shown["cursor"] == [1, 22], ctx
    assert shown["preview_marks"] == 1 and shown["attached"] is True, ctx
    assert shown["after_import"] == "from inventory import available", ctx
    assert shown["call"]["range"]["start"] == {"line": 4, "character": 11}, ctx
    assert shown["after"] == IMPORTER_TEXT.replace("in_stock", "available").splitlines(), ctx
    # Both acceptances reported to the server.
    assert [entry["ok"] for entry in shown["reported"]] == [True, True], ctx
