"""A real VS Code (code-server) with the squidcode extension (.vsix), driven headless in Chromium.

One run of editor-clients/vscode/e2e/drive.js (module fixture) does everything, the tests below each
judge one part of its report and of the file it saved. Setup (code-server from npm, Chromium from
Debian) is editor-clients/vscode/scripts/install-e2e.sh, cached; when it cannot run (no network),
these tests fail and say so. Screenshots, the code-server log and the extension's log are kept in
the artefacts folder printed at the start ($SQUIDCODE_TEST_ARTIFACTS, default test-artifacts/).
Parts that need a server command this server does not offer (the agent, acceptance, feedback) are
skipped with the command's name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO_WORKSPACE, REPO, SERVER_CMD
from tests.e2e.editor_support import (
    ACCEPT,
    AGENT_RUN,
    FEEDBACK_STATUS,
    FakeOpenAIServer,
    edit_block,
    server_commands,
)

pytestmark = [pytest.mark.e2e, pytest.mark.vscode, pytest.mark.timeout(900)]

VSCODE_DIR = REPO / "editor-clients" / "vscode"
INSTALL = VSCODE_DIR / "scripts" / "install-e2e.sh"
DRIVER = VSCODE_DIR / "e2e" / "drive.js"
RUN_TIMEOUT_S = 600
TYPED = "return "
# A second file for next edits, written by the driver after the status checks (the index counts
# them): `count` renamed to `item_count` on line 2, its next uses offered one after the other.
NEXT_EDIT_TEXT = ("def report(items):\n    count = 0\n    for item in items:\n"
                  "        count += item.quantity\n    print(count)\n    return count\n")
# A file that imports report.py's function: renaming it there goes on here.
IMPORTER_TEXT = "from report import report\n\n\nprint(report([]))\n"
OLD_DOCSTRING = '"""A tiny inventory module: the example workspace squidcode\'s demo completes in."""'
NEW_DOCSTRING = '"""Inventory: items, their total value and average price."""'


def _artifacts() -> Path:
    root = Path(os.environ.get("SQUIDCODE_TEST_ARTIFACTS") or REPO / "test-artifacts")
    target = root / "vscode"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _install() -> Path:
    """code-server's path, installing it first when needed; fails the tests when that cannot happen."""
    started = time.monotonic()
    run = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        pytest.fail(
            "The real-VS-Code test needs code-server, Chromium and the extension's npm packages, and "
            f"installing them failed (exit {run.returncode}; is the network to the Debian mirror and "
            f"registry.npmjs.org reachable?). Run `bash {INSTALL.relative_to(REPO)}` to see why.\n"
            f"{run.stderr[-3000:]}",
            pytrace=False,
        )
    path = Path(run.stdout.strip().splitlines()[-1])
    if not path.exists() or not Path("/usr/bin/chromium").exists():
        pytest.fail(f"install-e2e.sh finished but {path} or /usr/bin/chromium is missing", pytrace=False)
    _install.seconds = time.monotonic() - started
    return path


def _package() -> Path:
    run = subprocess.run(["npm", "run", "package"], cwd=VSCODE_DIR, capture_output=True, text=True,
                         timeout=300)
    vsix = VSCODE_DIR / "dist" / "squidcode.vsix"
    if run.returncode != 0 or not vsix.exists():
        pytest.fail(f"`npm run package` failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}", pytrace=False)
    return vsix


class VSCodeRun:
    def __init__(self, report: dict, file: Path, original: str, artifacts: Path, commands: list[str]):
        self.report, self.file, self.original = report, file, original
        self.artifacts, self.commands = artifacts, commands

    def step(self, name: str) -> dict:
        return next((s for s in self.report.get("steps", []) if s["name"] == name), {})

    def context(self) -> str:
        steps = [{k: v for k, v in s.items() if k != "value"} for s in self.report.get("steps", [])]
        return (f"\n--- artefacts: {self.artifacts}\n--- errors: {self.report.get('errors')}"
                f"\n--- steps: {json.dumps(steps, indent=1)[-4000:]}"
                f"\n--- extension log (tail) ---\n{self.report.get('extension_log', '')[-3000:]}")


@pytest.fixture(scope="module")
def vscode_run(request, model_cache_dir) -> VSCodeRun:
    code_server = _install()
    vsix = _package()
    artifacts = _artifacts()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nVS Code e2e artefacts (screenshots, logs): {artifacts}")
    commands = server_commands(SERVER_CMD)

    workspace = artifacts / "workspace"
    workspace.mkdir()
    target = workspace / "inventory.py"
    # The cursor goes at the end of the file: end it on the indented empty line of the unfinished
    # function, as an editor leaves it while you type.
    original = (DEMO_WORKSPACE / "inventory.py").read_text(encoding="utf-8").rstrip("\n")
    assert original.endswith("\n    "), "the demo file no longer ends in an unfinished function"
    target.write_text(original, encoding="utf-8")
    (workspace / ".squidcode.toml").write_text("# workspace root for the VS Code test\n")

    fake = FakeOpenAIServer(edit_block("inventory.py", OLD_DOCSTRING, NEW_DOCSTRING))
    config = {
        "codeServer": str(code_server),
        "vsix": str(vsix),
        "workspace": str(workspace),
        "file": str(target),
        "serverCommand": SERVER_CMD,
        "serverSettings": {"completion": {"max_tokens": 12, "max_lines": 1}},
        "artifacts": str(artifacts),
        "result": str(artifacts / "report.json"),
        "port": _free_port(),
        "typed": TYPED,
        "selectLines": 1,
        "agentInstruction": "make the module docstring say what the module holds",
        "nextEdit": {"file": str(workspace / "report.py"), "text": NEXT_EDIT_TEXT, "line": 2,
                     "typed": {"old": "count", "new": "item_count"},
                     "keys": ["Alt+BracketRight", "Tab", "Tab", "Tab"],
                     "importer": {"file": str(workspace / "uses_report.py"), "text": IMPORTER_TEXT,
                                  "column": 4, "renamed": {"old": "report", "new": "summary"}}},
    }
    if AGENT_RUN in commands:
        # The agent talks to the scripted model server (the extension's backend URL setting).
        config["backendUrl"] = fake.base_url
    config_path = artifacts / "config.json"
    config_path.write_text(json.dumps(config, indent=2))

    # Hermetic: no user squidcode config or feedback store; the model cache stays where it is.
    env = dict(os.environ, XDG_CONFIG_HOME=str(artifacts / "xdg-config"),
               XDG_DATA_HOME=str(artifacts / "xdg-data"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    with fake:
        proc = subprocess.Popen(["node", str(DRIVER), str(config_path)], cwd=VSCODE_DIR, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    report_path = artifacts / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["driver_output"] = output[-4000:]
    report["agent_model_requests"] = len(fake.requests)
    if reporter is not None:
        reporter.write_line(f"VS Code e2e: install/check {_install.seconds:.1f} s, "
                            f"drive {time.monotonic() - started:.1f} s")
    run = VSCodeRun(report, target, original, artifacts, commands)
    if not report.get("steps"):
        pytest.fail(f"the driver wrote no report:\n{output[-4000:]}", pytrace=False)
    return run


def _ok(run: VSCodeRun, *names: str) -> None:
    for name in names:
        step = run.step(name)
        assert step.get("ok"), f"step {name!r} failed: {step.get('error')}{run.context()}"
        if name not in ("install-extension", "start-code-server"):  # before the browser: no page
            assert Path(step["screenshot"]).is_file(), run.context()


def test_extension_installs_starts_the_server_and_shows_its_status(vscode_run: VSCodeRun):
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "install-extension", "start-code-server", "open-workspace", "open-file", "model-loaded")
    assert run.report["installed"] == ["squidcode.squidcode-0.1.0"], ctx
    # The status bar item, fed by squidcode/status, names the loaded model.
    assert run.report["status_bar"] == "squidcode: SmolLM2-135M-Instruct", ctx
    _ok(run, "server-commands")
    assert "squidcode.status" in run.report["commands"], ctx
    assert sorted(run.report["commands"]) == sorted(run.commands), ctx
    log = run.report["extension_log"]
    assert 'server started: {"name":"squidcode"' in log, ctx


def test_ghost_text_from_the_server_is_accepted_with_tab(vscode_run: VSCodeRun):
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "ghost-text", "accept-with-tab")
    ghost = run.report["ghost"]
    assert ghost.strip(), ctx
    saved = run.report["after_tab"]  # read back from disk after Ctrl+S
    # The file as saved: the original, the typed text, then the ghost text that was shown.
    assert saved.startswith(run.original + TYPED), ctx
    accepted = saved[len(run.original + TYPED):]
    assert accepted.strip() == ghost.strip(), ctx
    # The language client's answer from the server (in the extension's log) is what the editor drew.
    line, column = run.original.count("\n") + 1, len(run.original.rsplit("\n", 1)[1] + TYPED) + 1
    logged = f"inline completion at {line}:{column}: {json.dumps(accepted[:120], ensure_ascii=False)}"
    assert logged in run.report["extension_log"], ctx


def test_accepting_runs_the_servers_accept_command(vscode_run: VSCodeRun):
    # The server offers every command of docs/protocol.md; a missing one is a regression, not a skip.
    assert ACCEPT in vscode_run.commands, vscode_run.context()
    run, ctx = vscode_run, vscode_run.context()
    lines = run.report["accept_log"]
    assert any(f"executeCommand {ACCEPT} " in line and "episodeId" in line for line in lines), ctx
    assert any(f"executeCommand {ACCEPT} ok" in line for line in lines), ctx


def test_agent_edit_on_a_selection_is_applied(vscode_run: VSCodeRun):
    assert AGENT_RUN in vscode_run.commands, vscode_run.context()
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "agent-edit")
    assert run.report["agent_model_requests"] >= 1, ctx
    log = run.report["extension_log"]
    assert f"executeCommand {AGENT_RUN} " in log and '"instruction":"make the module docstring' in log, ctx
    assert "agent edit applied" in log, ctx
    before = run.report["after_tab"]
    assert run.file.read_text(encoding="utf-8") == before.replace(OLD_DOCSTRING, NEW_DOCSTRING, 1), ctx


def test_status_and_feedback_commands(vscode_run: VSCodeRun):
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "show-status", "feedback-status")
    status = run.report["status_notification"]
    assert "model: SmolLM2-135M-Instruct (loaded, cpu, float32)" in status, ctx
    assert "index: ready: 2 files" in status, ctx  # inventory.py, .squidcode.toml
    feedback = run.report["feedback_notification"]
    if FEEDBACK_STATUS in run.commands:
        assert feedback.startswith("squidcode feedback: "), ctx
    else:
        # Without the server command the extension says what is missing instead of failing silently.
        assert f"does not offer {FEEDBACK_STATUS}" in feedback, ctx


def test_next_edits_are_shown_accepted_with_tab_and_followed_to_the_next(vscode_run: VSCodeRun):
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "next-edit")
    decorated, another, inline, above = run.report["next_edit_shown"]
    # On another line than the cursor: a decoration. Alt+] waves it off: the use after it instead.
    # Tab applies that and moves the cursor to the next one, on whose line ghost text can draw the
    # rename (insertions only), which Tab accepts; then the use waved off, above: the cursor goes
    # there, and it is ghost text too.
    assert 'next edit at 4:9 (rename): "count" -> "item_count", shown as a decoration' in decorated, ctx
    assert 'next edit at 5:11 (rename): "count" -> "item_count", shown as a decoration' in another, ctx
    assert 'next edit at 6:12 (rename): "count" -> "item_count", shown inline' in inline, ctx
    assert 'next edit at 4:9 (rename): "count" -> "item_count", shown inline' in above, ctx
    assert run.report["next_edit_ghost"] == "item_", ctx
    assert run.report["after_next_edit"] == NEXT_EDIT_TEXT.replace("count", "item_count"), ctx
    # The three accepts ran the server's command (after the completion's, earlier in the run).
    accepted = [line for line in run.report["extension_log"].splitlines()
                if f"executeCommand {ACCEPT} ok" in line]
    assert len(accepted) >= 4, ctx
    # One request per pause in typing: no suggestion is shown twice over (a second Tab would fall
    # through to the editor and indent the line).
    shown = [line.split("] ", 1)[-1] for line in run.report["extension_log"].splitlines()
             if "next edit at " in line]
    assert all(a != b for a, b in zip(shown, shown[1:], strict=False)), ctx


def test_a_renamed_function_goes_on_in_the_file_that_imports_it_with_tab(vscode_run: VSCodeRun):
    run, ctx = vscode_run, vscode_run.context()
    _ok(run, "next-edit-elsewhere")
    hint, there, call = run.report["next_edit_elsewhere"]
    # No use left in report.py: a hint names the importer; Tab opens it at its import, Tab accepts
    # that and shows its call, Tab accepts that.
    assert 'next edit at uses_report.py:1:20 (rename): -> "summary", shown as a hint' in hint, ctx
    assert 'next edit at 1:20 (rename): "report" -> "summary", shown as a decoration' in there, ctx
    assert 'next edit at 4:7 (rename): "report" -> "summary", shown as a decoration' in call, ctx
    renamed = IMPORTER_TEXT.replace("import report", "import summary").replace("(report(", "(summary(")
    assert run.report["after_next_edit_elsewhere"] == renamed, ctx
