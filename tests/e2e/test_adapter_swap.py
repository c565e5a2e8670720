"""Hot swap: with the server running, a newly promoted adapter is applied without a restart, the
next completion is generated under it, and a rollback returns to the base model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from context.config import ModelConfig
from context.runtime import ModelRuntime
from feedback.train.adapters import AdapterRegistry
from lsp_server.features.adapters import TRAIN_STATUS_COMMAND
from tests.conftest import SERVER_CMD
from tests.unit.test_context_adapters import write_adapter_for

pytestmark = pytest.mark.e2e

SOURCE = "def add(a, b):\n    return "


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, tmp_path: Path, model_cache_dir):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text(SOURCE)
    lsp_client.train_dir = tmp_path / "train"
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
            initialization_options={
                "completion": {"max_tokens": 4},
                "index": {"enabled": False},
                "train": {"dir": str(lsp_client.train_dir)},
            },
        )
    )
    lsp_client.doc_uri = (workspace / "calc.py").as_uri()
    lsp_client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=lsp_client.doc_uri, language_id="python", version=1, text=SOURCE
            )
        )
    )
    yield
    await lsp_client.shutdown_session()


async def train_status(client) -> dict:
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=TRAIN_STATUS_COMMAND, arguments=[{}])
    )
    return result._asdict() if hasattr(result, "_asdict") else dict(result)


async def complete(client) -> types.InlineCompletionList | None:
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=client.doc_uri),
            position=types.Position(1, 11),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )


async def wait_for_loaded(client, adapter, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await train_status(client)
        if status["loadedAdapter"] == adapter:
            return status
        await asyncio.sleep(0.2)
    raise AssertionError(f"adapter {adapter} not loaded in time: {status}")


async def test_promoted_adapter_is_picked_up_without_restart(client, model_cache_dir):
    assert await complete(client) is not None
    status = await train_status(client)
    assert status["loadedAdapter"] is None and status["adapter"] is None and status["state"] == "idle"

    model_dir = ModelRuntime(ModelConfig(), model_cache_dir)._model_dir()
    from transformers import AutoConfig

    registry = AdapterRegistry(client.train_dir / "adapters")
    # A promoted adapter that does not load: the user is told, the base model keeps serving.
    broken = registry.add_version(lambda d: (d / "adapter_config.json").write_text("{}") and None, {})
    registry.promote(broken.id)
    deadline = time.monotonic() + 60
    while not any(broken.id in m.message for m in client.messages) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert any(broken.id in m.message and m.type == types.MessageType.Error for m in client.messages)
    assert (await train_status(client))["loadedAdapter"] is None
    assert await complete(client) is not None
    ref = registry.add_version(
        lambda d: write_adapter_for(AutoConfig.from_pretrained(str(model_dir)), d / "x", 1) and None, {}
    )
    # The adapter files go straight into the version folder.
    for item in (ref.path / "x").iterdir():
        item.rename(ref.path / item.name)
    registry.promote(ref.id)
    status = await wait_for_loaded(client, ref.id)
    assert status["adapter"] == ref.id
    after = await complete(client)
    assert after is not None and (await train_status(client))["loadedAdapter"] == ref.id

    assert registry.rollback() == broken.id and registry.rollback() is None
    await wait_for_loaded(client, None)
    assert await complete(client) is not None


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def member(lsp_client: LanguageClient, tmp_path: Path, model_cache_dir):
    """A team member's server, pulling the team's adapter from a real collector process."""
    from tests.unit.feedback.test_upload import TOKEN, Collector, free_port

    (tmp_path / "collector").mkdir()
    collector = Collector(tmp_path / "collector", free_port()).start()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    lsp_client.train_dir, lsp_client.collector, lsp_client.token = tmp_path / "train", collector, TOKEN
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
        initialization_options={
            "index": {"enabled": False}, "train": {"dir": str(lsp_client.train_dir)},
            "feedback": {"endpoint": collector.url, "token": TOKEN, "team_adapter": True,
                         "team_adapter_interval_s": 0.5},
        }))
    yield
    await lsp_client.shutdown_session()
    collector.stop()


async def test_a_published_team_adapter_is_pulled_and_used_without_restart(member, model_cache_dir, tmp_path):
    from transformers import AutoConfig

    from feedback.team_adapters import publish_adapter

    assert (await train_status(member))["loadedAdapter"] is None
    model_dir = ModelRuntime(ModelConfig(), model_cache_dir)._model_dir()
    adapter = write_adapter_for(AutoConfig.from_pretrained(str(model_dir)), tmp_path / "published", 2)
    publish_adapter(member.collector.url, member.token, adapter, "team-7", {"held_out": 0.71})
    status = await wait_for_loaded(member, "v0001")  # installed as the member's first version
    assert status["adapter"] == "v0001"
    pulled = AdapterRegistry(member.train_dir / "adapters").current()
    assert pulled.meta["team_version"] == "team-7" and pulled.meta["source"] == "team"
