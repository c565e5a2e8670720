"""The agent's OpenAI-compatible backend against a real server on loopback: llama.cpp's, as
llama-cpp-python serves it, with the embedded model's GGUF file.

The server is built once per machine by `.ci/install-llama-server.sh` (which `./dev test` runs); this
module fails, saying so, when it is missing. It answers one choice whatever `n` asks for and does no
function calls, which is what the backend's one-request-per-missing-candidate fallback and
`agent.tool_protocol = "text"` are for.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent.backends import Conversation, OpenAIBackend
from agent.errors import BackendAuthError
from agent.session import served_model
from context.config import AgentConfig
from context.runtime import locate_embedded_gguf

REPO = Path(__file__).resolve().parents[2]
SERVER_DIR = Path(
    os.environ.get("SQUIDCODE_LLAMA_SERVER_DIR", Path.home() / ".cache" / "squidcode" / "llama-server")
)
KEY = "sk-squidcode-e2e"
ALIAS = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Write a Python function that adds."}]
CONV = Conversation("You are a helpful assistant.", messages=ASK)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    python = SERVER_DIR / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no llama.cpp server in {SERVER_DIR}: run .ci/install-llama-server.sh (./dev test does)")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(python), "-m", "llama_cpp.server", "--model", str(locate_embedded_gguf()),
         "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1", "--n_ctx", "2048",
         "--model_alias", ALIAS, "--api_key", KEY],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                auth = {"Authorization": f"Bearer {KEY}"}
                if httpx.get(f"{base_url}/models", headers=auth, timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the llama.cpp server did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield base_url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_the_served_model_is_found_and_k_candidates_come_back_though_the_server_ignores_n(
    llama_server, monkeypatch
):
    base_url, _ = llama_server
    monkeypatch.setenv("SQUIDCODE_E2E_KEY", KEY)
    config = AgentConfig(backend="openai", base_url=base_url, api_key_env="SQUIDCODE_E2E_KEY")
    assert served_model(config) == ALIAS
    backend = OpenAIBackend(base_url, ALIAS, KEY, timeout_s=120)
    samples = backend.sample(CONV, 3, temperature=0.9, max_tokens=12, seed=7)  # streamed
    assert len(samples) == 3
    assert all(s.text.strip() and s.tokens > 0 for s in samples)
    greedy = [backend.sample(CONV, 1, temperature=0.0, max_tokens=12, seed=s)[0].text for s in (1, 2)]
    assert greedy[0] == greedy[1]  # temperature 0 is deterministic through the whole path
    backend.close()


def test_a_wrong_key_is_a_clear_auth_error(llama_server):
    base_url, _ = llama_server
    with pytest.raises(BackendAuthError, match="refused the API key"):
        OpenAIBackend(base_url, ALIAS, "sk-wrong", retries=0).sample(CONV, 1, temperature=0.0, max_tokens=4)


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "calc.py").write_text('"""Arithmetic."""\n\n\ndef add(a, b):\n    return a - b\n')
    (root / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (root / ".squidcode.toml").write_text("")
    return root


def test_squidcode_agent_runs_an_episode_over_http_with_the_text_protocol(llama_server, tmp_path):
    base_url, log_path = llama_server
    project = _project(tmp_path / "proj")
    (project / ".squidcode.toml").write_text(
        f'[agent]\nbackend = "openai"\nbase_url = "{base_url}"\napi_key_env = "SQUIDCODE_E2E_KEY"\n'
        'tool_protocol = "text"\nk = 2\nmax_steps = 2\nmax_step_tokens = 64\nmemory = false\n'
    )
    before = log_path.read_text().count("POST /v1/chat/completions")
    env = {**os.environ, "SQUIDCODE_E2E_KEY": KEY, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "lsp_server", "agent", "calc.py", "add() subtracts; fix it", "--json"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode in (0, 3), done.stderr  # 3: the episode ended without a verified edit
    out = json.loads(done.stdout)
    assert (done.returncode == 0) == (out["chosen"] is not None)
    tools = [s["tool"] for s in out["steps"]]
    assert tools[0] == "run_tests" and len(tools) >= 2  # the pretest, then what the model answered
    assert set(tools) <= {"run_tests", "read_file", "search", "grep", "symbols", "lint", "pr_history", "edit",
                          "memory", "invalid"}
    for candidate in out["candidates"]:  # whatever the model wrote was verified, not trusted
        assert set(candidate["checks"]) >= {"format", "applies"}
    requests = log_path.read_text().count("POST /v1/chat/completions") - before
    assert requests >= len(tools) - 1  # every model answer came over HTTP from the server
    assert "return a - b" in (project / "calc.py").read_text()  # nothing applied without --apply
