"""A store written before the redaction rules changed is redacted again when it opens.

The store here is written the way an older squidcode left it: schema version 1 (frozen below) with
no redaction rules version recorded, rows inserted directly with sqlite3, secrets that the old
rules let through still in them.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

import feedback.store as store_module
from context.prompt_record import ServedPrompt
from feedback.redact import RULES_VERSION, text_hash
from feedback.store import SERVED_PROMPT_KEY, FeedbackStore

# The schema as version 1 of the store created it.
SCHEMA_V1 = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    """CREATE TABLE episodes (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, ts REAL NOT NULL, session_id TEXT,
        model_id TEXT, adapter_id TEXT, uri TEXT, language TEXT,
        instruction TEXT, prompt_text TEXT, prompt_hash TEXT, output TEXT, output_hash TEXT,
        context_refs TEXT, candidates TEXT, chosen INTEGER, extra TEXT)""",
    """CREATE TABLE events (
        id TEXT PRIMARY KEY, episode_id TEXT, kind TEXT NOT NULL, ts REAL NOT NULL, data TEXT)""",
    """CREATE TABLE outcomes (
        id TEXT PRIMARY KEY, episode_id TEXT NOT NULL, region_id TEXT NOT NULL,
        checkpoint_s REAL NOT NULL, ts REAL NOT NULL, status TEXT NOT NULL, distance REAL,
        kept_text TEXT, kept_hash TEXT, source TEXT)""",
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY, started_at REAL NOT NULL, last_seen REAL NOT NULL, day TEXT NOT NULL,
        days_since_previous REAL)""",
    """CREATE TABLE model_switches (
        id TEXT PRIMARY KEY, ts REAL NOT NULL, from_model TEXT, to_model TEXT,
        last_episode_id TEXT, seconds_after_output REAL)""",
    """CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, tbl TEXT NOT NULL,
        created REAL NOT NULL)""",
]

# Fake secrets the old rules let through: a Redis URL with an empty user, a .env value with "#",
# `curl -u`, a Shopify token, an age key, a .netrc password.
REDIS = "redis://:Zq9#xLp2vR7k@cache:6379/0"
ENV = "DB_PASSWORD=Kx7mQ2#pW9zL4v\n"
CURL = "curl -u deploy:Tr0ub4dor-77x https://ci.example.net/api\n"
SHOPIFY = "shpat_" + "4f0c9e1a7b3d5e2f8a6c0b9d1e3f5a7c"
AGE = "AGE-SECRET-KEY-1" + "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" * 2
NETRC = "machine api.example.net login me password Hx8vN2qL5tR9\n"
# The columns that hold code or its hash (JSON columns: somewhere inside); the rest must not change.
CODE_COLUMNS = {"instruction", "prompt_text", "prompt_hash", "output", "output_hash", "context_refs",
                "candidates", "extra", "data", "kept_text", "kept_hash"}
SECRETS = ["Zq9#xLp2vR7k", "Kx7mQ2#pW9zL4v", "Tr0ub4dor-77x", SHOPIFY, AGE[16:], "Hx8vN2qL5tR9"]


def old_store(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    for statement in SCHEMA_V1:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    full_prompt = f"import redis\nr = redis.from_url('{REDIS}')\n"
    episodes = [
        # full mode: texts and the hashes of those texts
        ("ep-full", "agent", 1.0, "s1", "model-a", None, "file:///app.py", "python",
         f"deploy with {CURL}", full_prompt, text_hash(full_prompt), ENV, text_hash(ENV),
         json.dumps([{"uri": "file:///.netrc", "text": NETRC, "hash": "ref-hash-1"}]),
         json.dumps([{"diff": f"+TOKEN = '{SHOPIFY}'\n", "diff_hash": "old-diff-hash", "verified": True,
                      "checks": f"key {AGE} rejected"}]),
         0, json.dumps({"steps": []})),
        # hashed mode: only hashes were kept
        ("ep-hashed", "completion", 2.0, "s1", "model-a", None, "file:///b.py", "python",
         None, None, "prompt-hash-2", None, "output-hash-2", "[]", None, None,
         json.dumps({"position": [1, 2]})),
    ]  # fmt: skip
    conn.executemany(f"INSERT INTO episodes VALUES ({', '.join('?' * 17)})", episodes)
    conn.execute(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
        [
            "ev1",
            "ep-full",
            "applied",
            1.5,
            json.dumps({"new_text": ENV, "new_text_hash": text_hash(ENV), "n": 3}),
        ],
    )
    conn.execute(
        "INSERT INTO outcomes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ["oc1", "ep-full", "r1", 30.0, 31.0, "unchanged", 0.0, CURL, text_hash(CURL), "tracker"],
    )
    conn.execute("INSERT INTO sessions VALUES ('s1', 0.5, 3.0, '2026-12-01', NULL)")
    conn.commit()
    return conn


def stored(path) -> dict[str, list[dict]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return {
            table: [dict(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY id")]
            for table in ("episodes", "events", "outcomes", "sessions")
        }
    finally:
        conn.close()


def test_opening_an_old_store_redacts_every_stored_text_and_keeps_the_rest(tmp_path):
    path = tmp_path / "feedback.db"
    old_store(path).close()
    before = stored(path)
    assert all(secret in json.dumps(before) for secret in SECRETS)

    FeedbackStore(path).close()
    after = stored(path)

    dump = json.dumps(after)
    assert [s for s in SECRETS if s in dump] == []
    assert "[REDACTED:" in after["episodes"][0]["prompt_text"]
    # hashes follow their (new) texts; a hashed-mode row is left as it was
    full, hashed = after["episodes"]
    assert full["prompt_hash"] == text_hash(full["prompt_text"])
    assert full["output_hash"] == text_hash(full["output"])
    assert hashed == before["episodes"][1]
    candidate = json.loads(full["candidates"])[0]
    assert candidate["diff_hash"] == text_hash(candidate["diff"]) and candidate["verified"] is True
    assert json.loads(full["context_refs"])[0]["hash"] == "ref-hash-1"
    data = json.loads(after["events"][0]["data"])
    assert data["new_text_hash"] == text_hash(data["new_text"]) and data["n"] == 3
    assert after["outcomes"][0]["kept_hash"] == text_hash(after["outcomes"][0]["kept_text"])
    # everything that is not a code text is untouched
    for table, rows in after.items():
        for old, new in zip(before[table], rows, strict=True):
            untouched = set(old) - CODE_COLUMNS
            assert {k: new[k] for k in untouched} == {k: old[k] for k in untouched}, table


def test_the_rules_version_is_recorded_and_a_new_one_redacts_again(tmp_path, monkeypatch):
    path = tmp_path / "feedback.db"
    old_store(path).close()
    store = FeedbackStore(path)
    assert store.db.execute("SELECT value FROM meta WHERE key = 'redaction_rules'").fetchone() == (
        str(RULES_VERSION),
    )
    store.close()

    # A row written raw after the upgrade (as a test double for a rule that changes later) stays
    # until the rules version changes.
    conn = sqlite3.connect(path)
    conn.execute("UPDATE outcomes SET kept_text = ?", [CURL])
    conn.commit()
    conn.close()
    FeedbackStore(path).close()
    assert stored(path)["outcomes"][0]["kept_text"] == CURL
    monkeypatch.setattr(store_module, "RULES_VERSION", RULES_VERSION + 1)
    FeedbackStore(path).close()
    assert "Tr0ub4dor-77x" not in stored(path)["outcomes"][0]["kept_text"]


def test_a_read_only_open_leaves_the_file_alone(tmp_path):
    path = tmp_path / "feedback.db"
    old_store(path).close()
    before = stored(path)
    store = FeedbackStore(path, readonly=True)
    assert store.count("episodes") == 2
    store.close()
    assert stored(path) == before


@pytest.mark.parametrize("rows", [0, 1_234])
def test_large_stores_are_read_in_batches(tmp_path, rows):
    path = tmp_path / "feedback.db"
    conn = old_store(path)
    conn.executemany(
        "INSERT INTO outcomes (id, episode_id, region_id, checkpoint_s, ts, status, kept_text, kept_hash) "
        "VALUES (?, 'ep-full', 'r', 30.0, 1.0, 'unchanged', ?, NULL)",
        [(f"o{i:05}", f"x = {i}\n" + (REDIS if i % 100 == 0 else "")) for i in range(rows)],
    )
    conn.commit()
    conn.close()
    FeedbackStore(path).close()
    kept = [row["kept_text"] for row in stored(path)["outcomes"]]
    assert len(kept) == rows + 1 and not any("Zq9#xLp2vR7k" in text for text in kept)
    assert sum("x = " in text for text in kept) == rows


def test_what_an_episodes_extra_holds_is_redacted_again_and_hashes_are_left_alone(tmp_path):
    """The served prompt (its window's ids go with a changed window), a next edit's replaced text,
    an agent's steps; a hashed-mode agent episode's step values are hashes and stay as they were."""
    path = tmp_path / "feedback.db"
    conn = old_store(path)
    window = f"import redis\nr = redis.from_url('{REDIS}')\n"
    served = ServedPrompt(ids=(1, 2, 3), text=window, line_suffix=f"  # {ENV.strip()}",
                          following_lines=(NETRC.strip(), "x = 1"), suffix=CURL).to_json(with_text=False)
    step_hash = text_hash("read .netrc")
    extra = {SERVED_PROMPT_KEY: served, "replaces": ENV, "position": [3, 4],
             "steps": [{"tool": "read_file", "ok": True, "args": {"path": ".netrc", "why": CURL},
                        "answer": f"found {SHOPIFY}"}]}
    hashed_extra = {"steps": [{"tool": "read_file", "ok": False, "args": {"path": step_hash}}]}
    conn.executemany(
        "INSERT INTO episodes (id, kind, ts, prompt_text, prompt_hash, extra) VALUES (?, ?, ?, ?, ?, ?)",
        [("ep-extra", "completion", 3.0, window, text_hash(window), json.dumps(extra)),
         ("ep-steps-hashed", "agent", 4.0, None, "prompt-hash-4", json.dumps(hashed_extra))])
    conn.commit()
    conn.close()

    FeedbackStore(path).close()
    rows = {row["id"]: row for row in stored(path)["episodes"]}

    assert [s for s in SECRETS if s in json.dumps(rows["ep-extra"])] == []
    again = json.loads(rows["ep-extra"]["extra"])
    record = ServedPrompt.from_json(again[SERVED_PROMPT_KEY], text=rows["ep-extra"]["prompt_text"])
    assert record.ids is None  # ids of the old window would spell the secret
    assert record.following_lines[1] == "x = 1" and "[REDACTED:" in record.line_suffix
    assert "[REDACTED:" in again["replaces"] and again["position"] == [3, 4]
    assert again["steps"][0]["tool"] == "read_file" and again["steps"][0]["ok"] is True
    assert again["steps"][0]["args"]["path"] == ".netrc"
    assert json.loads(rows["ep-steps-hashed"]["extra"]) == hashed_extra
