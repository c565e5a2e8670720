"""Squid over LSP: inline completion reads the definitions of the names it uses from other files
(`apply_discount`, imported from prices.py) as Squid-composed reference documents once the background
encoder has cached them, the watcher drops a changed file's cache, `squid.reader` reads them through
a Squid reader, and `squid.enabled = false` turns it all off."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from context.squid.disk import read_metadata
from tests.conftest import SERVER_CMD

pytestmark = pytest.mark.e2e

PRICES = "def apply_discount(amount, rate):\n    return amount * (1 - rate)\n"
CART = "from prices import apply_discount\n\n\ndef total(items):\n    return "


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "prices.py").write_text(PRICES)
    (root / "cart.py").write_text(CART)
    return root


async def _start(client: LanguageClient, project: Path, squid: dict) -> None:
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=project.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")],
        initialization_options={"completion": {"max_tokens": 6, "debounce_ms": 0},
                                "index": {"debounce_ms": 20}, "squid": squid},
    ))


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, project: Path, tmp_path: Path, model_cache_dir):
    await _start(lsp_client, project, {"document_tokens": 64, "recompute_first": 4,
                                       "cache_dir": str(tmp_path / "squid")})
    yield
    await lsp_client.shutdown_session()


@pytest.fixture
def reader_dir(runtime, tmp_path: Path) -> Path:
    from tests.unit.squid.test_reader import reader_with_weights

    return reader_with_weights(runtime, tmp_path / "reader", scale=0.01)


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client_reader(lsp_client: LanguageClient, project: Path, tmp_path: Path, model_cache_dir,
                        reader_dir):
    await _start(lsp_client, project, {"document_tokens": 64, "recompute_first": 4,
                                       "cache_dir": str(tmp_path / "squid"), "reader": str(reader_dir)})
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client_off(lsp_client: LanguageClient, project: Path, tmp_path: Path, model_cache_dir):
    await _start(lsp_client, project, {"enabled": False, "cache_dir": str(tmp_path / "squid")})
    yield
    await lsp_client.shutdown_session()


def _open(client: LanguageClient, path: Path) -> str:
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=path.as_uri(), language_id="python", version=1, text=path.read_text())))
    return path.as_uri()


async def _complete(client: LanguageClient, uri: str):
    lines = CART.split("\n")
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=len(lines) - 1, character=len(lines[-1])),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))


def _logged(client: LanguageClient, *parts: str) -> list[str]:
    return [m.message for m in client.log_messages if all(p in m.message for p in parts)]


async def _wait_logged(client: LanguageClient, *parts: str, timeout: float = 120.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := _logged(client, *parts):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no log message with {parts}; got {[m.message for m in client.log_messages][-20:]}")


async def test_imported_definitions_become_composed_references_and_changes_drop_them(
        client, project, tmp_path):
    await _wait_logged(client, "index ready")
    _open(client, project / "prices.py")
    cart = _open(client, project / "cart.py")
    first = await _complete(client, cart)
    assert first is not None and first.items
    # The first request did not wait: apply_discount's definition in prices.py is encoded in the
    # background, then reused.
    assert not _logged(client, "reference documents composed")
    await _wait_logged(client, "squid: encoded", "prices.py")
    second = await _complete(client, cart)
    assert second is not None and second.items
    (composed,) = await _wait_logged(client, "squid: 1 reference documents composed")
    assert "recomputed" in composed
    assert list((tmp_path / "squid").rglob("*.safetensors")), "the background encode persisted the cache"
    # The file changes on disk: the watcher drops its cache.
    old_entries = [p for p in (tmp_path / "squid").rglob("*.safetensors")
                   if read_metadata(p)["source"] == str(project / "prices.py")]
    assert old_entries
    (project / "prices.py").write_text(PRICES + "\n\ndef add_tax(amount):\n    return amount * 1.2\n")
    await _wait_logged(client, "squid: dropped")
    # The entries of the old prices.py are gone (the background pre-encode of cart.py's imported
    # definitions, which runs when it runs, may already hold the new text).
    assert not [p for p in old_entries if p.exists()]


async def test_a_reader_reads_the_composed_references(client_reader, project):
    _open(client_reader, project / "prices.py")
    cart = _open(client_reader, project / "cart.py")
    first = await _complete(client_reader, cart)  # starts the reader's build and the encode
    assert first is not None and first.items
    await _wait_logged(client_reader, "compositions are read through the reader",
                       str(project.parent / "reader"))
    await _wait_logged(client_reader, "squid: encoded", "prices.py")
    second = await _complete(client_reader, cart)
    assert second is not None and second.items and second.items[0].insert_text.strip()
    await _wait_logged(client_reader, "squid: 1 reference documents composed")
    await _wait_logged(client_reader, "squid: the composition read through the reader")


async def test_squid_disabled_completes_from_the_prompt_alone(client_off, project, tmp_path):
    _open(client_off, project / "prices.py")
    cart = _open(client_off, project / "cart.py")
    for _ in range(2):
        result = await _complete(client_off, cart)
        assert result is not None and result.items
    await asyncio.sleep(1.0)
    assert not _logged(client_off, "squid:")
    assert not (tmp_path / "squid").exists()
