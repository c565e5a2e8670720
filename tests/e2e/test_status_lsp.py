"""`squidcode.status` and the `squidcode/status` notification, over LSP to the server subprocess."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from lsp_server.features.status import STATUS_COMMAND, STATUS_NOTIFICATION
from tests.conftest import SERVER_CMD
from tests.e2e.test_index_lsp import plain

pytestmark = pytest.mark.e2e


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, tmp_path: Path, model_cache_dir):
    project = tmp_path / "ws"
    project.mkdir()
    (project / "shop.py").write_text("def total(items):\n    return sum(items)\n")
    lsp_client.statuses = []

    @lsp_client.feature(STATUS_NOTIFICATION)
    def on_status(params):
        lsp_client.statuses.append(plain(params))

    result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=project.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")],
        )
    )
    lsp_client.init_result = result
    yield
    await lsp_client.shutdown_session()


async def wait_for(predicate, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def test_status_command_and_notification(client: LanguageClient):
    commands = client.init_result.capabilities.execute_command_provider.commands
    assert STATUS_COMMAND in commands

    # The notification goes out on its own once the model has loaded and the index is built.
    loaded = await wait_for(lambda: next(
        (s for s in client.statuses if s["model"]["loaded"] and s["index"].get("state") == "ready"), None))
    assert loaded["model"]["name"] == "SmolLM2-135M-Instruct"
    assert loaded["model"]["device"] == "cpu" and loaded["model"]["dtype"] == "float32"
    assert loaded["model"]["error"] is None
    assert loaded["index"]["files"] == 1
    # Earlier notifications said the model was not loaded yet; none repeats the one before it.
    assert not client.statuses[0]["model"]["loaded"]
    assert all(a != b for a, b in zip(client.statuses, client.statuses[1:], strict=False))

    status = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=STATUS_COMMAND, arguments=[{}])
    )
    status = plain(status)
    assert status["version"] == client.init_result.server_info.version
    assert status["model"] == loaded["model"]
    assert status["index"]["state"] == "ready" and status["index"]["symbols"] >= 1
    # Recording is local and on by default; sharing is opt-in.
    assert status["feedback"] == {"record": True, "share": False}
    assert status["training"]["state"] == "off"


async def test_unknown_command_is_an_error_and_the_server_keeps_serving(client: LanguageClient):
    with pytest.raises(Exception, match="not defined"):
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="squidcode.noSuchCommand", arguments=[{}])
        )
    status = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=STATUS_COMMAND)
    )
    assert plain(status)["version"]
