"""The index as an editor sees it: background indexing with progress, a status notification,
workspace/symbol, and saves / unsaved buffers reaching the index."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from lsp_server.indexing import INDEX_STATUS
from tests.conftest import SERVER_CMD

pytestmark = pytest.mark.e2e

PROJECT = {
    "shop/cart.py": "from shop.prices import apply_discount\n\n\nclass Cart:\n"
                    "    def __init__(self):\n        self.items = []\n\n"
                    "    def total(self):\n        return apply_discount(sum(self.items), 0.1)\n",
    "shop/prices.py": "def apply_discount(amount, rate):\n    return amount * (1 - rate)\n",
    "web/app.js": "export function renderCart(cart) {\n  return `<ul>${cart.items.length}</ul>`;\n}\n",
    "notes.txt": "not code, still indexed as windows\n",
    "blob.bin": "\x00\x01\x02binary",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel, text in PROJECT.items():
        path = tmp_path / "ws" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "ws"


def plain(value):
    """pygls hands custom notifications over as namedtuples; the test compares plain values."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_CMD))
async def client(lsp_client: LanguageClient, project: Path, tmp_path: Path, monkeypatch):
    statuses: list[dict] = []
    lsp_client.index_statuses = statuses

    @lsp_client.feature(INDEX_STATUS)
    def on_status(params):
        statuses.append(plain(params))

    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=project.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="ws")],
            initialization_options={"completion": {"max_tokens": 4}, "index": {"debounce_ms": 20}},
        )
    )
    yield
    await lsp_client.shutdown_session()


async def wait_for(predicate, timeout: float = 60.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError("condition not met in time")


async def symbols(client: LanguageClient, query: str) -> list[types.WorkspaceSymbol]:
    return await client.workspace_symbol_async(types.WorkspaceSymbolParams(query=query)) or []


async def test_background_index_reports_progress_status_and_answers_workspace_symbol(client, project):
    async def ready():
        return [s for s in client.index_statuses if s.get("state") == "ready"]

    (status,) = await wait_for(ready)
    assert status["files"] == 4  # the binary file is skipped
    assert status["skipped"].get("binary") == 1
    assert status["symbols"] >= 4
    titles = [r.title for reports in client.progress_reports.values() for r in reports if r.kind == "begin"]
    assert any("Indexing" in t for t in titles)
    found = await symbols(client, "apply_disc")
    (hit,) = [s for s in found if s.name == "apply_discount"]
    assert hit.location.uri == (project / "shop/prices.py").as_uri()
    assert hit.location.range.start.line == 0
    assert hit.kind == types.SymbolKind.Function
    methods = {s.name: s for s in await symbols(client, "tot")}
    assert methods["total"].container_name == "Cart"


async def test_saved_file_and_unsaved_buffer_reach_the_index(client, project):
    await wait_for(lambda: _async([s for s in client.index_statuses if s.get("state") == "ready"]))
    # A new file written and saved by the editor becomes searchable.
    new_file = project / "shop" / "tax.py"
    new_file.write_text("def vat_for(amount):\n    return amount * 0.2\n")
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=new_file.as_uri())))
    await wait_for(lambda: _has_symbol(client, "vat_for"), timeout=30)
    # An open buffer's unsaved text wins over the file on disk.
    prices = project / "shop" / "prices.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=prices.as_uri(), language_id="python", version=1, text=prices.read_text())))
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=prices.as_uri(), version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(
            text="def apply_coupon(amount, code):\n    return amount\n")]))
    await wait_for(lambda: _has_symbol(client, "apply_coupon"), timeout=30)
    assert not await _has_symbol(client, "apply_discount")
    # Closing the buffer goes back to the file on disk.
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=prices.as_uri())))
    await wait_for(lambda: _has_symbol(client, "apply_discount"), timeout=30)
    # A deleted folder reported by the client's file watcher leaves the index.
    shutil.rmtree(project / "web")
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
        types.FileEvent(uri=(project / "web" / "app.js").as_uri(), type=types.FileChangeType.Deleted)]))
    await wait_for(lambda: _lacks_symbol(client, "renderCart"), timeout=30)


async def _async(value):
    return value


async def _has_symbol(client, name: str) -> bool:
    return any(s.name == name for s in await symbols(client, name))


async def _lacks_symbol(client, name: str) -> bool:
    return not await _has_symbol(client, name)
