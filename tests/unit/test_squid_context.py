"""The server's Squid glue: references for a request (the definitions of the names around the cursor
in other files, never the current file), the definitions the current file imports queued for
background encoding, the watcher's changed paths reaching the cache, and `squid.enabled = false`."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from context.config import IndexConfig, SquidCacheConfig, SquidConfig
from context.index.service import IndexService
from lsp_server.squid_context import completion_references, stop_squid

FILES = {
    "shop/db.py": "class Database:\n    def vacuum(self):\n        return 1\n\n\ndef open_database(p):\n"
                  "    return Database()\n",
    "app/main.py": "from shop.db import open_database\n\n\ndef main():\n    return open_database('x')\n",
}


class _Doc:
    def __init__(self, path: Path, text: str):
        self.uri, self.source = path.as_uri(), text


def _server_state(tmp_path: Path, index, config: SquidConfig, open_docs: dict[Path, str]):
    """The attributes of `SquidServer` the glue reads (a real server needs a client to start)."""
    docs = {p.as_uri(): _Doc(p, t) for p, t in open_docs.items()}
    return SimpleNamespace(config=config, index_service=index, workspace_roots=[tmp_path / "ws"],
                           workspace=SimpleNamespace(text_documents=docs), squid_service=None,
                           background_threads=[], stopping=threading.Event())


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    index = IndexService([root], IndexConfig(watch=False, debounce_ms=0), db_path=tmp_path / "index.sqlite3")
    index.start()
    assert index.wait_until_indexed(60)
    yield root, index
    index.stop()


def _config(tmp_path, **squid) -> SquidConfig:
    base = SquidCacheConfig(document_tokens=32, recompute_first=0, cache_dir=str(tmp_path / "kv"))
    return replace(SquidConfig(), squid=replace(base, **squid))


def test_references_and_background_queue(runtime, tmp_path, workspace):
    root, index = workspace
    current, other = root / "app/main.py", root / "shop/db.py"
    ls = _server_state(tmp_path, index, _config(tmp_path),
                       {current: current.read_text(), other: other.read_text()})
    try:
        with_refs = completion_references(ls, current.as_uri(), runtime)
        assert with_refs is not None and with_refs.current_path == str(current)
        service = ls.squid_service
        assert service.wait_idle(120)
        # What main.py imports (`open_database`) was encoded ahead of its use; whole files were not.
        entries = list(service.store.device_tier.entries.values())
        assert {e.source for e in entries} == {str(other)}
        ctx = with_refs.compose(current.read_text())
        # The current file is the query, never a reference: only db.py's `open_database` is composed.
        assert ctx is not None and len(ctx.spans) == 1 and ctx.sources == (str(other),)
        assert "def open_database(p):" in runtime.decode(list(ctx.token_ids))
        # The watcher's changed paths reach the cache.
        index.watcher.notify_changed([other])
        assert index.watcher.wait_idle(30)
        assert str(other) not in {e.source for e in service.store.device_tier.entries.values()}
    finally:
        stop_squid(ls)


def test_disabled_squid_gives_no_references(runtime, tmp_path, workspace):
    root, index = workspace
    ls = _server_state(tmp_path, index, _config(tmp_path, enabled=False), {})
    assert completion_references(ls, (root / "app/main.py").as_uri(), runtime) is None
    assert ls.squid_service is None
