"""The feedback store: schema and migrations, WAL, reads for training, forgetting."""

from __future__ import annotations

import sqlite3
import time

import pytest

from context.errors import FeedbackStoreError
from feedback.store import SCHEMA_VERSION, FeedbackStore


def episode(i: int, ts: float) -> dict:
    return {
        "id": f"ep{i}",
        "kind": "completion",
        "ts": ts,
        "model_id": "m",
        "output": f"x{i}",
        "candidates": [{"diff": "d", "verified": True}],
        "extra": {"n": i},
    }


def test_a_new_store_is_at_the_current_schema_in_wal_mode(tmp_path):
    store = FeedbackStore(tmp_path / "sub" / "f.db")
    assert store.schema_version() == SCHEMA_VERSION
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"episodes", "events", "outcomes", "sessions", "model_switches", "outbox"} <= set(
        store.db.table_names()
    )


def test_an_old_store_is_migrated_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "f.db"
    sqlite3.connect(path).close()  # version 0: an empty file
    assert FeedbackStore(path).schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(FeedbackStoreError, match="newer"):
        FeedbackStore(path)


def test_episodes_with_outcomes_round_trips_json_and_orders(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    now = time.time()
    store.write([("episodes", episode(2, now + 1)), ("episodes", episode(1, now))])
    store.write(
        [
            (
                "events",
                {"id": "e1", "episode_id": "ep1", "kind": "accepted", "ts": now, "data": {"chars": 2}},
            ),
            (
                "outcomes",
                {
                    "id": "o2",
                    "episode_id": "ep1",
                    "region_id": "r",
                    "checkpoint_s": 120,
                    "ts": now,
                    "status": "reverted",
                    "kept_text": "",
                },
            ),
            (
                "outcomes",
                {
                    "id": "o1",
                    "episode_id": "ep1",
                    "region_id": "r",
                    "checkpoint_s": 30,
                    "ts": now,
                    "status": "unchanged",
                    "kept_text": "x1",
                },
            ),
        ]
    )
    first, second = store.episodes_with_outcomes()
    assert first.episode["id"] == "ep1" and first.episode["candidates"] == [{"diff": "d", "verified": True}]
    assert [o["checkpoint_s"] for o in first.outcomes] == [30, 120]
    assert first.accepted and first.reverted and not second.accepted
    assert [e.episode["id"] for e in store.episodes_with_outcomes(since=now + 0.5)] == ["ep2"]


def test_writing_an_id_twice_keeps_the_first(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    store.write([("episodes", episode(1, 1.0))])
    store.write([("episodes", {**episode(1, 2.0), "output": "changed"})])
    assert [e.episode["output"] for e in store.episodes_with_outcomes()] == ["x1"]


def test_forget_since_and_all(tmp_path):
    store = FeedbackStore(tmp_path / "f.db")
    store.write([("episodes", episode(1, 100.0)), ("episodes", episode(2, 200.0))], share=True)
    store.write([("events", {"id": "late", "episode_id": "ep1", "kind": "accepted", "ts": 250.0})])
    deleted = store.forget(since=150.0)
    assert deleted["episodes"] == 1 and deleted["events"] == 1
    assert [e.episode["id"] for e in store.episodes_with_outcomes()] == ["ep1"]
    store.forget()
    assert store.count("episodes") == 0 and store.outbox_size() == 0


def test_a_damaged_file_is_a_clear_error(tmp_path):
    path = tmp_path / "f.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(FeedbackStoreError, match="damaged"):
        FeedbackStore(path)
