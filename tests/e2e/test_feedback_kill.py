"""kill -9 of `squidcode serve` while it records feedback: no committed row is lost.

A real server subprocess records completions shown, accepted and tracked through edits, with
checkpoints every 0.1-0.3 s, so writes are in progress all the time. Just before the kill the test
reads what is committed through its own read-only connection; after the kill the database passes
SQLite's integrity check and holds every one of those rows, and a new server opens it and records
on top of it.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest

from feedback.store import TABLES, FeedbackStore
from tests.e2e.test_bad_input import end_position, inline_items, start_client

pytestmark = pytest.mark.e2e

TEXT = 'def add(a, b):\n    """Return the sum of a and b."""\n    return '


def committed_ids(db: Path) -> dict[str, set[str]]:
    """Every row id committed so far, read the way another process would (WAL readers never block)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return {table: {row[0] for row in conn.execute(f"SELECT id FROM {table}")} for table in TABLES}
    finally:
        conn.close()


def options(db: Path) -> dict:
    return {
        "completion": {"max_tokens": 2, "prefix_tokens": 64, "debounce_ms": 0},
        "index": {"enabled": False},
        "squid": {"enabled": False},
        "feedback": {"db_path": str(db), "checkpoints_s": [0.1, 0.2, 0.3], "dismiss_after_s": 0.2},
    }


def record_one(client, uri: str, version: int) -> int:
    """Show a completion, accept it, insert it and edit it: an episode, events, tracked outcomes."""
    position = end_position(TEXT)
    items = inline_items(client.inline_completion(uri, position))
    assert items, "the model offered no completion"
    item = items[0]
    accept = client.request("workspace/executeCommand", {
        "command": item["command"]["command"], "arguments": item["command"]["arguments"],
    })
    assert "error" not in accept, accept
    inserted = item["insertText"] if isinstance(item["insertText"], str) else item["insertText"]["value"]
    lines = inserted.split("\n")
    inserted_end = {
        "line": position["line"] + len(lines) - 1,
        "character": (position["character"] if len(lines) == 1 else 0) + len(lines[-1]),
    }
    # Insert what was accepted, then undo it: outcomes for both.
    for end, text in ((position, inserted), (inserted_end, "")):
        version += 1
        client.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": position, "end": end}, "text": text}],
        })
    return version


def test_kill_9_of_the_server_while_recording_loses_no_committed_row(tmp_path):
    db = tmp_path / "feedback.db"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text(TEXT)
    uri = (workspace / "calc.py").as_uri()

    client = start_client(tmp_path, "killed")
    try:
        client.initialize(root=workspace, options=options(db))
        client.open(uri, TEXT)
        # At least 5 s of recording and 3 committed episodes: on a loaded machine 5 s may hold fewer.
        version, started = 1, time.monotonic()
        while (time.monotonic() - started < 5 or not db.exists()
               or len(committed_ids(db)["episodes"]) < 3):
            assert time.monotonic() - started < 120, "no 3 episodes were committed in 2 minutes"
            version = record_one(client, uri, version)
        # Leave work in flight: a completion being generated, checkpoints due, then kill.
        client.send_request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": end_position(TEXT), "context": {"triggerKind": 1},
        })
        time.sleep(0.15)
        before = committed_ids(db)
        client.proc.send_signal(signal.SIGKILL)
        client.proc.wait(10)
    finally:
        client.close()
    assert client.proc.returncode == -signal.SIGKILL
    assert len(before["episodes"]) >= 3 and before["events"] and before["outcomes"], {
        t: len(ids) for t, ids in before.items()
    }

    store = FeedbackStore(db)
    try:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()
    after = committed_ids(db)
    for table, ids in before.items():
        assert ids <= after[table], f"{table}: {len(ids - after[table])} committed rows lost"

    # The next server opens the same database and goes on recording.
    client = start_client(tmp_path, "restarted")
    try:
        client.initialize(root=workspace, options=options(db))
        client.open(uri, TEXT)
        record_one(client, uri, 1)
        deadline = time.monotonic() + 20
        while len(committed_ids(db)["episodes"]) <= len(after["episodes"]):
            assert time.monotonic() < deadline, "the restarted server recorded nothing"
            time.sleep(0.1)
    finally:
        client.close()
