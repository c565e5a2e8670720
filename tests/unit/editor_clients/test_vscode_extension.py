"""The VS Code extension's own checks, run by the suite: type check, lint, and its unit tests
(node's test runner on the pure modules: settings mapping, status bar text, protocol helpers)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

VSCODE_DIR = REPO / "editor-clients" / "vscode"


@pytest.fixture(scope="module")
def node_modules():
    if not shutil.which("npm"):
        pytest.fail("npm is needed for the VS Code extension's checks (node 20+ with npm)", pytrace=False)
    stamp = VSCODE_DIR / "node_modules" / ".package-lock.json"
    lock = VSCODE_DIR / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        run = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=VSCODE_DIR, capture_output=True,
                             text=True, timeout=600)
        if run.returncode != 0:
            pytest.fail(f"`npm ci` failed (registry.npmjs.org reachable?):\n{run.stderr[-3000:]}",
                        pytrace=False)


@pytest.mark.parametrize("script", ["typecheck", "lint", "test"])
def test_npm_script(node_modules, script):
    run = subprocess.run(["npm", "run", "--silent", script], cwd=VSCODE_DIR, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"npm run {script}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    if script == "test":
        assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout, run.stdout[-2000:]
