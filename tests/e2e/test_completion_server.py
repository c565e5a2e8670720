"""Completions from a completion server (`agent.completion_server`, issue 23) against llama.cpp's
real C++ server on loopback: `/infill` with a tiny random-weight code model that has Qwen2.5-Coder's
FIM tokens (written here with the `gguf` package: no code model installs on this machine), and
`/v1/completions` with the embedded SmolLM2 behind an API key. Then the language server itself,
answering inline completions from the server, and from its own model while the server is down.

The binary is built once per machine by `.ci/install-llama-server.sh` (which `./dev test` runs);
this module fails, saying so, when it is missing. A server that accepts connections and never
answers is a plain socket here (a stand-in for a stuck server, named so).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from agent.completion import CompletionRequest, complete_served
from agent.completion_server import CompletionServer, HoleRequest
from agent.errors import BackendAuthError, BackendConnectionError, BackendTimeoutError
from context.config import CompletionConfig
from context.runtime import locate_embedded_gguf
from lsp_server.features.status import STATUS_COMMAND
from tests.conftest import SERVER_CMD
from tests.e2e.test_index_lsp import plain
from tests.fim_model import write_fim_gguf

pytestmark = pytest.mark.e2e

SERVER_DIR = Path(
    os.environ.get("SQUIDCODE_LLAMA_SERVER_DIR", Path.home() / ".cache" / "squidcode" / "llama-server")
)
LLAMA_SERVER = SERVER_DIR / "bin" / "llama-server"
KEY = "sk-squidcode-completions"
PREFIX = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        return "
SUFFIX = "\n\n\ndef write(path, text):\n    pass\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(model: Path, log_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    if not LLAMA_SERVER.exists():
        pytest.fail(f"no llama-server in {LLAMA_SERVER.parent}: "
                    "run .ci/install-llama-server.sh (./dev test does)")
    port = _free_port()
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "1",
         # /infill gives its reference chunks what the context holds beyond one batch.
         "-c", "4096", "-b", "1024", "-ub", "1024", "-np", "1", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).is_success:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama-server did not start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def infill_server(tmp_path_factory):
    """llama-server with the tiny FIM model: (url, log path)."""
    work = tmp_path_factory.mktemp("fim")
    proc, url = _start(write_fim_gguf(work / "tiny-fim.gguf"), work / "server.log")
    yield url, work / "server.log"
    _stop(proc)


@pytest.fixture(scope="module")
def openai_server(tmp_path_factory):
    """llama-server with the embedded model, behind an API key: its /v1 base URL."""
    work = tmp_path_factory.mktemp("openai")
    proc, url = _start(locate_embedded_gguf(), work / "server.log", "--api-key", KEY, "--alias", "smollm2")
    yield f"{url}/v1"
    _stop(proc)


def _config(**settings) -> CompletionConfig:
    return CompletionConfig(**{"server_timeout_s": 30.0, **settings})


def run(coro):
    return asyncio.run(coro)


async def _ask(config: CompletionConfig, hole: HoleRequest, cancelled=lambda: False):
    server = CompletionServer(config)
    try:
        return await server.complete(hole, cancelled)
    finally:
        await server.aclose()


def test_infill_sends_the_references_and_the_prompt_cache_keeps_them(infill_server):
    url, _ = infill_server
    config = _config(backend="llama-server", server_url=url)
    extra = (("util.py", "def helper(x):\n    return x * 2\n"),)
    hole = HoleRequest(PREFIX, SUFFIX, "io.py", extra, max_tokens=6)
    first = run(_ask(config, hole))
    assert first.text and first.new_tokens == 6 and first.stop_reason == "length"
    # The next keystroke: the same chunks and prefix, one more character typed.
    again = run(_ask(config, HoleRequest(PREFIX + "f", SUFFIX, "io.py", extra, max_tokens=6)))
    assert again.cached_tokens > first.prompt_tokens // 2
    bare = run(_ask(config, HoleRequest(PREFIX, SUFFIX, "io.py", (), max_tokens=6)))
    assert first.prompt_tokens > bare.prompt_tokens + 10  # the reference chunk was read
    # Greedy answers are the server's, the same each time.
    assert run(_ask(config, hole)).text == first.text


def test_a_cancelled_request_closes_the_stream_and_the_server_stops_generating(infill_server):
    url, _ = infill_server
    config = _config(backend="llama-server", server_url=url)
    started = []

    def cancelled() -> bool:
        started.append(time.monotonic())
        return len(started) > 20  # about 0.2 s in: the server is generating by then

    hole = HoleRequest(PREFIX, SUFFIX, "io.py", max_tokens=1500)  # ~10 s of tokens if left alone
    assert run(_ask(config, hole, cancelled)) is None
    closed = time.monotonic()
    while True:
        slots = httpx.get(f"{url}/slots", timeout=5).json()
        if not any(slot.get("is_processing") for slot in slots):
            break
        assert time.monotonic() - closed < 2.0, slots
        time.sleep(0.01)
    # It stopped long before the 1,500 tokens: the next request is answered at once.
    quick = time.monotonic()
    assert run(_ask(config, HoleRequest(PREFIX, SUFFIX, "io.py", max_tokens=2))).new_tokens == 2
    assert time.monotonic() - quick < 5.0


def test_openai_completions_with_a_key_and_a_wrong_key(openai_server, monkeypatch):
    monkeypatch.setenv("SQUIDCODE_COMPLETION_KEY", KEY)
    config = _config(backend="openai", server_url=openai_server, fim="off", server_model="smollm2",
                     server_api_key_env="SQUIDCODE_COMPLETION_KEY")
    request = CompletionRequest(PREFIX + SUFFIX, len(PREFIX), "python", "/tmp/io.py")

    async def served():
        server = CompletionServer(config)
        try:
            return await complete_served(server, request, config, lambda: False)
        finally:
            await server.aclose()

    completion = run(served())
    assert completion is not None and completion.text.strip()
    assert completion.served_by == "openai:smollm2" and completion.prompt.suffix.startswith("\n\n\ndef write")
    monkeypatch.setenv("SQUIDCODE_COMPLETION_KEY", "sk-wrong")
    with pytest.raises(BackendAuthError, match="refused the key"):
        run(_ask(config, HoleRequest(PREFIX, "", max_tokens=2)))


def test_typing_keeps_the_servers_prompt_cache_warm(openai_server, monkeypatch):
    """Two hundred keystrokes through real code, each sent as the served path cuts its window: the
    window's start holds between its steps, so the server reads almost every prompt from its cache
    (a window that slid with the cursor began at another line every line, and missed each time)."""
    import sysconfig

    from agent.completion import _server_window

    monkeypatch.setenv("SQUIDCODE_COMPLETION_KEY", KEY)
    config = _config(backend="openai", server_url=openai_server, fim="off", server_model="smollm2",
                     server_api_key_env="SQUIDCODE_COMPLETION_KEY")
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    chars, cursor = 512, 20_000

    async def typing():
        server = CompletionServer(config)
        answers = []
        try:
            for typed in range(200):
                window = _server_window(text[: cursor + typed], chars)
                answers.append(await server.complete(HoleRequest(window, "", max_tokens=1, stop=()),
                                                     lambda: False))
        finally:
            await server.aclose()
        return answers

    answers = run(typing())
    missed = [i for i, a in enumerate(answers) if a.cached_tokens < a.prompt_tokens // 2]
    lines = text[cursor: cursor + 200].count("\n")
    # The first request, then at most one per 128 characters typed; five lines were typed.
    assert len(missed) <= 3 < lines, (missed, lines)


def test_a_server_that_is_down_or_never_answers_is_a_clear_error_in_time():
    down = _config(backend="llama-server", server_url=f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(BackendConnectionError, match="cannot be reached"):
        run(_ask(down, HoleRequest(PREFIX, SUFFIX)))
    with socket.socket() as stuck:  # stand-in: accepts the connection, never answers
        stuck.bind(("127.0.0.1", 0))
        stuck.listen()
        slow = _config(backend="llama-server", server_url=f"http://127.0.0.1:{stuck.getsockname()[1]}",
                       server_timeout_s=0.5)
        began = time.monotonic()
        with pytest.raises(BackendTimeoutError, match="answered nothing in 0.5 s"):
            run(_ask(slow, HoleRequest(PREFIX, SUFFIX)))
        assert time.monotonic() - began < 3.0


# -- the language server ------------------------------------------------------------------------

SOURCE = "def read(path):\n    with open(path) as f:\n        return \n"


@pytest.fixture
def workspace(tmp_path):
    project = tmp_path / "ws"
    project.mkdir()
    (project / "io_util.py").write_text(SOURCE)
    return project


async def _open_and_complete(client: LanguageClient, project: Path):
    uri = (project / "io_util.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=SOURCE)))
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=2, character=15),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))


async def _session(client: LanguageClient, project: Path, completion: dict):
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=project.as_uri(),
        initialization_options={"completion": completion, "index": {"enabled": False}},
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")]))


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def lsp(lsp_client: LanguageClient, model_cache_dir):
    yield lsp_client  # it collects window/showMessage in `messages`
    await lsp_client.shutdown_session()


async def test_the_language_server_answers_from_the_completion_server(lsp, workspace, infill_server):
    url, log_path = infill_server
    before = log_path.read_text().count("stop processing")  # llama-server logs each task it ran
    await _session(lsp, workspace, {"backend": "llama-server", "server_url": url, "max_tokens": 6})
    result = await _open_and_complete(lsp, workspace)
    assert result is not None and result.items[0].insert_text
    assert log_path.read_text().count("stop processing") > before
    status = plain(await lsp.workspace_execute_command_async(
        types.ExecuteCommandParams(command=STATUS_COMMAND, arguments=[{}])))
    assert status["completion"] == {"backend": "llama-server", "server": url, "model": None,
                                    "serving": "server", "error": None}
    assert not [m for m in lsp.messages if "completion server" in m.message]


async def test_with_the_server_down_the_local_model_answers_and_says_so_once(lsp, workspace):
    dead = f"http://127.0.0.1:{_free_port()}"
    await _session(lsp, workspace, {"backend": "openai", "server_url": dead, "max_tokens": 6})
    first = await _open_and_complete(lsp, workspace)
    second = await _open_and_complete(lsp, workspace)
    assert first is not None and first.items[0].insert_text  # the embedded model answered
    assert second is not None
    said = [m.message for m in lsp.messages if "completion server" in m.message]
    assert len(said) == 1 and "cannot be reached" in said[0] and "local model answers" in said[0]
    status = plain(await lsp.workspace_execute_command_async(
        types.ExecuteCommandParams(command=STATUS_COMMAND, arguments=[{}])))
    assert status["completion"]["serving"] == "local" and "cannot be reached" in status["completion"]["error"]
