"""`squidcode/nextEdit` over LSP to the server subprocess: a rename typed in the editor, as
incremental didChange events, is offered at the next occurrence (also as
`textDocument/copilotInlineEdit`); then the edit is accepted and the next one offered; a request
about nothing, or a malformed one, gets no edit and the server keeps serving. Each offered edit is a
`next_edit` feedback episode; its accept command starts following the region to its checkpoints.
Through `textDocument/inlineCompletion`, the next edit on the cursor's line is an item with a range;
elsewhere the model completes at the cursor. A renamed function goes on, through the index, in the
files that import it (and not in one with its own function of that name)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.uris import to_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from feedback.store import FeedbackStore
from lsp_server.features.next_edit import COPILOT_INLINE_EDIT, NEXT_EDIT
from tests.conftest import SERVER_CMD
from tests.e2e.test_index_lsp import plain, wait_for

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


async def ask(client: LanguageClient, line: int, character: int, dismissed: list | None = None) -> list[dict]:
    params = {"textDocument": {"uri": client.uri, "version": 9},
              "position": {"line": line, "character": character}}
    if dismissed is not None:
        params["dismissed"] = dismissed
    result = await client.protocol.send_request_async(NEXT_EDIT, params)
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
    # The last use waved off: nothing is left (entries that are no place are left out, not an error),
    # and its episode says the user waved it off.
    waved = after["range"]
    assert await ask(client, 3, 16, [{"uri": client.uri, "range": waved}, {"range": 3},
                                     {"uri": client.uri, "range": {"start": "x"}}, "nowhere"]) == []
    waved_id = after["command"]["arguments"][0]["episodeId"]
    assert await _events(client.db_path, waved_id, "dismissed") == [{"reason": "waved off"}]


async def _stored(db_path: Path, episode_id: str, ready, what: str):
    """The stored episode (its `EpisodeOutcomes`) once `ready(item)` holds; 20 s at most."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if db_path.exists():
            store = FeedbackStore(db_path, readonly=True)
            try:
                items = store.episodes_with_outcomes()
                item = next((i for i in items if i.episode["id"] == episode_id), None)
            finally:
                store.close()
            if item is not None and ready(item):
                return item
        await asyncio.sleep(0.2)
    raise AssertionError(f"episode {episode_id} has no {what}")


async def _recorded(db_path: Path, episode_id: str) -> tuple[dict, set[str], list[str]]:
    """The stored episode, its event kinds and its outcomes, once its checkpoint has been judged."""
    item = await _stored(db_path, episode_id, lambda i: i.outcomes, "outcome")
    return item.episode, {e["kind"] for e in item.events}, [o["status"] for o in item.outcomes]


async def _events(db_path: Path, episode_id: str, kind: str) -> list[dict]:
    """The data of the episode's events of `kind`, once there is one."""
    item = await _stored(db_path, episode_id, lambda i: any(e["kind"] == kind for e in i.events),
                         f"{kind} event")
    return [e["data"] for e in item.events if e["kind"] == kind]


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


# -- a rename carried to other files, through the index ---------------------------------------------

PACKAGE = {
    "shop/report.py": ("def total(items):\n    return sum(item.price for item in items)\n\n\n"
                       "def report(items):\n    return f\"{total(items):.2f}\"\n"),
    "shop/checkout.py": ("from shop.report import report, total\n\n\ndef pay(cart):\n"
                         "    due = total(cart.items)\n    return due, report(cart.items)\n"),
    "shop/receipt.py": ("import shop.report as rep\n\n\ndef print_receipt(cart):\n"
                        "    print(rep.total(cart.items))\n"),
    "net/conn.py": "def connect(host, timeout):\n    return (host, timeout)\n\n\ndef reconnect(host):\n"
                   "    return connect(host, timeout=5)\n",
    "net/pool.py": ("from net.conn import connect\n\n\ndef open_pool(host):\n"
                    "    return [connect(host, timeout=5)]\n"),
    # Its own `total`, imported from nowhere: another function of the same name.
    "shop/tax.py": "def total(amounts):\n    return sum(amounts)\n\n\ndef with_tax(amounts):\n"
                   "    return total(amounts) * 1.2\n",
}


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def shop_client(lsp_client: LanguageClient, tmp_path: Path):
    project = tmp_path / "ws"
    for rel, text in PACKAGE.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    lsp_client.project = project
    lsp_client.db_path = tmp_path / "feedback.db"
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=project.as_uri(),
        initialization_options={"feedback": {"db_path": str(lsp_client.db_path), "checkpoints_s": [0.4]},
                                "index": {"debounce_ms": 20}},
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")]))
    yield
    await lsp_client.shutdown_session()


async def test_a_renamed_function_goes_on_in_the_files_that_import_it_and_not_in_others(
        shop_client: LanguageClient):
    client, project = shop_client, shop_client.project
    uris = {rel: (project / rel).as_uri() for rel in PACKAGE}
    versions = dict.fromkeys(PACKAGE, 1)

    async def indexed():
        found = await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="with_tax"))
        return bool(found)

    await wait_for(indexed, timeout=60)

    def open_file(rel: str) -> None:
        client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=uris[rel], language_id="python", version=1, text=PACKAGE[rel])))

    def edit(rel: str, found: dict) -> None:
        versions[rel] += 1
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uris[rel], version=versions[rel]),
            content_changes=[types.TextDocumentContentChangePartial(range=types.Range(
                types.Position(**found["range"]["start"]), types.Position(**found["range"]["end"])),
                text=found["newText"])]))

    async def next_in(rel: str, line: int, character: int) -> list[dict]:
        result = await client.protocol.send_request_async(NEXT_EDIT, {
            "textDocument": {"uri": uris[rel], "version": versions[rel]},
            "position": {"line": line, "character": character}})
        return plain(result)["edits"]

    def at(found: dict) -> tuple[str, int, int]:
        start = found["range"]["start"]
        rel = next(r for r, u in uris.items() if Path(to_fs_path(found["textDocument"]["uri"])).resolve()
                   == Path(to_fs_path(u)).resolve())
        return rel, start["line"], start["character"]

    open_file("shop/report.py")
    name = {"start": {"line": 0, "character": 4}, "end": {"line": 0, "character": 9}}
    edit("shop/report.py", {"range": name, "newText": "subtotal"})  # the definition renamed
    (first,) = await next_in("shop/report.py", 0, 12)
    assert at(first) == ("shop/report.py", 5, 14) and first["newText"] == "subtotal"  # its own file first
    edit("shop/report.py", first)
    # No use left here: the next file that imports it, at its import; that file is not open.
    (second,) = await next_in("shop/report.py", 5, 22)
    assert at(second) == ("shop/checkout.py", 0, 32) and second["newText"] == "subtotal", second
    assert second["textDocument"]["version"] is None and second["kind"] == "rename"
    # That file waved off: the next one that takes part.
    result = await client.protocol.send_request_async(NEXT_EDIT, {
        "textDocument": {"uri": uris["shop/report.py"], "version": versions["shop/report.py"]},
        "position": {"line": 5, "character": 22},
        "dismissed": [{"uri": second["textDocument"]["uri"], "range": second["range"]}]})
    (passed,) = plain(result)["edits"]
    assert at(passed) == ("shop/receipt.py", 4, 14), passed
    # copilot-lsp's client draws an edit in the buffer it asked from: it gets none in another file.
    copilot = plain(await client.protocol.send_request_async(COPILOT_INLINE_EDIT, {
        "textDocument": {"uri": uris["shop/report.py"], "version": versions["shop/report.py"]},
        "position": {"line": 5, "character": 22}}))
    assert copilot == {"edits": []}
    # The editor opens it, applies the edit and reports it; the rest of that file comes next.
    open_file("shop/checkout.py")
    edit("shop/checkout.py", second)
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=second["command"]["command"], arguments=second["command"]["arguments"]))
    (third,) = await next_in("shop/checkout.py", 0, 40)
    assert at(third) == ("shop/checkout.py", 4, 10)
    edit("shop/checkout.py", third)
    # Then the file that uses it as the module's attribute (`rep.total`), from the index, read from disk.
    (fourth,) = await next_in("shop/checkout.py", 4, 18)
    assert at(fourth) == ("shop/receipt.py", 4, 14) and fourth["newText"] == "subtotal"
    open_file("shop/receipt.py")
    edit("shop/receipt.py", fourth)
    # tax.py's own `total` takes no part: nothing is left to offer.
    assert await next_in("shop/receipt.py", 4, 22) == []
    episode_id = second["command"]["arguments"][0]["episodeId"]
    episode, events, statuses = await _recorded(client.db_path, episode_id)
    assert episode["uri"] == second["textDocument"]["uri"] and episode["output"] == "subtotal"
    assert "accepted" in events and statuses == ["unchanged"]


async def test_a_rename_never_goes_to_a_file_outside_the_workspace(shop_client: LanguageClient,
                                                                  tmp_path: Path):
    """The importers, indexed and offered, then made links to copies outside the workspace: asked
    again at once (the index still lists them), nothing is offered there and the copies are untouched."""
    client, project = shop_client, shop_client.project

    async def indexed():
        return bool(await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="with_tax")))

    await wait_for(indexed, timeout=60)
    uri = (project / "shop/report.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=PACKAGE["shop/report.py"])))
    text = PACKAGE["shop/report.py"].replace("total", "subtotal")  # the definition, then its use
    for version, new in ((2, text.replace("{subtotal(", "{total(")), (3, text)):
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=new)]))

    async def ask() -> list[dict]:
        result = await client.protocol.send_request_async(NEXT_EDIT, {
            "textDocument": {"uri": uri, "version": 3}, "position": {"line": 5, "character": 20}})
        return plain(result)["edits"]

    (offered,) = await ask()
    assert offered["textDocument"]["uri"].endswith("/shop/checkout.py")
    outside = tmp_path / "outside"
    outside.mkdir()
    for rel in ("shop/checkout.py", "shop/receipt.py"):
        copy = outside / Path(rel).name
        copy.write_text(PACKAGE[rel])
        (project / rel).unlink()
        (project / rel).symlink_to(copy)
    assert await ask() == []
    assert (outside / "checkout.py").read_text() == PACKAGE["shop/checkout.py"]


async def test_a_change_with_no_place_left_in_its_file_goes_to_another_file_with_the_same_call(
        shop_client: LanguageClient):
    client, project = shop_client, shop_client.project

    async def indexed():
        return bool(await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="open_pool")))

    await wait_for(indexed, timeout=60)
    uri = (project / "net/conn.py").as_uri()
    text = PACKAGE["net/conn.py"]
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=text)))
    line = text.splitlines().index("    return connect(host, timeout=5)")
    at = len("    return connect(host, timeout=")
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(line, at), types.Position(line, at + 1)), text="10")]))
    result = await client.protocol.send_request_async(NEXT_EDIT, {
        "textDocument": {"uri": uri, "version": 2}, "position": {"line": line, "character": at + 2}})
    (edit,) = plain(result)["edits"]
    pool = PACKAGE["net/pool.py"]
    assert edit["textDocument"]["uri"].endswith("/net/pool.py") and edit["kind"] == "repeat"
    row = pool.splitlines()[edit["range"]["start"]["line"]]
    start, end = edit["range"]["start"]["character"], edit["range"]["end"]["character"]
    assert row[:start] + edit["newText"] + row[end:] == "    return [connect(host, timeout=10)]"
