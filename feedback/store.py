"""The local feedback database: episodes, events, outcomes, sessions, model switches, upload outbox.

SQLite through sqlite-utils, in WAL mode so readers (reports, the uploader) never block the writer,
with `PRAGMA user_version` as the schema version and an ordered list of migrations. Every row has a
globally unique text id (uuid4 hex), which is also what makes uploads idempotent.

Nothing here redacts or decides what to keep: the recorder hands over rows that are already safe to
write. All writes are transactions; a process killed mid-write loses at most the transaction under
way, never one that returned.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from context.config import FeedbackConfig, default_data_dir
from context.errors import FeedbackStoreError

__all__ = [
    "FeedbackStore",
    "SCHEMA_VERSION",
    "TABLES",
    "EpisodeOutcomes",
    "default_db_path",
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
]
SCHEMA_VERSION = len(_MIGRATIONS)
TABLES = ("episodes", "events", "outcomes", "sessions", "model_switches")
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

        With `share`, each row is also queued in the outbox for upload. Returns the rows written.
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
                        [(row["id"], table, now) for table, row in batch],
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

    def outbox_batch(self, limit: int) -> list[dict[str, Any]]:
        """The oldest queued rows, each as {"id", "table", "row"}; rows since deleted are skipped."""
        queued = self.db.execute("SELECT id, tbl FROM outbox ORDER BY seq LIMIT ?", [limit]).fetchall()
        batch = []
        for row_id, table in queued:
            found = self.db.execute(f"SELECT * FROM {table} WHERE id = ?", [row_id]).fetchone()
            if found is None:
                self.outbox_remove([row_id])
                continue
            names = [d[0] for d in self.db.execute(f"SELECT * FROM {table} LIMIT 0").description]
            batch.append({"id": row_id, "table": table, "row": _decode(dict(zip(names, found, strict=True)))})
        return batch

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
            yield EpisodeOutcomes(episode, events, outcomes)

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
            self.db.execute("VACUUM")
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, self.path) from exc
        return deleted


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
    return {k: json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in row.items()}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    for key in JSON_COLUMNS & row.keys():
        if isinstance(row[key], str):
            row[key] = json.loads(row[key])
    return row
