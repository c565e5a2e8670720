"""The local feedback database: episodes, events, outcomes, sessions, model switches, upload outbox.

SQLite through sqlite-utils, in WAL mode so readers (reports, the uploader) never block the writer,
with `PRAGMA user_version` as the schema version and an ordered list of migrations. Every row has a
globally unique text id (uuid4 hex), which is also what makes uploads idempotent.

The recorder hands over rows that are already safe to write; the one redaction here runs when a
store opens after the redaction rules changed (`feedback.redact.RULES_VERSION`): what it holds is
redacted again under the new rules. All writes are transactions; a process killed mid-write loses at
most the transaction under way, never one that returned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from context.config import FeedbackConfig, default_data_dir
from context.errors import FeedbackStoreError

from .redact import RULES_VERSION, redact, text_hash

__all__ = [
    "FeedbackStore",
    "REFERENCE_TABLE",
    "SCHEMA_VERSION",
    "EXTRA_CODE_KEYS",
    "SERVED_PROMPT_KEY",
    "TABLES",
    "EpisodeOutcomes",
    "collector_key",
    "default_db_path",
    "named_references",
    "redact_again",
    "translate_sqlite_error",
    "JSON_COLUMNS",
]

log = logging.getLogger(__name__)

DB_NAME = "feedback.db"

# Each migration takes the schema from version i to i + 1.
_MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)""",
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
        "CREATE INDEX events_episode ON events(episode_id)",
        "CREATE INDEX outcomes_episode ON outcomes(episode_id)",
        "CREATE INDEX episodes_ts ON episodes(ts)",
    ],
    [
        # The reference documents completions were composed with (Squid), once per content hash
        # (`context.prompt_record.ReferenceIdentity.hash`, named by the episodes' served prompts):
        # their text redacted, and whether redaction changed it (then the text no longer tokenizes
        # to the hash's tokens, and a composition from it only approximates the served one).
        """CREATE TABLE reference_documents (
            hash TEXT PRIMARY KEY, ts REAL NOT NULL, text TEXT NOT NULL, redacted INTEGER NOT NULL)""",
    ],
    [
        # Reference documents are shared with the episodes that name them (a team trains on the
        # prompt it was served): the collector a document was last delivered to (`collector_key`),
        # so a document many shared episodes name is uploaded once per collector, not once each.
        "ALTER TABLE reference_documents ADD COLUMN shared_with TEXT",
    ],
]
SCHEMA_VERSION = len(_MIGRATIONS)
# A completion episode's `extra` holds its `context.prompt_record.ServedPrompt` under this key,
# without the window's text: that is the episode's `prompt_text`.
SERVED_PROMPT_KEY = "served_prompt"
TABLES = ("episodes", "events", "outcomes", "sessions", "model_switches")  # the ones that may be shared
# Shared too, with the episodes that name them; keyed by `hash`, sent with it as the row's id.
REFERENCE_TABLE = "reference_documents"
JSON_COLUMNS = {"context_refs", "candidates", "extra", "data"}


def default_db_path(config: FeedbackConfig | None = None) -> Path:
    if config is not None and config.db_path:
        return Path(config.db_path).expanduser()
    return default_data_dir() / DB_NAME


def translate_sqlite_error(exc: sqlite3.Error, path: Path | str) -> FeedbackStoreError:
    """A FeedbackStoreError whose message says what the user can do about `exc`."""
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        why = "is locked by another process; it will be retried"
    elif "readonly" in text or "read-only" in text:
        why = "is read-only; feedback is not being recorded (check the file's permissions)"
    elif "full" in text:
        why = "cannot grow: the disk is full; free space and recording resumes"
    elif "not a database" in text or "malformed" in text:
        why = "is damaged; run `squidcode feedback forget --all` to start a new one"
    else:
        why = f"failed ({exc})"
    return FeedbackStoreError(f"the feedback database {path} {why}")


@dataclass
class EpisodeOutcomes:
    """What a reward needs about one episode: its prompt, output, candidates and outcomes."""

    episode: dict[str, Any]
    events: list[dict[str, Any]]
    # One per region and checkpoint, oldest first: status, distance, kept_text, checkpoint_s.
    outcomes: list[dict[str, Any]]
    # The stored (redacted) texts of the reference documents its served prompt names, by hash.
    reference_texts: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return any(e["kind"] in ("accepted", "partially_accepted", "applied") for e in self.events)

    @property
    def reverted(self) -> bool:
        """True when the last checkpoint of any region found the edit undone."""
        return any(o["status"] == "reverted" for o in self.final_outcomes())

    def final_outcomes(self) -> list[dict[str, Any]]:
        last: dict[str, dict[str, Any]] = {}
        for outcome in self.outcomes:
            last[outcome["region_id"]] = outcome
        return list(last.values())


class FeedbackStore:
    """One feedback database file. Not shared between threads: each thread opens its own."""

    def __init__(self, path: Path | str, *, timeout_s: float = 5.0, readonly: bool = False):
        self.path = Path(path)
        try:
            if readonly:
                conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=timeout_s)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=timeout_s, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                # NORMAL in WAL: a committed transaction survives the process being killed.
                conn.execute("PRAGMA synchronous=NORMAL")
            self.db = sqlite_utils.Database(conn)
            if not readonly:
                self._migrate()
                _redact_stored_texts(conn, self.path)
            elif self.schema_version() > SCHEMA_VERSION:
                raise FeedbackStoreError(f"{self.path} was written by a newer squidcode")
        except OSError as exc:
            raise FeedbackStoreError(f"cannot create the feedback database {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc

    # -- schema --------------------------------------------------------------------------------

    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise FeedbackStoreError(
                f"{self.path} has schema version {version}, newer than this squidcode knows "
                f"({SCHEMA_VERSION}); upgrade squidcode or choose another feedback.db_path"
            )
        for target in range(version, SCHEMA_VERSION):
            with self.db.conn:
                for statement in _MIGRATIONS[target]:
                    self.db.execute(statement)
                # PRAGMA takes no parameters; the value is an int we computed.
                self.db.execute(f"PRAGMA user_version = {target + 1}")
            log.info("feedback store %s migrated to schema %d", self.path, target + 1)

    def close(self) -> None:
        self.db.conn.close()

    # -- writing -------------------------------------------------------------------------------

    def write(self, rows: Iterable[tuple[str, dict[str, Any]]], *, share: bool = False) -> int:
        """Insert (table, row) pairs in one transaction; rows whose id exists are left as they are.

        With `share`, each row of a shared table (`TABLES`) and each reference document is also
        queued in the outbox for upload (a document by its hash). Returns the rows written.
        """
        batch = [(table, _encode(row)) for table, row in rows]
        if not batch:
            return 0
        groups: dict[tuple[str, tuple[str, ...]], list[list[Any]]] = {}
        for table, row in batch:
            groups.setdefault((table, tuple(row)), []).append(list(row.values()))
        try:
            with self.db.conn:
                for (table, columns), values in groups.items():
                    marks = ", ".join("?" for _ in columns)
                    self.db.conn.executemany(
                        f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({marks})", values
                    )
                if share:
                    now = time.time()
                    self.db.conn.executemany(
                        "INSERT OR IGNORE INTO outbox (id, tbl, created) VALUES (?, ?, ?)",
                        [(row["hash"] if table == REFERENCE_TABLE else row["id"], table, now)
                         for table, row in batch if table in TABLES or table == REFERENCE_TABLE],
                    )
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc
        return len(batch)

    def touch_session(self, session_id: str, now: float) -> None:
        try:
            with self.db.conn:
                self.db.execute("UPDATE sessions SET last_seen = ? WHERE id = ?", [now, session_id])
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc

    def last_session_seen(self) -> float | None:
        row = self.db.execute("SELECT MAX(last_seen) FROM sessions").fetchone()
        return row[0] if row else None

    # -- the upload outbox ---------------------------------------------------------------------

    def outbox_batch(self, limit: int, collector: str | None = None) -> list[dict[str, Any]]:
        """The oldest queued rows, each as {"id", "table", "row"}; rows since deleted are skipped, and
        so are reference documents already delivered to `collector` (a `collector_key`). A
        reference document's row is its hash (as `id`), time, redacted text and `redacted` flag."""
        queued = self.db.execute("SELECT id, tbl FROM outbox ORDER BY seq LIMIT ?", [limit]).fetchall()
        batch, settled = [], []
        for row_id, table in queued:
            key = "hash" if table == REFERENCE_TABLE else "id"
            cursor = self.db.execute(f"SELECT * FROM {table} WHERE {key} = ?", [row_id])
            found = cursor.fetchone()
            if found is None:
                settled.append(row_id)
                continue
            row = _decode(dict(zip([d[0] for d in cursor.description], found, strict=True)))
            if table == REFERENCE_TABLE:
                if collector is not None and row.get("shared_with") == collector:
                    settled.append(row_id)
                    continue
                row = {"id": row["hash"], "ts": row["ts"], "text": row["text"], "redacted": row["redacted"]}
            batch.append({"id": row_id, "table": table, "row": row})
        if settled:
            self.outbox_remove(settled)
        return batch

    def outbox_delivered(self, ids: list[str], collector: str) -> None:
        """The collector (a `collector_key`) stored these queued rows: they leave the outbox, and
        the reference documents among them are not sent to that collector again."""
        try:
            with self.db.conn:
                for start in range(0, len(ids), 500):
                    part = ids[start : start + 500]
                    marks = ", ".join("?" for _ in part)
                    self.db.execute(f"UPDATE {REFERENCE_TABLE} SET shared_with = ? WHERE hash IN ({marks})",
                                    [collector, *part])
                self.db.conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc

    def outbox_remove(self, ids: list[str]) -> None:
        try:
            with self.db.conn:
                self.db.conn.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc

    def outbox_size(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

    # -- reading -------------------------------------------------------------------------------

    def count(self, table: str) -> int:
        return self.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]

    def rows(self, table: str, since: float | None = None, until: float | None = None) -> Iterator[dict]:
        time_column = "started_at" if table == "sessions" else "ts"
        where, params = _time_range(time_column, since, until)
        cursor = self.db.execute(f"SELECT * FROM {table}{where} ORDER BY {time_column}", params)
        names = [d[0] for d in cursor.description]
        for values in cursor:
            yield _decode(dict(zip(names, values, strict=True)))

    def episodes_with_outcomes(
        self, since: float | None = None, until: float | None = None
    ) -> Iterator[EpisodeOutcomes]:
        """Episodes started in [since, until), oldest first, with their events and outcomes."""
        for episode in self.rows("episodes", since, until):
            events = list(self._children("events", episode["id"]))
            outcomes = list(self._children("outcomes", episode["id"]))
            yield EpisodeOutcomes(episode, events, outcomes, self.reference_texts(named_references(episode)))

    def reference_texts(self, hashes: Iterable[str]) -> dict[str, str]:
        """The stored (redacted) texts of these reference documents, by content hash; those not
        stored are missing (a store written before they were, or in a storage mode without code)."""
        wanted = list(dict.fromkeys(hashes))
        if not wanted or not self._has_table(REFERENCE_TABLE):
            return {}
        texts = {}
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            marks = ", ".join("?" for _ in part)
            texts.update(self.db.execute(
                f"SELECT hash, text FROM {REFERENCE_TABLE} WHERE hash IN ({marks})", part).fetchall())
        return texts

    def _has_table(self, name: str) -> bool:
        # A read-only store may be of an older schema (it is never migrated).
        return self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                               [name]).fetchone() is not None

    def _children(self, table: str, episode_id: str) -> Iterator[dict]:
        order = "checkpoint_s, ts" if table == "outcomes" else "ts"
        cursor = self.db.execute(f"SELECT * FROM {table} WHERE episode_id = ? ORDER BY {order}", [episode_id])
        names = [d[0] for d in cursor.description]
        for values in cursor:
            yield _decode(dict(zip(names, values, strict=True)))

    # -- forgetting ----------------------------------------------------------------------------

    def forget(self, since: float | None = None) -> dict[str, int]:
        """Delete everything (since=None) or everything recorded at or after `since`; counts per table."""
        deleted: dict[str, int] = {}
        try:
            with self.db.conn:
                for table in (*TABLES, "outbox"):
                    column = {"sessions": "started_at", "outbox": "created"}.get(table, "ts")
                    where, params = _time_range(column, since, None)
                    deleted[table] = self.db.execute(f"DELETE FROM {table}{where}", params).rowcount
                if since is not None:
                    # Children of a forgotten episode go with it, whenever they were written.
                    for table in ("events", "outcomes"):
                        deleted[table] += self.db.execute(
                            f"DELETE FROM {table} WHERE episode_id IS NOT NULL AND episode_id NOT IN "
                            "(SELECT id FROM episodes) AND episode_id != ''"
                        ).rowcount
                # A reference document goes with the last episode that names it.
                deleted[REFERENCE_TABLE] = self.db.execute(
                    f"DELETE FROM {REFERENCE_TABLE} WHERE hash NOT IN ({_NAMED_REFERENCES})").rowcount
            self.db.execute("VACUUM")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc
        return deleted


def named_references(episode: dict[str, Any]) -> list[str]:
    """The content hashes of the reference documents `episode`'s served prompt names."""
    extra = episode.get("extra")
    served = extra.get(SERVED_PROMPT_KEY) if isinstance(extra, dict) else None
    references = served.get("references") if isinstance(served, dict) else None
    return [str(ref["hash"]) for ref in references or () if isinstance(ref, dict) and ref.get("hash")]


def collector_key(endpoint: str, token: str) -> str:
    """Which collector and team a row was delivered to, without keeping the token."""
    return hashlib.sha256(f"{endpoint.rstrip('/')}\n{token}".encode()).hexdigest()[:16]


# The content hashes of the reference documents the stored episodes' served prompts name.
_NAMED_REFERENCES = (
    "SELECT json_extract(ref.value, '$.hash') FROM episodes, json_each("
    "CASE WHEN json_valid(episodes.extra) THEN episodes.extra ELSE '{}' END, "
    f"'$.{SERVED_PROMPT_KEY}.references') AS ref WHERE json_extract(ref.value, '$.hash') IS NOT NULL"
)


def _time_range(column: str, since: float | None, until: float | None) -> tuple[str, list[float]]:
    clauses, params = [], []
    if since is not None:
        clauses.append(f"{column} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{column} < ?")
        params.append(until)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in JSON_COLUMNS and v is not None else _storable(v) for k, v in row.items()}


def _storable(value: Any) -> Any:
    """Text SQLite can hold: a lone surrogate (a URI or model name decoded with surrogateescape, a
    broken client) would make the whole batch fail to encode. It becomes U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    return value


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for key in JSON_COLUMNS & row.keys():
        if isinstance(row[key], str):
            row[key] = json.loads(row[key])
    return row


# -- redacting what is stored under the current rules ----------------------------------------------

# Code an episode's `extra` may hold (a next edit's replaced text, the region the model path rewrote
# and its rewrite): redacted, and kept or dropped per storage mode, as the episode's own texts are.
EXTRA_CODE_KEYS = ("replaces", "region_before", "region_after", "rewrite")
_HASH = re.compile(r"[0-9a-f]{64}")  # what `text_hash` writes: a value stored as its hash
_REDACTION_BATCH = 500


def redact_again(table: str, row: dict[str, Any]) -> bool:
    """Redact, in place, every code text a stored row of `table` keeps (its JSON columns decoded)
    under the current rules; True when anything changed. A hash follows its changed text; a value
    kept only as its hash (the `hashed` storage mode) is left alone, and so is everything that is
    not code (ids, times, statuses, numbers).

    What the recorder writes (`recorder.sanitize_row`) is already redacted; this is for rows
    redacted under older rules: a store that opens after the rules changed, and the collector with
    rows a member's older squidcode redacted."""
    changed = False

    def text(holder: Any, key: str, hash_key: str | None = None) -> None:
        nonlocal changed
        value = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(value, str):
            return
        clean = redact(value).text
        if clean != value:
            holder[key], changed = clean, True
            if hash_key and holder.get(hash_key) is not None:
                holder[hash_key] = text_hash(clean)

    if table == "episodes":
        extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
        served = extra.get(SERVED_PROMPT_KEY)
        if isinstance(served, dict):
            changed |= _redact_served_prompt(extra, served, row.get("prompt_text"))
        for key, hash_key in (("prompt_text", "prompt_hash"), ("output", "output_hash")):
            text(row, key, hash_key)
        text(row, "instruction")
        for ref in _items(row.get("context_refs")):
            for key in [k for k, v in ref.items() if isinstance(v, str) and k != "hash"]:
                text(ref, key)
        for candidate in _items(row.get("candidates")):
            text(candidate, "diff", "diff_hash")
            text(candidate, "checks")
        for key in EXTRA_CODE_KEYS:
            text(extra, key)
        if isinstance(extra.get("steps"), list):
            steps = [_redact_step_texts(step) for step in extra["steps"]]
            if steps != extra["steps"]:
                extra["steps"], changed = steps, True
    elif table == "events":
        for key in ("new_text", "old_text"):
            text(row.get("data"), key, f"{key}_hash")
    elif table == "outcomes":
        text(row, "kept_text", "kept_hash")
    elif table == REFERENCE_TABLE:
        before = row.get("text")
        text(row, "text")
        if row.get("text") != before:
            row["redacted"] = 1  # its text no longer spells the tokens its hash names
    return changed


def _items(value: Any) -> list[dict]:
    """The objects of a JSON column that holds one object or a list of them."""
    return [item for item in (value if isinstance(value, list) else [value]) if isinstance(item, dict)]


def _redact_served_prompt(extra: dict[str, Any], served: dict[str, Any], window: Any) -> bool:
    """The episode's served prompt (`SERVED_PROMPT_KEY`) under the current rules: its token ids go
    when the rules change the window (ids of a secret spell it). Its code is kept where the episode
    kept its window's text."""
    from context.prompt_record import ServedPrompt

    keep = isinstance(window, str)
    try:
        record = ServedPrompt.from_json(served, text=window if keep else "")
        again = record.for_storage(lambda t: redact(t).text, keep_code=keep).to_json(with_text=False)
    except (TypeError, ValueError, KeyError, AttributeError):
        # Not a record this squidcode can read (another version's, or damaged): every text in it
        # redacted as an agent step's are, and no token ids (they could spell what was redacted).
        again = {k: _redact_step_texts(v) for k, v in served.items() if k != "ids"}
    if again == served:
        return False
    extra[SERVED_PROMPT_KEY] = again
    return True


def _redact_step_texts(value: Any) -> Any:
    """An agent step (`recorder._sanitize_step`'s) with its texts redacted; its tool name, its
    outcome and values kept as hashes as they are."""
    if isinstance(value, str):
        return value if _HASH.fullmatch(value) else redact(value).text
    if isinstance(value, dict):
        return {k: (v if k in ("tool", "ok") else _redact_step_texts(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_step_texts(v) for v in value]
    return value


def _redact_stored_texts(conn: sqlite3.Connection, path: Path | str = "") -> int:
    """Redact every stored code text again, once per `RULES_VERSION`; the number of rows changed.

    One transaction, read in batches (`redact_again` says what is code and what is left alone).
    """
    if _rules_version(conn) >= RULES_VERSION:
        return 0
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        if _rules_version(conn) >= RULES_VERSION:
            return 0  # another process did it while this one waited for the lock
        tables = ("episodes", "events", "outcomes", REFERENCE_TABLE)
        changed = sum(_redact_table(conn, table) for table in tables)
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('redaction_rules', ?)", [str(RULES_VERSION)]
        )
    if changed:
        log.info("feedback store %s: %d rows redacted again (rules version %d)", path, changed, RULES_VERSION)
    return changed


def _redact_table(conn: sqlite3.Connection, table: str) -> int:
    changed = last = 0
    query = f"SELECT rowid, * FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?"
    while True:
        cursor = conn.execute(query, [last, _REDACTION_BATCH])
        names = [d[0] for d in cursor.description]
        batch = cursor.fetchall()
        if not batch:
            return changed
        for values in batch:
            row = dict(zip(names, values, strict=True))
            last = row.pop("rowid")
            updates = _redacted_columns(table, row)
            if updates:
                assignments = ", ".join(f"{column} = ?" for column in updates)
                conn.execute(f"UPDATE {table} SET {assignments} WHERE rowid = ?", [*updates.values(), last])
                changed += 1


def _rules_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = 'redaction_rules'").fetchone()
    return int(row[0]) if row and str(row[0]).isdigit() else 0


def _redacted_columns(table: str, stored: dict[str, Any]) -> dict[str, Any]:
    """The columns of a stored row that the current rules change, as they are to be written."""
    row, text_columns = {}, set()
    for column, value in stored.items():
        if column in JSON_COLUMNS and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                text_columns.add(column)  # not JSON after all: redacted as text
        row[column] = value
    updates = {}
    for column in text_columns:
        clean = redact(row[column]).text
        if clean != row[column]:
            updates[column] = row[column] = clean
    if redact_again(table, row):
        updates.update({column: json.dumps(value) if column in JSON_COLUMNS and column not in text_columns
                        else value for column, value in row.items() if value != _decoded(stored, column)})
    return updates


def _decoded(stored: dict[str, Any], column: str) -> Any:
    value = stored[column]
    if column in JSON_COLUMNS and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
