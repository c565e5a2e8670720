"""The collector's SQLite store on real files: a file made by the earlier CREATE TABLE is migrated,
a retried batch is stored once, reference documents once per team, and database errors become
FeedbackStoreError, which the app answers with 503 (driven through its ASGI interface)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from context.errors import FeedbackStoreError
from feedback.collector import SCHEMA_VERSION, CollectorStore, create_app

TOKEN = "team-token-0123456789"

# The statement the store ran before its table was created through sqlite-utils, verbatim.
OLD_DDL = ("CREATE TABLE IF NOT EXISTS received (id TEXT PRIMARY KEY, team TEXT NOT NULL, "
           "tbl TEXT NOT NULL, row TEXT NOT NULL, received_at REAL NOT NULL)")


def events(*ids: str) -> list[dict]:
    return [{"id": i, "table": "episodes", "row": {"id": i, "kind": "completion"}} for i in ids]


def layout(path) -> tuple:
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("PRAGMA journal_mode").fetchone()[0],
                [tuple(c[1:]) for c in conn.execute("PRAGMA table_info(received)")],
                [tuple(i[1:4]) for i in conn.execute("PRAGMA index_list(received)")])
    finally:
        conn.close()


def test_an_old_file_is_migrated_with_its_rows_and_a_new_one_has_the_same_layout(tmp_path):
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(OLD_DDL)
    with conn:
        conn.execute("INSERT INTO received VALUES ('a1', 'team', 'episodes', '{}', 1.0)")
    conn.close()
    CollectorStore(tmp_path / "new.db").close()
    store = CollectorStore(old)
    try:
        assert store.schema_version() == SCHEMA_VERSION == 4
        assert store.stats("team") == {"events": 1, "by_table": {"episodes": 1}}
    finally:
        store.close()
    assert layout(tmp_path / "new.db") == layout(old)
    conn = sqlite3.connect(old)
    try:  # version 3: the shared completions' reference documents, one per team and hash
        assert [tuple(c[1:]) for c in conn.execute("PRAGMA table_info(reference_documents)")] == [
            ("team", "TEXT", 1, None, 1), ("hash", "TEXT", 1, None, 2), ("row", "TEXT", 1, None, 0),
            ("received_at", "REAL", 1, None, 0)]
    finally:
        conn.close()
    # Version 2: reads of one team's tables use an index, not a scan of every team's uploads.
    assert ("received_team_tbl", 0, "c") in layout(old)[2]
    conn = sqlite3.connect(old)
    try:
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT tbl, row FROM received WHERE team = 'team' AND tbl IN ('episodes')"))
    finally:
        conn.close()
    assert "received_team_tbl" in plan
    CollectorStore(old).close()  # opened again: nothing to do
    assert layout(tmp_path / "new.db") == layout(old)


def test_a_file_from_a_newer_squidcode_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "newer.db"
    CollectorStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 9")
    conn.close()
    with pytest.raises(FeedbackStoreError, match="schema version 9, newer than this squidcode knows"):
        CollectorStore(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 9
    finally:
        conn.close()


def test_a_retried_batch_is_stored_once(tmp_path):
    store = CollectorStore(tmp_path / "collector.db")
    try:
        assert store.insert("team", events("a1", "a2")) == (2, 0)
        assert store.insert("team", events("a1", "a2", "a3")) == (1, 2)
        assert store.stats("team") == {"events": 3, "by_table": {"episodes": 3}}
        assert store.stats("other") == {"events": 0, "by_table": {}}
    finally:
        store.close()


def test_reference_documents_are_stored_once_per_team_and_read_back_with_that_teams_episodes(tmp_path):
    from feedback.collector import validate_batch
    from feedback.store import REFERENCE_TABLE, SERVED_PROMPT_KEY
    from feedback.team_records import TeamRecords

    named = {SERVED_PROMPT_KEY: {"references": [{"hash": "d1", "path": "/w/a.py", "tokens": 3},
                                                {"hash": "d2", "path": "/w/b.py", "tokens": 3}]}}
    batch = [{"id": "e1", "table": "episodes", "row": {"id": "e1", "kind": "completion", "ts": 1.0,
                                                         "extra": named}},
             *({"id": h, "table": REFERENCE_TABLE, "row": {"id": h, "ts": 1.0, "text": f"{h} = 1\n",
                                                          "redacted": 0}} for h in ("d1", "d2"))]
    assert validate_batch({"events": batch}) == batch
    with pytest.raises(ValueError, match="has its text"):
        validate_batch({"events": [{"id": "d3", "table": REFERENCE_TABLE, "row": {"id": "d3"}}]})
    store = CollectorStore(tmp_path / "collector.db")
    try:
        assert store.insert("team", batch) == (3, 0)
        assert store.insert("team", batch[1:]) == (0, 2)  # sent again: stored once
        # The same document from another team is that team's own, not a duplicate of this one's.
        assert store.insert("other", batch[1:2]) == (1, 0)
        assert store.stats("team") == {"events": 3, "by_table": {"episodes": 1, REFERENCE_TABLE: 2}}
        assert store.stats("other") == {"events": 1, "by_table": {REFERENCE_TABLE: 1}}
    finally:
        store.close()
    from feedback.train.team_source import CollectorSource

    rows = CollectorSource(f"sqlite:{tmp_path / 'collector.db'}", "team")._rows()
    (record,) = TeamRecords("team", rows).episodes_with_outcomes()
    assert record.reference_texts == {"d1": "d1 = 1\n", "d2": "d2 = 1\n"}
    other = CollectorSource(f"sqlite:{tmp_path / 'collector.db'}", "other")._rows()
    assert other == [(REFERENCE_TABLE, json.dumps(batch[1]["row"]))]


def test_a_database_deleted_while_serving_stores_later_events_in_a_new_file(tmp_path, caplog):
    path = tmp_path / "collector.db"
    store = CollectorStore(path)
    try:
        assert store.insert("team", events("a1")) == (1, 0)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with caplog.at_level("WARNING", logger="feedback.collector"):
            assert store.insert("team", events("a2")) == (1, 0)
        assert "deleted or replaced" in caplog.text
    finally:
        store.close()
    reopened = CollectorStore(path)  # on disk at the path, not in the unlinked file
    try:
        assert reopened.stats("team") == {"events": 1, "by_table": {"episodes": 1}}
    finally:
        reopened.close()


def test_a_store_that_cannot_be_opened_raises_feedback_store_error(tmp_path):
    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(FeedbackStoreError, match="cannot create the collector database"):
        CollectorStore(tmp_path / "a-file" / "collector.db")
    (tmp_path / "garbage.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(FeedbackStoreError, match="cannot open the collector database"):
        CollectorStore(tmp_path / "garbage.db")


async def call(app, method: str, path: str, body: bytes = b"") -> tuple[int, dict]:
    sent: list[dict] = []
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_store_errors_are_answered_with_503(tmp_path):
    store = CollectorStore(tmp_path / "collector.db")
    app = create_app(store, {TOKEN: "team"})
    batch = json.dumps({"events": events("b1")}).encode()
    assert await call(app, "POST", "/v1/events", batch) == (200, {"accepted": 1, "duplicates": 0})
    store.close()  # every later use of the database fails
    status, body = await call(app, "POST", "/v1/events", batch)
    assert status == 503 and "cannot store events" in body["error"]
    status, body = await call(app, "GET", "/v1/stats")
    assert status == 503 and "cannot read" in body["error"]


async def test_a_team_over_its_rate_is_answered_429_with_retry_after_and_others_are_not(tmp_path):
    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    store = CollectorStore(tmp_path / "collector.db")
    other = "other-team-token-1234"
    app = create_app(store, {TOKEN: "team", other: "other"}, rate_per_minute=3, clock=clock)
    for _ in range(3):
        assert (await call(app, "GET", "/v1/stats"))[0] == 200
    sent = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    await app({"type": "http", "method": "GET", "path": "/v1/stats",
               "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}, receive, send)
    assert sent[0]["status"] == 429 and (b"retry-after", b"60") in sent[0]["headers"]
    sent.clear()
    await app({"type": "http", "method": "GET", "path": "/v1/stats",
               "headers": [(b"authorization", f"Bearer {other}".encode())]}, receive, send)
    assert sent[0]["status"] == 200  # another team's budget is its own
    clock.now += 60.0  # a minute later the team may go on
    assert (await call(app, "GET", "/v1/stats"))[0] == 200
    store.close()
