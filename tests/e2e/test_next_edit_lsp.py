"""`squidcode/nextEdit` over LSP to the server subprocess: a rename typed in the editor, as
incremental didChange events, is offered at the next occurrence (also as
`textDocument/copilotInlineEdit`); then the edit is accepted and the next one offered; a request
about nothing, or a malformed one, gets no edit and the server keeps serving. Each offered edit is a
`next_edit` feedback episode; its accept command starts following the region to its checkpoints.
Through `textDocument/inlineCompletion`, the next edit on the cursor's line is an item with a range;
elsewhere the model completes at the cursor."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from feedback.store import FeedbackStore
from lsp_server.features.next_edit import COPILOT_INLINE_EDIT, NEXT_EDIT
from tests.conftest import SERVER_CMD
from tests.e2e.test_index_lsp import plain

pytestmark = pytest.mark.e2e

CODE = ("def report(items):\n    total = 0\n    for item in items:\n        total += item.price\n"
        "    return total\n")


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, tmp_path: Path, model_cache_dir):
    project = tmp_path / "ws"
    project.mkdir()
    (project / "report.py").write_text(CODE)
    lsp_client.db_path = tmp_path / "feedback.db"
    lsp_client.initialize_result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=project.as_uri(),
        initialization_options={"feedback": {"db_path": str(lsp_client.db_path), "checkpoints_s": [0.4]}},
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")]))
    lsp_client.uri = (project / "report.py").as_uri()
    yield
    await lsp_client.shutdown_session()


def change(client: LanguageClient, version: int, line: int, start: int, end: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=client.uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(line, start), types.Position(line, end)), text=text)]))


async def ask(client: LanguageClient, line: int, character: int) -> list[dict]:
    result = await client.protocol.send_request_async(NEXT_EDIT, {
        "textDocument": {"uri": client.uri, "version": 9},
        "position": {"line": line, "character": character}})
    return plain(result)["edits"]


async def test_a_typed_rename_is_offered_at_the_next_occurrence_then_the_one_after(client: LanguageClient):
    # Before anything is open, and with a malformed request: no edit, and the server keeps serving.
    assert await ask(client, 0, 0) == []
    result = await client.protocol.send_request_async(NEXT_EDIT, {"position": "nowhere"})
    assert plain(result) == {"edits": []}
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=client.uri, language_id="python", version=1, text=CODE)))
    assert await ask(client, 0, 0) == []  # no edit yet
    # Select `total` on line 1 and type `subtotal` over it, a character at a time.
    change(client, 2, 1, 4, 9, "s")
    for i, char in enumerate("ubtotal", start=5):
        change(client, i - 2, 1, i, i, char)
    (edit,) = await ask(client, 1, 12)
    assert edit["newText"] == "subtotal" and edit["kind"] == "rename"
    assert edit["range"] == {"start": {"line": 3, "character": 8}, "end": {"line": 3, "character": 13}}
    assert edit["textDocument"] == {"uri": client.uri, "version": 9}
    # The same answer in the shape copilot-lsp's Neovim client asks for.
    copilot = plain(await client.protocol.send_request_async(COPILOT_INLINE_EDIT, {
        "textDocument": {"uri": client.uri, "version": 9}, "position": {"line": 1, "character": 12}}))
    # (the same suggestion asked for again is the same episode: the same command)
    assert copilot["edits"] == [{"range": edit["range"], "text": "subtotal", "command": edit["command"],
                                 "textDocument": {"uri": client.uri, "version": 9}}]
    # Each offer is a `next_edit` episode; its command reports the acceptance.
    command = edit["command"]
    episode_id = command["arguments"][0]["episodeId"]
    assert command["command"] == "squidcode.completion.accept" and episode_id
    # The editor applies it (an edit of its own) and runs the command; the next occurrence comes next.
    change(client, 20, 3, 8, 13, "subtotal")
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=command["command"], arguments=command["arguments"]))
    (after,) = await ask(client, 3, 16)
    assert after["range"]["start"] == {"line": 4, "character": 11} and after["newText"] == "subtotal"
    symbols = await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="report"))
    assert symbols is not None  # still serving
    episode, events, statuses = await _recorded(client.db_path, episode_id)
    assert episode["kind"] == "next_edit" and episode["output"] == "subtotal"
    assert episode["extra"]["replaces"] == "total" and episode["extra"]["next_edit_kind"] == "rename"
    assert {"shown", "accepted"} <= events and statuses == ["unchanged"]  # kept at its checkpoint


async def _recorded(db_path: Path, episode_id: str) -> tuple[dict, set[str], list[str]]:
    """The stored episode, its event kinds and its outcomes, once its checkpoint has been judged."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if db_path.exists():
            store = FeedbackStore(db_path, readonly=True)
            try:
                items = store.episodes_with_outcomes()
                item = next((i for i in items if i.episode["id"] == episode_id), None)
            finally:
                store.close()
            if item is not None and item.outcomes:
                return item.episode, {e["kind"] for e in item.events}, [o["status"] for o in item.outcomes]
        await asyncio.sleep(0.2)
    raise AssertionError(f"episode {episode_id} has no outcome")


def inline(client: LanguageClient, line: int, character: int):
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=client.uri), position=types.Position(line, character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))


def applied(text: str, item: types.InlineCompletionItem) -> str:
    """`text` after the client replaces the item's range (one line) with its insert text."""
    lines = text.split("\n")
    rng = item.range
    assert rng.start.line == rng.end.line
    line = lines[rng.start.line]
    lines[rng.start.line] = line[: rng.start.character] + item.insert_text + line[rng.end.character :]
    return "\n".join(lines)


async def test_inline_completion_offers_the_next_edit_on_the_cursors_line_as_a_range(client: LanguageClient):
    assert client.initialize_result.capabilities.inline_completion_provider is not None
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=client.uri, language_id="python", version=1, text=CODE)))
    change(client, 2, 1, 4, 9, "s")  # `total` -> `subtotal` on line 1, typed
    for i, char in enumerate("ubtotal", start=5):
        change(client, i - 2, 1, i, i, char)
    text = CODE.replace("    total = 0", "    subtotal = 0")
    # The cursor at the end of line 3, right of the old name: the item replaces from the name to
    # the cursor, so that it holds the cursor, and applying it renames the name.
    result = await inline(client, 3, 27)
    (item,) = result.items
    assert item.range == types.Range(types.Position(3, 8), types.Position(3, 27))
    assert item.insert_text == "subtotal += item.price"
    assert applied(text, item) == text.replace("        total +=", "        subtotal +=")
    assert item.command.command == "squidcode.completion.accept"
    episode_id = item.command.arguments[0]["episodeId"]
    # The editor applies it and runs the command; on the last line, the cursor left of the name.
    change(client, 20, 3, 8, 27, item.insert_text)
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=item.command.command, arguments=item.command.arguments))
    text = applied(text, item)
    (item,) = (await inline(client, 4, 4)).items
    assert item.range == types.Range(types.Position(4, 4), types.Position(4, 16))
    assert applied(text, item) == text.replace("return total", "return subtotal")
    # A line without the old name: no next edit there, the model's completion at the cursor if any.
    other = await inline(client, 2, 22)
    assert other is None or all(i.range.start == i.range.end == types.Position(2, 22) for i in other.items)
    episode, events, _ = await _recorded(client.db_path, episode_id)
    assert episode["kind"] == "next_edit" and episode["output"] == "subtotal" and "accepted" in events


SHOP = "def price_of(item):\n    return item.price * item.quantity\n"
CART = "from shop import price_of\n\n\ndef total(items):\n    return sum(price_of(i) for i in items)\n"


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def model_client(lsp_client: LanguageClient, tmp_path: Path, model_cache_dir):
    """A server with the model path on (`completion.next_edit_model`) and Squid as by default."""
    project = tmp_path / "ws"
    project.mkdir()
    (project / "shop.py").write_text(SHOP)
    (project / "cart.py").write_text(CART)
    lsp_client.initialize_result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=project.as_uri(),
        initialization_options={"completion": {"next_edit_model": True},
                                "feedback": {"db_path": str(tmp_path / "feedback.db")}},
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")]))
    lsp_client.uri = (project / "cart.py").as_uri()
    yield
    await lsp_client.shutdown_session()


async def test_the_model_path_answers_with_related_code_composed_and_the_server_keeps_serving(
        model_client: LanguageClient):
    """No rename or repeat to carry on: the model path answers (its related code, `price_of`'s
    definition in shop.py, composed from Squid caches once the background has encoded it; the
    content of that composition is tests/unit/test_next_edit*.py's). Whatever the small model
    writes, an offered edit lies inside the document and the server keeps serving."""
    client = model_client
    for path, text in (("shop.py", SHOP), ("cart.py", CART)):
        client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=client.uri.replace("cart.py", path), language_id="python", version=1, text=text)))
    before = plain(await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="squidcode.status", arguments=[])))
    assert before["model"]["loaded"] is False
    change(client, 2, 4, 0, 0, "    items = list(items)\n")  # a line added: no rename, no repeat
    lines = CART.replace("    return", "    items = list(items)\n    return").split("\n")
    for _ in range(2):  # the second after the related code was encoded in the background
        edits = await ask(client, 5, 24)
        for edit in edits:
            start, end = edit["range"]["start"], edit["range"]["end"]
            assert 0 <= start["line"] <= end["line"] < len(lines) and edit["kind"] == "model", edits
        await asyncio.sleep(3)
    # Nothing but the model path asked for the model: it was loaded for it.
    status = plain(await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="squidcode.status", arguments=[])))
    assert status["model"]["loaded"] is True, status["model"]
    symbols = await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="price_of"))
    assert symbols is not None  # still serving
