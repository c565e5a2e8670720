"""The collector keeps no secret an older member's rules let through: a batch redacted under older
rules (or that names none) is redacted again before it is stored, and a store whose rows were
redacted under older rules is redacted again when the collector starts. A real SQLite file; the
app driven through its ASGI interface (`tests.unit.feedback.test_collector.call`)."""

from __future__ import annotations

import json
import sqlite3

import feedback.collector as collector_module
from feedback.collector import CollectorStore, create_app
from feedback.redact import RULES_VERSION, text_hash
from feedback.store import REFERENCE_TABLE
from tests.unit.feedback.test_collector import TOKEN, call
from tests.unit.feedback.test_store_redaction import CURL, ENV, NETRC, REDIS, SECRETS, SHOPIFY

PROMPT = f"import redis\nr = redis.from_url('{REDIS}')\n"


def old_rows() -> list[dict]:
    """One of each kind of row, as an older squidcode's uploader sent them, secrets in their code."""
    full = {"id": "ep-full", "kind": "agent", "ts": 1.0, "instruction": f"deploy with {CURL}",
            "prompt_text": PROMPT, "prompt_hash": text_hash(PROMPT),
            "output": ENV, "output_hash": text_hash(ENV),
            "context_refs": [{"uri": "file:///.netrc", "text": NETRC, "hash": "ref-hash-1"}],
            "candidates": [{"diff": f"+TOKEN = '{SHOPIFY}'\n", "diff_hash": "d", "verified": True}],
            "extra": {"replaces": ENV, "position": [1, 2]}}
    hashed = {"id": "ep-hashed", "kind": "completion", "ts": 2.0, "prompt_text": None,
              "prompt_hash": text_hash("x"), "output": None, "output_hash": text_hash("y"), "extra": {}}
    return [
        {"id": "ep-full", "table": "episodes", "row": full},
        {"id": "ep-hashed", "table": "episodes", "row": hashed},
        {"id": "ev1", "table": "events", "row": {"id": "ev1", "episode_id": "ep-full", "kind": "applied",
                                                 "data": {"new_text": ENV, "new_text_hash": text_hash(ENV)}}},
        {"id": "oc1", "table": "outcomes", "row": {"id": "oc1", "episode_id": "ep-full",
                                                   "status": "unchanged", "kept_text": CURL,
                                                   "kept_hash": text_hash(CURL)}},
        {"id": "doc1", "table": REFERENCE_TABLE,
         "row": {"id": "doc1", "ts": 1.0, "text": NETRC, "redacted": 0}},
    ]


def stored(path) -> dict[str, dict]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT id, row FROM received UNION ALL "
                            "SELECT hash, row FROM reference_documents").fetchall()
    finally:
        conn.close()
    return {row_id: json.loads(text) for row_id, text in rows}


def assert_redacted(rows: dict[str, dict]) -> None:
    assert [s for s in SECRETS if s in json.dumps(rows)] == []
    full = rows["ep-full"]
    assert full["prompt_hash"] == text_hash(full["prompt_text"]) and "[REDACTED:" in full["prompt_text"]
    assert full["context_refs"][0]["hash"] == "ref-hash-1" and full["candidates"][0]["verified"] is True
    assert full["candidates"][0]["diff_hash"] == text_hash(full["candidates"][0]["diff"])
    assert full["extra"]["position"] == [1, 2] and "[REDACTED:" in full["extra"]["replaces"]
    assert rows["ep-hashed"] == old_rows()[1]["row"]  # hashes only: nothing to redact
    assert rows["ev1"]["data"]["new_text_hash"] == text_hash(rows["ev1"]["data"]["new_text"])
    assert rows["oc1"]["kept_hash"] == text_hash(rows["oc1"]["kept_text"])
    assert rows["doc1"]["redacted"] == 1  # its text no longer spells its hash's tokens


async def test_a_batch_from_older_rules_is_redacted_before_it_is_stored(tmp_path):
    store = CollectorStore(tmp_path / "collector.db")
    app = create_app(store, {TOKEN: "team"})
    try:
        body = json.dumps({"events": old_rows()}).encode()  # an uploader that names no rules
        assert await call(app, "POST", "/v1/events", body) == (200, {"accepted": 5, "duplicates": 0})
        assert_redacted(stored(tmp_path / "collector.db"))

        # Rows redacted under this collector's rules are stored as they came (not scanned again).
        current = [{**event, "id": event["id"] + "-now", "row": {**event["row"], "id": event["id"] + "-now"}}
                   for event in old_rows()]
        body = json.dumps({"events": current, "redaction_rules": RULES_VERSION}).encode()
        assert (await call(app, "POST", "/v1/events", body))[0] == 200
        assert stored(tmp_path / "collector.db")["oc1-now"]["kept_text"] == CURL

        for rules in ("2", -1, True, None):
            body = json.dumps({"events": old_rows(), "redaction_rules": rules}).encode()
            status, answer = await call(app, "POST", "/v1/events", body)
            assert status == 422 and "redaction_rules" in answer["error"]
    finally:
        store.close()


def test_a_store_redacted_under_older_rules_is_redacted_again_when_the_collector_opens(tmp_path, monkeypatch):
    path = tmp_path / "collector.db"
    CollectorStore(path).close()
    conn = sqlite3.connect(path)
    with conn:  # as a collector of rules version 3, before it kept a rules version, left them
        conn.execute("PRAGMA user_version = 3")
        conn.execute("DROP TABLE collector_meta")
        for event in old_rows():
            if event["table"] == REFERENCE_TABLE:
                conn.execute("INSERT INTO reference_documents VALUES ('team', ?, ?, 1.0)",
                             [event["id"], json.dumps(event["row"])])
            else:
                conn.execute("INSERT INTO received VALUES (?, 'team', ?, ?, 1.0)",
                             [event["id"], event["table"], json.dumps(event["row"])])
    conn.close()
    assert all(secret in json.dumps(stored(path)) for secret in SECRETS[:4])

    CollectorStore(path).close()
    assert_redacted(stored(path))
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM collector_meta").fetchall() == [(str(RULES_VERSION),)]
        # A row written raw afterwards (a test double for a rule that changes later) stays until
        # the rules version changes, once per version.
        with conn:
            conn.execute("UPDATE received SET row = ? WHERE id = 'oc1'", [json.dumps(old_rows()[3]["row"])])
    finally:
        conn.close()
    CollectorStore(path).close()
    assert stored(path)["oc1"]["kept_text"] == CURL
    monkeypatch.setattr(collector_module, "RULES_VERSION", RULES_VERSION + 1)
    CollectorStore(path).close()
    assert "Tr0ub4dor-77x" not in stored(path)["oc1"]["kept_text"]


def test_a_large_store_is_redacted_in_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(collector_module, "_REDACTION_BATCH", 7)
    path = tmp_path / "collector.db"
    CollectorStore(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM collector_meta")
        conn.executemany("INSERT INTO received VALUES (?, 'team', 'outcomes', ?, 1.0)",
                         [(f"o{i:03}", json.dumps({"id": f"o{i:03}", "kept_text": f"x = {i}\n{ENV}"}))
                          for i in range(50)])
        conn.executemany("INSERT INTO reference_documents VALUES (?, ?, ?, 1.0)",
                         [(team, f"h{i:02}", json.dumps({"id": f"h{i:02}", "text": NETRC, "redacted": 0}))
                          for team in ("a", "b") for i in range(10)])
    conn.close()
    CollectorStore(path).close()
    rows = stored(path)
    assert len(rows) == 50 + 10  # (the two teams' documents share hashes: one entry each here)
    assert not any("Kx7mQ2#pW9zL4v" in json.dumps(row) for row in rows.values())
    conn = sqlite3.connect(path)
    try:
        texts = [json.loads(r[0])["text"] for r in conn.execute("SELECT row FROM reference_documents")]
    finally:
        conn.close()
    assert len(texts) == 20 and not any("Hx8vN2qL5tR9" in text for text in texts)


async def test_a_served_prompt_this_squidcode_cannot_read_is_redacted_as_text_and_loses_its_ids(tmp_path):
    store = CollectorStore(tmp_path / "collector.db")
    app = create_app(store, {TOKEN: "team"})
    try:
        served = {"ids": [5, 6, 7], "references": "not a list", "line_suffix": f"# {ENV}", "start": 0}
        row = {"id": "ep-odd", "kind": "completion", "ts": 1.0, "prompt_text": PROMPT,
               "extra": {"served_prompt": served}}
        body = json.dumps({"events": [{"id": "ep-odd", "table": "episodes", "row": row}]}).encode()
        assert await call(app, "POST", "/v1/events", body) == (200, {"accepted": 1, "duplicates": 0})
        kept = stored(tmp_path / "collector.db")["ep-odd"]["extra"]["served_prompt"]
        assert "ids" not in kept and "Kx7mQ2#pW9zL4v" not in json.dumps(kept) and kept["start"] == 0
    finally:
        store.close()
