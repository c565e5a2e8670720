"""The language server as an editor sees it: a subprocess spoken to over LSP by pytest-lsp's client,
answering with the real embedded model."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from agent.completion import CompletionRequest, complete
from context.config import CompletionConfig
from tests.conftest import DEMO_WORKSPACE, SERVER_CMD

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16
# Squid off: these tests compare the server's generation with the same prompt generated in this
# process; composed reference documents have their own tests (test_squid_lsp.py).
INIT_OPTIONS = {"completion": {"max_tokens": MAX_TOKENS, "debounce_ms": 0}, "squid": {"enabled": False}}
DEMO_FILE = DEMO_WORKSPACE / "inventory.py"


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, model_cache_dir):
    lsp_client.initialize_result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=DEMO_WORKSPACE.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=DEMO_WORKSPACE.as_uri(), name="demo")],
            initialization_options=INIT_OPTIONS,
        )
    )
    yield
    await lsp_client.shutdown_session()


def open_document(client: LanguageClient, text: str, name: str = "inventory.py") -> str:
    uri = (DEMO_WORKSPACE / name).as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    return uri


def inline_params(uri: str, line: int, character: int) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )


def demo_cursor(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines) - 2, len(lines[-2])


async def test_capabilities_advertise_inline_completion_and_incremental_sync(client: LanguageClient):
    result: types.InitializeResult = client.initialize_result
    assert result.server_info.name == "squidcode"
    caps = result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    sync = caps.text_document_sync
    change = sync.change if isinstance(sync, types.TextDocumentSyncOptions) else sync
    assert change == types.TextDocumentSyncKind.Incremental


async def test_inline_completion_is_the_real_models_greedy_continuation(client: LanguageClient, runtime):
    text = DEMO_FILE.read_text()
    uri = open_document(client, text)
    line, character = demo_cursor(text)
    result = await client.text_document_inline_completion_async(inline_params(uri, line, character))
    assert isinstance(result, types.InlineCompletionList)
    assert len(result.items) == 1
    item = result.items[0]
    assert item.insert_text.strip()
    assert item.range.start == types.Position(line=line, character=character)
    # Greedy decoding is deterministic: the same model in this process must say the same thing.
    offset = len(text) - len(text.split("\n")[-1]) - 1
    expected = complete(runtime, CompletionRequest(text, offset), CompletionConfig(max_tokens=MAX_TOKENS))
    assert expected is not None
    assert item.insert_text == expected.text


async def test_model_load_reports_progress(client: LanguageClient):
    text = DEMO_FILE.read_text()
    uri = open_document(client, text)
    await client.text_document_inline_completion_async(inline_params(uri, *demo_cursor(text)))
    kinds = [[report.kind for report in reports] for reports in client.progress_reports.values()]
    assert ["begin", "end"] in kinds
    titles = [r.title for reports in client.progress_reports.values() for r in reports if r.kind == "begin"]
    assert any("Loading model" in title for title in titles)


async def test_completion_fallback_replaces_the_word_before_the_cursor(client: LanguageClient):
    text = "def add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n    ret"
    uri = open_document(client, text, "fallback.py")
    position = types.Position(line=5, character=7)
    result = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)
    )
    assert isinstance(result, types.CompletionList)
    assert result.is_incomplete
    (item,) = result.items
    assert item.text_edit.range == types.Range(start=types.Position(line=5, character=4), end=position)
    assert item.text_edit.new_text.startswith("ret")
    assert len(item.text_edit.new_text) > len("ret")


async def test_incremental_edits_use_utf16_columns(client: LanguageClient):
    # The emoji is one Python character but two UTF-16 code units.
    text = 'GREETING = "😀 héllo"\nname = GREETING + \n'
    uri = open_document(client, text, "utf16.py")
    # Insert after the emoji on line 0 using UTF-16 columns: '"' at 11, emoji at 12-13, space at 14.
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=0, character=14), end=types.Position(line=0, character=14)
                    ),
                    text="!",
                ),
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=1, character=18), end=types.Position(line=1, character=18)
                    ),
                    text="str(len(GREE",
                ),
            ],
        )
    )
    cursor = types.Position(line=1, character=18 + len("str(len(GREE"))
    result = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=cursor)
    )
    (item,) = result.items
    # The server saw the word before the cursor exactly where the client put it.
    assert item.text_edit.new_text.startswith("GREE")
    assert item.text_edit.range.start.character == cursor.character - 4


async def test_cancel_request_stops_generation(client: LanguageClient):
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"squidcode": {"completion": {"max_tokens": 512, "max_lines": 200, "debounce_ms": 0}}}
        )
    )
    text = "# A long list of numbers, one per line\nnumbers = [\n"
    uri = open_document(client, text, "long.py")
    # Warm the model first so the cancel lands during generation, not during the load.
    await client.text_document_inline_completion_async(inline_params(uri, 0, 5))
    msg_id = str(uuid.uuid4())
    future = client.protocol.send_request(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 2, 0), msg_id=msg_id
    )
    await asyncio.sleep(1.0)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    with pytest.raises(Exception) as raised:
        await asyncio.wait_for(asyncio.wrap_future(future), timeout=30)
    assert "cancel" in str(raised.value).lower()
    # The worker notices the cancel between forward passes and reports how far it got.
    report = await wait_for_log(client, "stopped_by_caller", timeout=60)
    generated = int(re.search(r"generated (\d+) tokens", report).group(1))
    assert generated < 512
    follow_up = await client.text_document_inline_completion_async(inline_params(uri, 0, 5))
    assert follow_up is None or isinstance(follow_up, types.InlineCompletionList)


async def wait_for_log(client: LanguageClient, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in client.log_messages:
            if needle in message.message:
                return message.message
        await asyncio.sleep(0.1)
    raise AssertionError(f"no log message with {needle!r}: {[m.message for m in client.log_messages]}")


async def test_newer_request_for_the_same_document_supersedes_the_older(client: LanguageClient):
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"squidcode": {"completion": {"debounce_ms": 300}}})
    )
    text = DEMO_FILE.read_text()
    uri = open_document(client, text)
    line, character = demo_cursor(text)
    first = client.text_document_inline_completion_async(inline_params(uri, line, character))
    second = client.text_document_inline_completion_async(inline_params(uri, line, character))
    first_result, second_result = await asyncio.gather(first, second)
    assert first_result is None
    assert isinstance(second_result, types.InlineCompletionList) and second_result.items


async def test_disabling_completion_through_settings(client: LanguageClient):
    text = DEMO_FILE.read_text()
    uri = open_document(client, text)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"squidcode": {"completion": {"enabled": False}}})
    )
    assert await client.text_document_inline_completion_async(inline_params(uri, *demo_cursor(text))) is None
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"squidcode": {"completion": {"enabled": True, "debounce_ms": 0}}}
        )
    )
    result = await client.text_document_inline_completion_async(inline_params(uri, *demo_cursor(text)))
    assert isinstance(result, types.InlineCompletionList) and result.items


async def test_a_keystroke_far_from_the_cached_window_answers_from_a_shorter_one_then_warms_it(
    client: LanguageClient, runtime
):
    completion = {"max_tokens": MAX_TOKENS, "debounce_ms": 0, "keystroke_prefill_tokens": 256}
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"squidcode": {"completion": completion}})
    )
    code = (DEMO_WORKSPACE.parents[1] / "context" / "index" / "store.py").read_text()
    text = code[: code.rindex("\n", 0, 6000) + 1]
    uri = open_document(client, text, "store_copy.py")
    cursor = (text.count("\n"), 0)
    def prompt_sizes(since: int) -> list[int]:
        return [int(m.group(1)) for message in client.log_messages[since:]
                if (m := re.search(r"after a (\d+)-token prompt", message.message))]

    before = len(client.log_messages)
    first = await client.text_document_inline_completion_async(inline_params(uri, *cursor))
    # Idle now: the server prefills the whole 1,024-token window in the background.
    await wait_for_log(client, "warmed a", timeout=120)
    between = len(client.log_messages)
    second = await client.text_document_inline_completion_async(inline_params(uri, *cursor))
    # Each request's first generation (a completion cut inside a bracket may log a second, its finish).
    assert prompt_sizes(before)[0] == 256
    assert prompt_sizes(between)[0] >= 1000  # (1,024 less a healed last token)

    request = CompletionRequest(text, len(text), "python", path=str(DEMO_WORKSPACE / "store_copy.py"))
    runtime.forget_prefix()
    short = complete(runtime, request, CompletionConfig(max_tokens=MAX_TOKENS, keystroke_prefill_tokens=256))
    full = complete(runtime, request, CompletionConfig(max_tokens=MAX_TOKENS, keystroke_prefill_tokens=0))
    texts = [None if r is None else r.items[0].insert_text for r in (first, second)]
    assert texts == [None if short is None else short.text, None if full is None else full.text]
