"""The team collector: an ASGI app (served by uvicorn) that receives uploaded feedback.

    POST /v1/events   Authorization: Bearer TOKEN   {"events": [{"id", "table", "row"}, ...],
                                                     "redaction_rules": N}
        -> 200 {"accepted": n, "duplicates": m}; 400 bad JSON, 401 bad token, 413 too large,
           422 a malformed event (the whole batch is refused; nothing is stored); 429 (with
           Retry-After) for a team over its requests a minute, on any route
    GET  /v1/health   -> 200 {"ok": true}
    GET  /v1/stats    Authorization: Bearer TOKEN -> {"events": n, "by_table": {...}}  (that team's)
    POST /v1/adapters Authorization: Bearer TOKEN   a promoted adapter (`feedback.team_adapters`)
        -> 200 {"stored": version}; 409 that version is stored already; 413 too large; 422 malformed
           or its files do not match its sha256
    GET  /v1/adapters/latest    -> {"version", "sha256", "size", "meta"} of the team's newest; 404 none
    GET  /v1/adapters/VERSION   -> the adapter as it was published (that team's only; 404 otherwise)
    GET  /v1/report   Authorization: Bearer TOKEN -> what the team uploaded: counts, acceptance,
           persistence, by model, language and day (`feedback stats --json`'s object);
           `/v1/report?format=html` the same as the HTML page `squidcode feedback report` writes

An event's table is one of a member's shared tables (`feedback.store.TABLES`), or
`reference_documents`: a document shared completions were composed with, its id its content hash,
stored once per team and hash.

Rows arrive redacted by the member's squidcode (`feedback.recorder.sanitize_row`), under the rules
version the batch names (`redaction_rules`; none named: older than any). A batch redacted under
older rules than this collector's is redacted again before it is stored, and when the collector
starts with newer rules than its stored rows were redacted under, it redacts them all again once
(`feedback.store.redact_again`): a secret an older rule let through does not stay in the team's
store.

Tokens map to team names; rows are stored with the team of the token that sent them, in SQLite, or
in PostgreSQL when the store is given as a `postgresql://` URL (one transaction per batch; a row id
already stored is skipped, so a retried batch is stored once). Either store turns its database's
errors into FeedbackStoreError; the app answers 503 to those.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import logging
import queue
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import sqlite_utils

from context.errors import AdapterError, FeedbackStoreError
from context.sqlite_file import OpenedFile

from .redact import RULES_VERSION
from .store import REFERENCE_TABLE, TABLES, redact_again
from .team_adapters import MAX_ADAPTER_BYTES, unpack_adapter, valid_version

__all__ = [
    "CollectorStore",
    "PostgresCollectorStore",
    "open_collector_store",
    "RateLimit",
    "create_app",
    "parse_tokens",
    "MAX_BODY_BYTES",
    "MAX_EVENTS",
]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_EVENTS = 10_000
_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")


# The collector's schema, as ordered migrations: a database is brought from its version to the
# newest at open, its rows kept (SQLite: `PRAGMA user_version`; PostgreSQL: the `collector_schema`
# table). `{real}` is the engine's floating-point type.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: uploads, and published team adapters (one row per team and version, the JSON as it came).
    # Databases made before there were versions have these tables already: they are kept as they are.
    ("CREATE TABLE IF NOT EXISTS received (id TEXT PRIMARY KEY, team TEXT NOT NULL, tbl TEXT NOT NULL, "
     "row TEXT NOT NULL, received_at {real} NOT NULL)",
     "CREATE TABLE IF NOT EXISTS adapters (team TEXT NOT NULL, version TEXT NOT NULL, "
     "sha256 TEXT NOT NULL, size BIGINT NOT NULL, meta TEXT NOT NULL, payload TEXT NOT NULL, "
     "created_at {real} NOT NULL, PRIMARY KEY (team, version))"),
    # 2: every read is one team's rows of some tables (training, stats, the report): an index, not a
    # scan of all teams' uploads.
    ("CREATE INDEX IF NOT EXISTS received_team_tbl ON received (team, tbl)",),
    # 3: the reference documents (Squid) shared completions were composed with, one row per team and
    # content hash: the same document uploaded by two teams is each team's own.
    ("CREATE TABLE IF NOT EXISTS reference_documents (team TEXT NOT NULL, hash TEXT NOT NULL, "
     "row TEXT NOT NULL, received_at {real} NOT NULL, PRIMARY KEY (team, hash))",),
    # 4: settings of the store itself: the redaction rules its rows were last redacted under.
    ("CREATE TABLE IF NOT EXISTS collector_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",),
)
SCHEMA_VERSION = len(_MIGRATIONS)
_PUT_ADAPTER = ("INSERT INTO adapters (team, version, sha256, size, meta, payload, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (team, version) DO NOTHING")
_LATEST_ADAPTER = ("SELECT version, sha256, size, meta FROM adapters WHERE team = %s "
                   "ORDER BY created_at DESC LIMIT 1")
_GET_ADAPTER = "SELECT payload FROM adapters WHERE team = %s AND version = %s"
_TEAM_ROWS = "SELECT tbl, row FROM received WHERE team = %s"
_INSERT_RECEIVED = ("INSERT INTO received (id, team, tbl, row, received_at) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING")
_INSERT_DOCUMENT = ("INSERT INTO reference_documents (team, hash, row, received_at) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (team, hash) DO NOTHING")
_RULES = "SELECT value FROM collector_meta WHERE key = 'redaction_rules'"
_SET_RULES = ("INSERT INTO collector_meta (key, value) VALUES ('redaction_rules', %s) "
              "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
_REDACTION_BATCH = 500
_STATS = ("SELECT tbl, COUNT(*) FROM received WHERE team = %s GROUP BY tbl "
          f"UNION ALL SELECT '{REFERENCE_TABLE}', COUNT(*) FROM reference_documents WHERE team = %s")


def _rows_to_store(team: str, events: list[dict[str, Any]]) -> tuple[list[tuple], list[tuple]]:
    """A validated batch as rows of `received` and of `reference_documents`."""
    now = time.time()
    received = [(e["id"], team, e["table"], json.dumps(e["row"]), now)
                for e in events if e["table"] != REFERENCE_TABLE]
    documents = [(team, e["id"], json.dumps(e["row"]), now) for e in events if e["table"] == REFERENCE_TABLE]
    return received, documents


def _redacted_row(table: str, text: str) -> str | None:
    """A stored row's JSON redacted under the current rules; None when they change nothing."""
    try:
        row = json.loads(text)
    except ValueError:
        return None  # stored only after validation as JSON: not a row of ours
    return json.dumps(row) if isinstance(row, dict) and redact_again(table, row) else None


def _redact_events(events: list[dict[str, Any]]) -> int:
    """A batch's rows redacted in place under this collector's rules; how many changed."""
    return sum(redact_again(event["table"], event["row"]) for event in events)


def _redact_stored(execute) -> int:
    """Every stored row redacted again under the current rules, once per `RULES_VERSION` (in the
    caller's transaction); the number of rows changed. `execute(query, params)` runs one statement
    (`%s` placeholders) and returns its rows."""
    found = execute(_RULES, [])
    if found and str(found[0][0]).isdigit() and int(found[0][0]) >= RULES_VERSION:
        return 0
    changed, last = 0, ""
    while batch := execute("SELECT id, tbl, row FROM received WHERE id > %s ORDER BY id LIMIT %s",
                           [last, _REDACTION_BATCH]):
        for last, table, text in batch:
            if (clean := _redacted_row(table, text)) is not None:
                execute("UPDATE received SET row = %s WHERE id = %s", [clean, last])
                changed += 1
    team = digest = ""
    while batch := execute("SELECT team, hash, row FROM reference_documents WHERE team > %s OR "
                           "(team = %s AND hash > %s) ORDER BY team, hash LIMIT %s",
                           [team, team, digest, _REDACTION_BATCH]):
        for team, digest, text in batch:
            if (clean := _redacted_row(REFERENCE_TABLE, text)) is not None:
                execute("UPDATE reference_documents SET row = %s WHERE team = %s AND hash = %s",
                        [clean, team, digest])
                changed += 1
    execute(_SET_RULES, [str(RULES_VERSION)])
    if changed:
        log.info("collector store: %d stored rows redacted again (rules version %d)", changed, RULES_VERSION)
    return changed


def _rows_of(cursor) -> list[tuple]:
    return cursor.fetchall() if cursor.description else []


def _counts(rows: list[tuple[str, int]]) -> dict[str, Any]:
    counts = {table: n for table, n in rows if n}
    return {"events": sum(counts.values()), "by_table": counts}
_MIGRATION_LOCK = 0x5C0D_C011  # pg_advisory_xact_lock's key for the collector's migrations


def _adapter_info(row: tuple | None) -> dict[str, Any] | None:
    if row is None:
        return None
    version, sha256, size, meta = row
    return {"version": version, "sha256": sha256, "size": size, "meta": json.loads(meta)}


class CollectorStore:
    """The collector's SQLite database (WAL); safe to call from several threads."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            # No sqlite-utils plugins: nothing installed elsewhere gets to change this connection.
            self._db = sqlite_utils.Database(self._conn, execute_plugins=False)
            self._db.enable_wal()
            try:
                self._migrate()
            except FeedbackStoreError:
                self._conn.close()
                raise
        except OSError as exc:
            raise FeedbackStoreError(f"cannot create the collector database {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"cannot open the collector database {self.path}: {exc}") from exc
        self._file = OpenedFile(self.path)

    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise FeedbackStoreError(
                f"the collector database {self.path} has schema version {version}, newer than this "
                f"squidcode knows ({SCHEMA_VERSION}); upgrade squidcode or give another --db"
            )
        for target in range(version, SCHEMA_VERSION):
            with self._conn:
                for statement in _MIGRATIONS[target]:
                    self._conn.execute(statement.format(real="REAL"))
                # PRAGMA takes no parameters; the value is an int computed here.
                self._conn.execute(f"PRAGMA user_version = {target + 1}")
            log.info("collector database %s migrated to schema %d", self.path, target + 1)
        with self._conn:
            _redact_stored(lambda query, params: _rows_of(self._conn.execute(query.replace("%s", "?"),
                                                                             params)))

    def _follow_replacement(self) -> None:
        """Under the lock: a file deleted or replaced since it was opened is let go of (SQLite would
        go on writing into the unlinked file: every event accepted after would be lost)."""
        if self._file.replaced():
            log.warning("collector database %s was deleted or replaced while the server ran; storing "
                        "in a new file there", self.path)
            self._conn.close()
            self._file.drop_orphan_journals()
            self._open()

    def insert(self, team: str, events: list[dict[str, Any]]) -> tuple[int, int]:
        received, documents = _rows_to_store(team, events)
        try:
            with self._lock:
                self._follow_replacement()
                with self._conn:
                    before = self._conn.total_changes
                    # A row id already stored is skipped. Raw executemany, not sqlite-utils'
                    # insert_all(ignore=True): on 10,000-event batches (half repeats) that took 1.18x
                    # the CPU time and 2.1x the wall time (medians of 7 runs; 2-core Intel Xeon,
                    # sqlite-utils 4.2.1, 2026-12-02).
                    self._conn.executemany(_INSERT_RECEIVED.replace("%s", "?"), received)
                    self._conn.executemany(_INSERT_DOCUMENT.replace("%s", "?"), documents)
                    accepted = self._conn.total_changes - before
                self._file.note_journals()
        except sqlite3.Error as exc:
            raise FeedbackStoreError(
                f"the collector database {self.path} cannot store events: {exc}"
            ) from exc
        return accepted, len(events) - accepted

    def put_adapter(self, team: str, version: str, sha256: str, size: int, meta: dict, payload: str) -> bool:
        """Store a published adapter; False when the team has that version already."""
        try:
            with self._lock, self._conn:
                before = self._conn.total_changes
                self._conn.execute(_PUT_ADAPTER.replace("%s", "?"),
                                   [team, version, sha256, size, json.dumps(meta), payload, time.time()])
                return self._conn.total_changes > before
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"the collector database {self.path} cannot store an adapter: "
                                     f"{exc}") from exc

    def latest_adapter(self, team: str) -> dict[str, Any] | None:
        return _adapter_info(self._read(_LATEST_ADAPTER.replace("%s", "?"), [team]))

    def team_rows(self, team: str) -> list[tuple[str, str]]:
        """(table, row JSON) of everything the team uploaded."""
        try:
            with self._lock:
                return self._conn.execute(_TEAM_ROWS.replace("%s", "?"), [team]).fetchall()
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"the collector database {self.path} cannot be read: {exc}") from exc

    def adapter(self, team: str, version: str) -> str | None:
        row = self._read(_GET_ADAPTER.replace("%s", "?"), [team, version])
        return row[0] if row else None

    def _read(self, query: str, params: list) -> tuple | None:
        try:
            with self._lock:
                return self._conn.execute(query, params).fetchone()
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"the collector database {self.path} cannot be read: {exc}") from exc

    def stats(self, team: str) -> dict[str, Any]:
        try:
            with self._lock:
                rows = self._conn.execute(_STATS.replace("%s", "?"), [team, team]).fetchall()
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"the collector database {self.path} cannot be read: {exc}") from exc
        return _counts(rows)

    def close(self) -> None:
        self._conn.close()


class PostgresCollectorStore:
    """The collector's store in PostgreSQL (needs the `psycopg` package: `pip install psycopg[binary]`).

    A small pool of connections (`connections`), so that uploads from many members are stored side
    by side, each batch in its own transaction, rather than one after another on one connection."""

    def __init__(self, url: str, connections: int = 4):
        try:
            import psycopg
        except ImportError as exc:
            raise FeedbackStoreError(
                "a PostgreSQL collector store needs `pip install psycopg[binary]`"
            ) from exc
        self.path = url.split("@")[-1]  # for messages: never the password
        self._psycopg_error = psycopg.Error
        self._pool: queue.Queue = queue.Queue()
        try:
            for _ in range(max(1, connections)):
                self._pool.put(psycopg.connect(url, autocommit=False))
            with self._connection() as conn, conn.transaction():
                self._migrate(conn)
        except psycopg.Error as exc:
            self.close()
            raise FeedbackStoreError(
                f"cannot open the PostgreSQL collector store {self.path}: {exc}"
            ) from exc

    def _migrate(self, conn) -> None:
        """In one transaction, under a lock that a second collector starting at once waits for."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_MIGRATION_LOCK])
        conn.execute("CREATE TABLE IF NOT EXISTS collector_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM collector_schema").fetchone()
        version = row[0] if row else 0
        if version > SCHEMA_VERSION:
            raise FeedbackStoreError(
                f"the PostgreSQL collector store {self.path} has schema version {version}, newer than "
                f"this squidcode knows ({SCHEMA_VERSION}); upgrade squidcode"
            )
        for target in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[target]:
                conn.execute(statement.format(real="DOUBLE PRECISION"))
            log.info("PostgreSQL collector store %s migrated to schema %d", self.path, target + 1)
        if row is None:
            conn.execute("INSERT INTO collector_schema (version) VALUES (%s)", [SCHEMA_VERSION])
        elif version < SCHEMA_VERSION:
            conn.execute("UPDATE collector_schema SET version = %s", [SCHEMA_VERSION])
        _redact_stored(lambda query, params: _rows_of(conn.execute(query, params)))

    @contextlib.contextmanager
    def _connection(self):
        """A connection of the pool, to itself until the block ends."""
        conn = self._pool.get()
        try:
            yield conn
        finally:
            self._pool.put(conn)

    def insert(self, team: str, events: list[dict[str, Any]]) -> tuple[int, int]:
        received, documents = _rows_to_store(team, events)
        try:
            with self._connection() as conn, conn.transaction(), conn.cursor() as cursor:
                accepted = 0
                for statement, rows in ((_INSERT_RECEIVED, received), (_INSERT_DOCUMENT, documents)):
                    if rows:
                        cursor.executemany(statement, rows)
                        accepted += max(cursor.rowcount, 0)
        except self._psycopg_error as exc:
            raise FeedbackStoreError(f"the PostgreSQL collector store {self.path} cannot store events: "
                                     f"{exc}") from exc
        return accepted, len(events) - accepted

    def put_adapter(self, team: str, version: str, sha256: str, size: int, meta: dict, payload: str) -> bool:
        """Store a published adapter; False when the team has that version already."""
        try:
            with self._connection() as conn, conn.transaction(), conn.cursor() as cursor:
                cursor.execute(_PUT_ADAPTER,
                               [team, version, sha256, size, json.dumps(meta), payload, time.time()])
                return cursor.rowcount > 0
        except self._psycopg_error as exc:
            raise FeedbackStoreError(f"the PostgreSQL collector store {self.path} cannot store an adapter: "
                                     f"{exc}") from exc

    def latest_adapter(self, team: str) -> dict[str, Any] | None:
        return _adapter_info(self._read(_LATEST_ADAPTER, [team]))

    def team_rows(self, team: str) -> list[tuple[str, str]]:
        """(table, row JSON) of everything the team uploaded."""
        try:
            with self._connection() as conn, conn.transaction():
                return conn.execute(_TEAM_ROWS, [team]).fetchall()
        except self._psycopg_error as exc:
            raise FeedbackStoreError(f"the PostgreSQL collector store {self.path} cannot be read: "
                                     f"{exc}") from exc

    def adapter(self, team: str, version: str) -> str | None:
        row = self._read(_GET_ADAPTER, [team, version])
        return row[0] if row else None

    def _read(self, query: str, params: list) -> tuple | None:
        try:
            with self._connection() as conn, conn.transaction():
                return conn.execute(query, params).fetchone()
        except self._psycopg_error as exc:
            raise FeedbackStoreError(f"the PostgreSQL collector store {self.path} cannot be read: "
                                     f"{exc}") from exc

    def stats(self, team: str) -> dict[str, Any]:
        try:
            with self._connection() as conn, conn.transaction():
                rows = conn.execute(_STATS, [team, team]).fetchall()
        except self._psycopg_error as exc:
            raise FeedbackStoreError(f"the PostgreSQL collector store {self.path} cannot be read: "
                                     f"{exc}") from exc
        return _counts(rows)

    def close(self) -> None:
        while not self._pool.empty():
            self._pool.get_nowait().close()


def open_collector_store(target: str) -> CollectorStore | PostgresCollectorStore:
    """A PostgreSQL store for a `postgresql://` URL, else a SQLite file at that path."""
    if target.startswith(("postgresql://", "postgres://")):
        return PostgresCollectorStore(target)
    return CollectorStore(target)


def parse_tokens(spec: str) -> dict[str, str]:
    """Tokens from "team=token,team2=token2" (or lines of a file); a bare token is team "default"."""
    tokens: dict[str, str] = {}
    for item in re.split(r"[,\n]", spec):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        team, sep, token = item.partition("=")
        token, team = (token.strip(), team.strip()) if sep else (team, "default")
        if len(token) < 8:
            raise ValueError(f"collector token for team {team!r} is shorter than 8 characters")
        tokens[token] = team
    return tokens


def validate_batch(payload: Any) -> list[dict[str, Any]]:
    """The events of an upload, or ValueError saying what is wrong (the first problem found)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
        raise ValueError('expected {"events": [...]}')
    events = payload["events"]
    rules = payload.get("redaction_rules", 0)
    if isinstance(rules, bool) or not isinstance(rules, int) or rules < 0:
        raise ValueError("redaction_rules, where given, is the version of the rules that redacted the rows")
    if not 0 < len(events) <= MAX_EVENTS:
        raise ValueError(f"a batch holds 1 to {MAX_EVENTS} events, got {len(events)}")
    for index, event in enumerate(events):
        if not isinstance(event, dict) or set(event) != {"id", "table", "row"}:
            raise ValueError(f"event {index}: expected exactly the keys id, table, row")
        if not isinstance(event["id"], str) or not _ID.fullmatch(event["id"]):
            raise ValueError(f"event {index}: id must be 1-64 letters, digits, '-' or '_'")
        if event["table"] not in (*TABLES, REFERENCE_TABLE):
            raise ValueError(f"event {index}: table must be one of {', '.join((*TABLES, REFERENCE_TABLE))}")
        row = event["row"]
        if not isinstance(row, dict) or row.get("id") != event["id"]:
            raise ValueError(f"event {index}: row must be an object whose id is the event's id")
        if event["table"] == REFERENCE_TABLE and not isinstance(row.get("text"), str):
            raise ValueError(f"event {index}: a reference document's row has its text")
    return events


class RateLimit:
    """At most `per_minute` requests per team in any 60 s (0: no limit)."""

    def __init__(self, per_minute: int, clock=time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._seen: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def wait_s(self, team: str) -> float:
        """0 when the request may go ahead (it is counted), else seconds until one may."""
        if self.per_minute <= 0:
            return 0.0
        now, seen = self.clock(), self._seen[team]
        while seen and now - seen[0] >= 60.0:
            seen.popleft()
        if len(seen) >= self.per_minute:
            return 60.0 - (now - seen[0])
        seen.append(now)
        return 0.0


def create_app(store: CollectorStore | PostgresCollectorStore, tokens: dict[str, str],
               rate_per_minute: int = 600, clock=time.monotonic):
    """The ASGI application; a team over `rate_per_minute` requests gets 429 and Retry-After."""
    limit = RateLimit(rate_per_minute, clock)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/v1/health" and method == "GET":
            await _respond(send, 200, {"ok": True})
            return
        if path not in ("/v1/events", "/v1/stats", "/v1/adapters", "/v1/report") and not path.startswith(
                "/v1/adapters/"):
            await _respond(send, 404, {"error": f"no route {path}"})
            return
        team = _team(scope, tokens)
        if team is None:
            await _respond(send, 401, {"error": "missing or unknown bearer token"})
            return
        if wait := limit.wait_s(team):
            await _respond(send, 429, {"error": f"more than {rate_per_minute} requests a minute"},
                           [(b"retry-after", str(max(1, round(wait))).encode())])
            return
        if path.startswith("/v1/adapters"):
            status, body = await _adapters(method, path, receive, store, team)
            await _respond(send, status, body)
        elif path == "/v1/report" and method == "GET":
            await _report(send, store, team, scope.get("query_string", b"").decode("latin-1"))
        elif path == "/v1/stats" and method == "GET":
            status, body = await _stats(store, team)
            await _respond(send, status, body)
        elif path == "/v1/events" and method == "POST":
            status, body = await _receive_events(receive, store, team)
            await _respond(send, status, body)
        else:
            await _respond(send, 405, {"error": f"{method} not allowed on {path}"})

    return app


def _team(scope, tokens: dict[str, str]) -> str | None:
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    # Constant-time comparison against each known token.
    for known, team in tokens.items():
        if hmac.compare_digest(known.encode(), token.strip().encode()):
            return team
    return None


async def _receive_events(receive, store, team: str) -> tuple[int, dict]:
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            return 413, {"error": f"a batch is at most {MAX_BODY_BYTES} bytes"}
        if not message.get("more_body"):
            break
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return 400, {"error": f"body is not UTF-8 JSON: {exc}"}
    try:
        events = validate_batch(payload)
    except ValueError as exc:
        return 422, {"error": str(exc)}
    if payload.get("redaction_rules", 0) < RULES_VERSION:
        # Redacted by an older squidcode (or one that does not say): this collector's rules apply.
        redacted = await asyncio.to_thread(_redact_events, events)
        if redacted:
            log.info("team %s: %d uploaded rows redacted under rules version %d", team, redacted,
                     RULES_VERSION)
    try:
        accepted, duplicates = await asyncio.to_thread(store.insert, team, events)
    except FeedbackStoreError as exc:
        log.error("collector store failed: %s", exc)
        return 503, {"error": "the collector cannot store events right now"}
    return 200, {"accepted": accepted, "duplicates": duplicates}


async def _read_body(receive, limit: int) -> bytes | None:
    """The request body, or None past `limit` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return bytes(body)


async def _adapters(method: str, path: str, receive, store, team: str) -> tuple[int, dict]:
    """Publishing and pulling the team's adapters (`feedback.team_adapters`)."""
    try:
        if path == "/v1/adapters" and method == "POST":
            return await _publish(receive, store, team)
        if method != "GET":
            return 405, {"error": f"{method} not allowed on {path}"}
        name = path.removeprefix("/v1/adapters/")
        if name == "latest":
            latest = await asyncio.to_thread(store.latest_adapter, team)
            return (200, latest) if latest else (404, {"error": "no adapter published for this team"})
        payload = await asyncio.to_thread(store.adapter, team, name) if valid_version(name) else None
        # Another team's version is as absent as one never published.
        return (200, json.loads(payload)) if payload else (404, {"error": f"no adapter {name} for this team"})
    except FeedbackStoreError as exc:
        log.error("collector store failed: %s", exc)
        return 503, {"error": "the collector cannot reach its store right now"}


async def _publish(receive, store, team: str) -> tuple[int, dict]:
    body = await _read_body(receive, MAX_ADAPTER_BYTES * 4 // 3 + 1024 * 1024)
    if body is None:
        return 413, {"error": f"an adapter is at most {MAX_ADAPTER_BYTES} bytes"}
    try:
        payload = json.loads(body.decode("utf-8"))
        version, digest, meta, files = unpack_adapter(payload)
    except (UnicodeDecodeError, ValueError, AdapterError) as exc:
        return 422, {"error": str(exc)}
    size = sum(len(data) for data in files.values())
    stored = await asyncio.to_thread(store.put_adapter, team, version, digest, size, meta,
                                     json.dumps(payload))
    if not stored:
        return 409, {"error": f"adapter {version} is published already"}
    log.info("team %s published adapter %s (%d bytes)", team, version, size)
    return 200, {"stored": version}


async def _report(send, store, team: str, query: str) -> None:
    """The team's uploads summarised as the local report summarises a store (`feedback.report`)."""
    from .report import compute_stats, render_html
    from .team_records import TeamRecords

    try:
        rows = await asyncio.to_thread(store.team_rows, team)
    except FeedbackStoreError as exc:
        log.error("collector store failed: %s", exc)
        await _respond(send, 503, {"error": "the collector cannot read its store right now"})
        return
    stats = await asyncio.to_thread(compute_stats, TeamRecords(team, rows))
    if "format=html" not in query:
        await _respond(send, 200, stats)
        return
    page = render_html(stats).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/html; charset=utf-8"),
                            (b"content-length", str(len(page)).encode())]})
    await send({"type": "http.response.body", "body": page})


async def _stats(store, team: str) -> tuple[int, dict]:
    try:
        return 200, await asyncio.to_thread(store.stats, team)
    except FeedbackStoreError as exc:
        log.error("collector store failed: %s", exc)
        return 503, {"error": "the collector cannot read its store right now"}


async def _respond(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                        *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
