"""Feedback as an editor sees it: the accept command on each inline completion, keep/revert signals
followed through incremental didChange, and the consent commands (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from feedback.store import FeedbackStore
from tests.conftest import DEMO_WORKSPACE, SERVER_CMD

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

FEEDBACK_COMMANDS = {
    "squidcode.completion.accept",
    "squidcode.feedback.status",
    "squidcode.feedback.setRecord",
    "squidcode.feedback.setShare",
}


# One server for the module (the tests run in order; the consent test, last, switches recording off).
@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD), scope="module")
async def client(lsp_client: LanguageClient, model_cache_dir, tmp_path_factory):
    lsp_client.db_path = tmp_path_factory.mktemp("feedback") / "feedback.db"
    options = {
        "completion": {"max_tokens": 8, "debounce_ms": 0},
        "index": {"enabled": False},
        "feedback": {"db_path": str(lsp_client.db_path), "checkpoints_s": [0.4, 0.8], "dismiss_after_s": 30},
    }
    lsp_client.initialize_result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=DEMO_WORKSPACE.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=DEMO_WORKSPACE.as_uri(), name="demo")],
            initialization_options=options,
        )
    )
    yield
    await lsp_client.shutdown_session()


def open_document(client: LanguageClient, text: str, name: str) -> str:
    uri = (DEMO_WORKSPACE / name).as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    return uri


def change(client: LanguageClient, uri: str, version: int, start, end, text: str) -> None:
    rng = types.Range(start=types.Position(*start), end=types.Position(*end))
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=rng, text=text)],
        )
    )


async def command(client: LanguageClient, name: str, argument=None):
    arguments = None if argument is None else [argument]
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=name, arguments=arguments)
    )


async def complete(client: LanguageClient, uri: str, line: int, character: int) -> types.InlineCompletionItem:
    result = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    items = result.items if isinstance(result, types.InlineCompletionList) else result
    assert items, "the model offered no completion"
    return items[0]


def outcomes(db_path: Path, episode_id: str) -> list[tuple[float, str]]:
    store = FeedbackStore(db_path, readonly=True)
    try:
        for item in store.episodes_with_outcomes():
            if item.episode["id"] == episode_id:
                return [(o["checkpoint_s"], o["status"]) for o in item.outcomes]
        return []
    finally:
        store.close()


def stored_episode(db_path: Path, episode_id: str) -> dict:
    store = FeedbackStore(db_path, readonly=True)
    try:
        return next(item.episode for item in store.episodes_with_outcomes()
                    if item.episode["id"] == episode_id)
    finally:
        store.close()


async def wait_for_outcomes(db_path: Path, episode_id: str, count: int) -> list[tuple[float, str]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if db_path.exists() and len(found := outcomes(db_path, episode_id)) >= count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {count} outcomes for {episode_id}: {outcomes(db_path, episode_id)}")


async def test_feedback_commands_are_advertised(client: LanguageClient):
    provider = client.initialize_result.capabilities.execute_command_provider
    assert FEEDBACK_COMMANDS <= set(provider.commands)
    # Renames carry tracked regions to the new name.
    assert client.initialize_result.capabilities.workspace.file_operations.did_rename is not None
    status = await command(client, "squidcode.feedback.status", {})
    assert status["record"] is True and status["share"] is False and status["storage"] == "full"
    assert status["db"] == str(client.db_path)


async def test_accepted_completion_is_tracked_until_undone(client: LanguageClient):
    text = "def area(width, height):\n    return "
    uri = open_document(client, text, "area_feedback.py")
    item = await complete(client, uri, 1, 11)
    assert item.command.command == "squidcode.completion.accept"
    (argument,) = item.command.arguments
    episode_id = argument["episodeId"]
    assert isinstance(episode_id, str) and len(episode_id) == 32
    inserted = item.insert_text
    lines = inserted.split("\n")
    end = (1 + len(lines) - 1, (11 if len(lines) == 1 else 0) + len(lines[-1]))
    # The client inserts the text, then runs the item's command (VS Code's order).
    change(client, uri, 2, (1, 11), (1, 11), inserted)
    assert await command(client, "squidcode.completion.accept", argument) == {}
    # Typing elsewhere (above) moves the region; then the user undoes the completion.
    change(client, uri, 3, (0, 0), (0, 0), "# geometry\n")
    change(client, uri, 4, (2, 11), (end[0] + 1, end[1]), "")
    found = await wait_for_outcomes(client.db_path, episode_id, 2)
    assert found == [(0.4, "reverted"), (0.8, "reverted")]
    status = await command(client, "squidcode.feedback.status", {})
    assert status["episodes"] >= 1 and status["events"] >= 2


async def test_kept_completion_reads_unchanged(client: LanguageClient):
    text = "def double(value):\n    return "
    uri = open_document(client, text, "double_feedback.py")
    item = await complete(client, uri, 1, 11)
    argument = item.command.arguments[0]
    # This time the accept command arrives before the client reports the insertion.
    assert await command(client, "squidcode.completion.accept", argument) == {}
    change(client, uri, 2, (1, 11), (1, 11), item.insert_text)
    change(client, uri, 3, (0, 0), (0, 0), "\n\n")
    found = await wait_for_outcomes(client.db_path, argument["episodeId"], 2)
    assert [status for _, status in found] == ["unchanged", "unchanged"]
    # Recorded with the prompt it was served: its window (the whole document here) and token ids.
    episode = stored_episode(client.db_path, argument["episodeId"])
    served = episode["extra"]["served_prompt"]
    assert episode["prompt_text"] == text and served["start"] == 0 and served["ids"]
    assert not served["heal"].strip() and served["max_tokens"] == 8


async def test_consent_switches_and_bad_arguments(client: LanguageClient):
    off = await command(client, "squidcode.feedback.setRecord", {"on": False})
    assert off["record"] is False
    uri = open_document(client, "def half(x):\n    return ", "half_feedback.py")
    item = await complete(client, uri, 1, 11)
    assert list(item.command.arguments) == [{"episodeId": ""}]  # nothing recorded
    with pytest.raises(JsonRpcException, match="endpoint"):
        await command(client, "squidcode.feedback.setShare", {"on": True})
    with pytest.raises(JsonRpcException, match="on"):
        await command(client, "squidcode.feedback.setRecord", {"on": "yes"})
    with pytest.raises(JsonRpcException, match="episodeId"):
        await command(client, "squidcode.completion.accept", {"episodeId": 7})
    # Lua clients send an empty table as []: it reads as {}.
    status = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="squidcode.feedback.status", arguments=[[]])
    )
    assert status["record"] is False
    back_on = await command(client, "squidcode.feedback.setRecord", {"on": True})
    assert back_on["record"] is True
    # The choice is kept beside the store, so it outlives the server.
    assert (client.db_path.parent / "feedback-consent.json").is_file()


async def test_changing_the_model_after_an_output_is_a_switch(client: LanguageClient):
    # Last in the module: the server then tries to load a model that does not exist.
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"squidcode": {"model": {"path": "/nonexistent/model-x"}}}
        )
    )
    deadline = time.monotonic() + 20
    switches = []
    while time.monotonic() < deadline and not switches:
        await asyncio.sleep(0.2)
        store = FeedbackStore(client.db_path, readonly=True)
        switches = list(store.rows("model_switches"))
        store.close()
    (switch,) = switches
    assert (switch["from_model"], switch["to_model"]) == ("SmolLM2-135M-Instruct", "/nonexistent/model-x")
    assert switch["last_episode_id"] and switch["seconds_after_output"] >= 0
