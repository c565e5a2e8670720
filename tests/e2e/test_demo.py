"""The quick tour, `squidcode demo`, end to end (a real server, the embedded model).

It shows two inline completions and one agent edit; the agent's example is a copy-paste slip that
the embedded model fixes, with the fix verified by the example's own test, and the files stay as
they were (the demo never applies the edit).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lsp_server.demo import AGENT_FILE, AGENT_WORKSPACE, DEMO_FILE

pytestmark = pytest.mark.e2e


def test_the_demo_completes_and_shows_a_verified_agent_edit(model_cache_dir):
    before = {p: p.read_text() for p in (DEMO_FILE, *AGENT_WORKSPACE.iterdir()) if p.is_file()}
    proc = subprocess.run([sys.executable, "-m", "lsp_server", "--log-level", "warning", "demo", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [bool(run["text"]) for run in report["completions"]] == [True, True]
    agent = report["agent"]
    assert "error" not in agent, agent
    assert agent["verified"] >= 1 and agent["chosen"] is not None
    assert f"+++ b/{AGENT_FILE.name}" in agent["diff"]
    assert '+    return f"{first} {last}"' in agent["diff"], agent["diff"]
    assert {p: p.read_text() for p in before} == before  # nothing was applied
