"""`squidcode agent` and `squidcode memory` as a user runs them (a subprocess), with the OpenAI-compatible
backend pointed at a loopback server double so that the edit is known in advance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agent.memory import MemoryStore, default_memory_path
from tests.unit.agent.doubles import FakeOpenAIServer, chat_completion

READ = [
    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "calc.py"}'}}
]
EDIT = [
    {
        "id": "c2",
        "type": "function",
        "function": {
            "name": "edit",
            "arguments": json.dumps(
                {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + b"}]}
            ),
        },
    }
]


def squidcode(project, tmp_path, *args):
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    return subprocess.run(
        [sys.executable, "-m", "lsp_server", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def configure(project, server):
    (project / ".squidcode.toml").write_text(
        f'[agent]\nbackend = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\napi_key_env = ""\n'
        "retries = 0\n"
    )


def test_agent_json_output_and_apply(project, tmp_path):
    with FakeOpenAIServer(
        [chat_completion("", tool_calls=READ), chat_completion("", tool_calls=EDIT)]
    ) as server:
        configure(project, server)
        done = squidcode(
            project, tmp_path, "agent", "calc.py", "add() subtracts; fix it", "--json", "--apply"
        )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"diff", "steps", "candidates", "chosen", "stop_reason", "error"}
    assert out["stop_reason"] == "verified" and out["error"] is None
    assert [s["tool"] for s in out["steps"]] == ["run_tests", "read_file", "edit"]
    assert set(out["steps"][1]) == {"tool", "args", "ok"} and out["steps"][1]["args"] == {"path": "calc.py"}
    assert out["chosen"] == 0 and out["candidates"][0]["verified"] is True
    assert set(out["candidates"][0]) == {"diff", "verified", "checks"}
    assert "+    return a + b" in out["diff"]
    assert "return a + b" in (project / "calc.py").read_text()  # --apply wrote it


def test_agent_prints_steps_and_the_diff_and_reports_an_unreachable_backend(project, tmp_path):
    with FakeOpenAIServer([chat_completion("", tool_calls=EDIT)]) as server:
        configure(project, server)
        done = squidcode(project, tmp_path, "agent", "calc.py", "fix add")
    assert done.returncode == 0, done.stderr
    assert "[2] edit" in done.stderr and "-> ok" in done.stderr
    assert done.stdout.startswith("--- a/calc.py\n+++ b/calc.py\n")
    assert "return a - b" in (project / "calc.py").read_text()  # not applied without --apply
    (project / ".squidcode.toml").write_text(
        '[agent]\nbackend = "openai"\nmodel = "m"\n'
        'base_url = "http://127.0.0.1:9/v1"\nretries = 0\npretest = false\n'
    )
    failed = squidcode(project, tmp_path, "agent", "calc.py", "fix add")
    assert failed.returncode == 3 and "cannot connect to the model server" in failed.stderr


def test_memory_list_and_forget(project, tmp_path):
    memory = MemoryStore(default_memory_path(tmp_path / "cache" / "squidcode"), str(project.resolve()))
    note = memory.remember("style", "Use f-strings", "agent")
    listed = squidcode(project, tmp_path, "memory", "list", "--json")
    assert [n["body"] for n in json.loads(listed.stdout)] == ["Use f-strings"]
    forgot = squidcode(project, tmp_path, "memory", "forget", str(note), "999999")
    assert forgot.returncode == 1 and "forgot 1 note(s); no note with id 999999" in forgot.stdout
    assert json.loads(squidcode(project, tmp_path, "memory", "list", "--json").stdout) == []
