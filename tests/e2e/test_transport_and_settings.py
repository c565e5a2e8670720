"""`squidcode serve --tcp`, and settings read from the user's config file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.conftest import DEMO_WORKSPACE, SERVER_CMD

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def read_frame(sock: socket.socket) -> dict:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(4096)
    header, rest = buffer.split(b"\r\n\r\n", 1)
    length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(4096)
    return json.loads(rest[:length])


def test_serve_over_tcp_answers_initialize():
    port = free_port()
    server = subprocess.Popen([*SERVER_CMD, "--tcp", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the TCP server never started listening"
                time.sleep(0.2)
        with sock:
            sock.sendall(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"processId": None, "rootUri": None, "capabilities": {}}}))
            reply = read_frame(sock)
        assert reply["id"] == 1
        assert reply["result"]["serverInfo"]["name"] == "squidcode"
        assert "inlineCompletionProvider" in reply["result"]["capabilities"]
    finally:
        server.terminate()
        server.wait(timeout=30)


# The user config file must exist before the fixture below starts the server with this
# XDG_CONFIG_HOME, so it is written when the module is imported.
USER_CONFIG_HOME = Path(tempfile.mkdtemp(prefix="squidcode-xdg-config-"))
(USER_CONFIG_HOME / "squidcode").mkdir()
(USER_CONFIG_HOME / "squidcode" / "config.toml").write_text(
    '[completion]\nenabled = false\n\n[model]\ndevice = "quantum"\n'
)


@pytest_lsp.fixture(
    config=ClientServerConfig(
        server_command=SERVER_CMD,
        server_env={**os.environ, "XDG_CONFIG_HOME": str(USER_CONFIG_HOME)},
    )
)
async def client(lsp_client: LanguageClient, model_cache_dir):
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("neovim"),
            root_uri=DEMO_WORKSPACE.as_uri(),
        )
    )
    yield
    await lsp_client.shutdown_session()


async def test_user_config_file_applies_and_its_bad_values_are_reported(client: LanguageClient):
    text = (DEMO_WORKSPACE / "inventory.py").read_text()
    uri = (DEMO_WORKSPACE / "inventory.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    # completion.enabled = false from the user's file: nothing is offered.
    result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=0, character=0),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    assert result is None
    warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
    assert any("model.device" in w and "quantum" in w and "config.toml" in w for w in warnings), warnings
    # The server fell back to the default device and keeps serving: a later settings change works.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"squidcode": {"completion": {"enabled": True, "max_tokens": 8, "debounce_ms": 0}}}))
    text_lines = text.split("\n")
    result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=len(text_lines) - 2, character=len(text_lines[-2])),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    assert isinstance(result, types.InlineCompletionList) and result.items[0].insert_text.strip()
