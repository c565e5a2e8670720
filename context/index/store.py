"""The repository index on disk: one SQLite file (WAL) holding files, chunks, symbols and references,
with an FTS5 index over the chunks.

Layout: `files` has one row per indexed file; `chunks`, `symbols` and `refs` hang off it with
ON DELETE CASCADE, so replacing or removing a file is one DELETE plus inserts in one transaction.
`chunks_fts` is an external-content FTS5 table over `chunks`, kept in sync by triggers (they also
fire for cascaded deletes). The tokenizer is `unicode61`, which already splits snake_case at '_';
each chunk also carries `terms`: the camelCase parts and the joined snake_case forms of its
identifiers, so "url split" finds `urlSplit`, `url_split` and (through the query's joined pairs)
`urlsplit`.

Vectors (the optional semantic ranker, `context.index.semantic`): `vectors` maps a content key (a
hash of the embedded text and the model) to a float16 blob; `chunks.vec_key` points a chunk at its
vector, NULL until the background embedder has reached it. Keys outlive re-parses: a file whose
chunks come back with the same heads gets its vectors back without running the model.

Schema versions: an index of an older version listed in `_MIGRATIONS` is migrated in place (one
transaction per step); any other version is moved aside and rebuilt.

SQL and sqlite-utils: the schema is plain DDL, because sqlite-utils' `create()` and `enable_fts()`
cannot say what it needs (COLLATE NOCASE and UNIQUE columns, WITHOUT ROWID tables, an external-content
FTS5 table with its own triggers) and every existing index file has exactly this schema. Schema
changes (the migrations) and the `meta` upserts go through sqlite-utils, which runs them inside the
store's own transaction (savepoints; sqlite-utils 4). The per-file inserts stay raw `executemany`:
sqlite-utils' `insert_all` measured slower on this hot path (see `replace_file`).

Threads: every thread gets its own connection (WAL lets readers run while a writer commits); writes
are serialised by a lock. A damaged or foreign database file is moved aside on open and a fresh one
is created: the index is a cache and can always be rebuilt.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from ..errors import IndexCorruptError, IndexStoreError
from ..sqlite_file import OpenedFile
from .types import ParsedFile, SourceFile

__all__ = [
    "SCHEMA_VERSION",
    "ChunkRow",
    "SymbolRow",
    "FileRow",
    "IndexStore",
    "chunk_terms",
    "fts_match_expression",
    "identifier_terms",
    "query_terms",
]

log = logging.getLogger(__name__)

# Bump when the schema or what is stored changes, with a step in `_MIGRATIONS` from the last version
# (an index of an unknown version is rebuilt).
SCHEMA_VERSION = 2

# bm25 weights per FTS column (text, symbol, rel, terms): a hit on a definition's name or the file's
# path says more than one word somewhere in a body. The identifier parts in `terms` help queries
# written as separate words ("url split") but are noisy, hence their low weight (measured on the
# stdlib: at 1.0 they cost natural-language queries recall, at 0.25 they do not).
_BM25 = "bm25(chunks_fts, 1.0, 4.0, 2.0, 0.25)"
_MAX_QUERY_TERMS = 32
_MAX_QUERY_CHARS = 4000
_FETCH = 1000

# Also a migration step; sqlite-utils' create() has no WITHOUT ROWID.
_VECTORS_TABLE = "CREATE TABLE IF NOT EXISTS vectors(key TEXT PRIMARY KEY, vec BLOB NOT NULL) WITHOUT ROWID"

_SCHEMA = f"""
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    root TEXT NOT NULL,
    rel TEXT NOT NULL,
    language TEXT,
    content_hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime REAL NOT NULL,
    indexed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    symbol TEXT,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    rel TEXT NOT NULL,
    terms TEXT NOT NULL,
    vec_key TEXT
);
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file_id);
CREATE INDEX IF NOT EXISTS chunks_vec_key ON chunks(vec_key);
{_VECTORS_TABLE};
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, symbol, rel, terms,
    content='chunks', content_rowid='id',
    tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text, symbol, rel, terms)
    VALUES (new.id, new.text, new.symbol, new.rel, new.terms);
END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text, symbol, rel, terms)
    VALUES ('delete', old.id, old.text, old.symbol, old.rel, old.terms);
END;
CREATE TRIGGER IF NOT EXISTS chunks_au AFTER UPDATE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text, symbol, rel, terms)
    VALUES ('delete', old.id, old.text, old.symbol, old.rel, old.terms);
    INSERT INTO chunks_fts(rowid, text, symbol, rel, terms)
    VALUES (new.id, new.text, new.symbol, new.rel, new.terms);
END;
CREATE TABLE IF NOT EXISTS symbols(
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    name TEXT NOT NULL COLLATE NOCASE,
    qualname TEXT NOT NULL COLLATE NOCASE,
    tail TEXT NOT NULL COLLATE NOCASE,
    kind TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    signature TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS symbols_name ON symbols(name COLLATE NOCASE);
CREATE INDEX IF NOT EXISTS symbols_tail ON symbols(tail COLLATE NOCASE);
CREATE INDEX IF NOT EXISTS symbols_file ON symbols(file_id);
CREATE TABLE IF NOT EXISTS refs(
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    line INTEGER NOT NULL,
    PRIMARY KEY (file_id, name, line)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS refs_name ON refs(name);
COMMIT;
"""

_EXPECTED_TABLES = {"meta", "files", "chunks", "chunks_fts", "symbols", "refs", "vectors"}


def _add_chunk_vectors(db: sqlite_utils.Database) -> None:
    """1 -> 2: chunk vectors for the semantic ranker; existing rows keep everything and get no vector
    yet (the background embedder fills them in)."""
    db["chunks"].add_column("vec_key", str)
    db["chunks"].create_index(["vec_key"], index_name="chunks_vec_key", if_not_exists=True)
    db.execute(_VECTORS_TABLE)


# version -> the step that brings an index of that version to the next one, inside the caller's
# write transaction.
_MIGRATIONS: dict[int, Callable[[sqlite_utils.Database], None]] = {
    1: _add_chunk_vectors,
}

# Definitions before variables when several symbols share a name.
_KIND_RANK = {"class": 0, "struct": 0, "interface": 0, "trait": 0, "enum": 0, "type": 1,
              "function": 1, "method": 2}


@dataclass(frozen=True)
class ChunkRow:
    """A chunk found by full-text search; `score` is the negated BM25 rank (higher is better)."""

    path: str
    rel: str
    start_line: int
    end_line: int
    symbol: str | None
    kind: str
    text: str
    score: float


@dataclass(frozen=True)
class SymbolRow:
    path: str
    rel: str
    name: str
    qualname: str
    kind: str
    start_line: int
    end_line: int
    signature: str


@dataclass(frozen=True)
class FileRow:
    path: str
    root: str
    rel: str
    language: str | None
    content_hash: str
    size: int
    mtime: float


# --- query and term helpers -------------------------------------------------------------------

# unicode61 keeps letters and digits and splits on everything else, '_' included.
_WORD = re.compile(r"[^\W_]+")
_CAMEL_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_IDENT = re.compile(r"\w+")
_HUMP = re.compile(r"[a-z0-9][A-Z]|[A-Z][A-Z][a-z]")
_STOPWORDS = frozenset(
    "a an and are as at be by do does for from how i in is it of on or the this that to we what "
    "where which who why with".split()
)


def _camel_parts(word: str) -> list[str]:
    parts = _CAMEL_PART.findall(word)
    return [p.lower() for p in parts] if len(parts) > 1 else []


def identifier_terms(text: str) -> str:
    """The extra search terms of a chunk: camelCase parts and joined snake_case names, deduplicated."""
    terms: dict[str, None] = {}
    for word in set(_IDENT.findall(text)):
        snake = "_" in word.strip("_")
        if snake:
            terms[word.replace("_", "").lower()] = None
        for piece in word.split("_") if snake else (word,):
            if _HUMP.search(piece):
                terms.update(dict.fromkeys(_camel_parts(piece)))
    return " ".join(terms)


def chunk_terms(parsed: ParsedFile) -> list[str]:
    """`identifier_terms` of each chunk (with its symbol), in order; cheap to compute in a worker."""
    return [identifier_terms(c.text if c.symbol is None else f"{c.symbol}\n{c.text}") for c in parsed.chunks]


def query_terms(query: str) -> list[str]:
    """Free text -> lowercase search terms: its words, their camelCase parts, adjacent words joined."""
    words = _WORD.findall(query[:_MAX_QUERY_CHARS])[:_MAX_QUERY_TERMS]
    terms: dict[str, None] = {}
    for word in words:
        terms[word.lower()] = None
        if _HUMP.search(word):
            terms.update(dict.fromkeys(_camel_parts(word)))
    for first, second in zip(words, words[1:], strict=False):
        if first.lower() not in _STOPWORDS and second.lower() not in _STOPWORDS:
            terms[(first + second).lower()] = None
    kept = [t for t in terms if t not in _STOPWORDS]
    return (kept or list(terms))[:_MAX_QUERY_TERMS]


def fts_match_expression(query: str) -> str | None:
    """A safe FTS5 MATCH expression (quoted terms, OR-ed) for free text, or None if it has no words."""
    terms = query_terms(query)
    if not terms:
        return None
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


# --- errors -----------------------------------------------------------------------------------

_CORRUPT_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _is_corruption(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "").startswith(_CORRUPT_CODES)


def _translate(exc: sqlite3.Error, action: str) -> IndexStoreError:
    if _is_corruption(exc):
        return IndexCorruptError(f"the index database is damaged ({exc}) while trying to {action}")
    return IndexStoreError(f"cannot {action} in the index database: {exc}")


@contextmanager
def _sqlite_errors(action: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate(exc, action) from exc


# --- opening, checking, moving aside ----------------------------------------------------------


def _problem_with(path: Path) -> str | None:
    """Why an existing database file cannot be used as an index (it is damaged or not ours), or None
    if it can. Errors that say nothing about the file itself (busy, permissions) raise instead."""
    try:
        # Read-only: a read-write connection would delete the -wal/-shm of a damaged file on close.
        conn = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None,
                               timeout=30)
        try:
            return _check_contents(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if _is_corruption(exc):
            return str(exc)
        raise IndexStoreError(f"cannot open the index database {path}: {exc}") from exc


def _parse_version(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _migratable(version: int | None) -> bool:
    """An older version from which every step up to SCHEMA_VERSION is known."""
    return version is not None and version < SCHEMA_VERSION and all(
        v in _MIGRATIONS for v in range(version, SCHEMA_VERSION))


def _set_meta(db: sqlite_utils.Database, key: str, value: str) -> None:
    db["meta"].upsert({"key": key, "value": value}, pk="key")


def _migrate(db: sqlite_utils.Database) -> int | None:
    """Bring an index of an older version up to SCHEMA_VERSION, one transaction per step; returns the
    version it started from (None when there was nothing to do). Safe against another process
    opening the same file: each step re-reads the version inside its write transaction."""
    if not db["meta"].exists():
        return None  # a new, empty database
    conn = db.conn
    started = None
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = _parse_version(row[0] if row else None)
            if version is None or version >= SCHEMA_VERSION:
                conn.execute("COMMIT")
                return started
            _MIGRATIONS[version](db)
            _set_meta(db, "schema_version", str(version + 1))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        started = version if started is None else started
        log.info("migrated the index database from schema version %d to %d", version, version + 1)


def _check_contents(conn: sqlite3.Connection) -> str | None:
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        return f"quick_check failed: {check}"
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    if "meta" not in tables:
        return "it is not a squidcode index (no meta table)"
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = _parse_version(row[0] if row else None)
    if version != SCHEMA_VERSION and not _migratable(version):
        return f"schema version {row[0] if row else 'none'}, expected {SCHEMA_VERSION}"
    if version != SCHEMA_VERSION:
        return None  # migrated on open; its tables are checked against its own version's there
    if not _EXPECTED_TABLES <= tables:
        return f"tables missing: {', '.join(sorted(_EXPECTED_TABLES - tables))}"
    return None


def _companions(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]


def _move_aside(path: Path, reason: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    try:
        os.replace(path, target)
        for companion, moved in zip(_companions(path), _companions(target), strict=True):
            if companion.exists():
                os.replace(companion, moved)
    except OSError as exc:
        raise IndexStoreError(f"the index {path} is unusable ({reason}) and cannot be moved aside: "
                              f"{exc.strerror}") from exc
    log.warning("index database %s is unusable (%s); moved it to %s and starting a fresh index",
                path, reason, target)
    return target


class IndexStore:
    """The SQLite repository index. Safe to share between threads (one connection per thread)."""

    def __init__(self, db_path: Path) -> None:
        self.path = Path(db_path)
        self.recovered_from: Path | None = None
        self.migrated_from: int | None = None  # the schema version this open migrated from
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._write_lock = threading.RLock()
        self._depth = 0
        self._closed = False
        self._epoch = 0  # bumped when the file is replaced: older connections are let go
        self.replacements = 0  # times the file was deleted or replaced under the open store
        self._file: OpenedFile | None = None
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IndexStoreError(
                f"cannot create the index folder {self.path.parent}: {exc.strerror}"
            ) from exc
        if self.path.exists():
            reason = _problem_with(self.path)
            if reason is not None:
                self.recovered_from = _move_aside(self.path, reason)
        else:
            # A WAL left without its database would be replayed into the new, empty one.
            for companion in _companions(self.path):
                companion.unlink(missing_ok=True)
        with _sqlite_errors("create the schema"):
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            self.migrated_from = _migrate(self._db())
            conn.executescript(_SCHEMA)
        self._file = OpenedFile(self.path)

    # --- connections and transactions ---

    def _connect(self) -> sqlite3.Connection:
        with _sqlite_errors("open the database"):
            conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                   timeout=30)
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute("PRAGMA cache_size=-16384")
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.epoch != self._epoch:
            self._release(conn)  # it has the file that was replaced open
            conn = None
        if conn is None and self._follow_replacement():
            conn = self._local.conn  # opened on the new file
        if conn is None:
            if self._closed:
                raise IndexStoreError(f"the index store {self.path} is closed")
            conn = self._connect()
            self._local.conn, self._local.epoch = conn, self._epoch
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._conns_lock:
            if conn in self._conns:
                self._conns.remove(conn)
        try:
            conn.close()
        except sqlite3.Error as exc:
            log.debug("closing an index connection failed: %s", exc)

    def _follow_replacement(self) -> bool:
        """Before a write or a new connection: open a new index at the path if the file was deleted
        or replaced.

        SQLite would write into the file it has open (unlinked, every change is lost). The new
        file starts empty; `replacements` tells the indexer that a full pass is due. Reads made
        before this go on from the old file. True when the file was replaced.
        """
        if self._closed or self._file is None or getattr(self._local, "reopening", False):
            return False
        if not self._file.replaced():
            return False
        with self._write_lock:
            if not self._file.replaced():
                return False  # another thread got there first
            log.warning("index database %s was deleted or replaced while squidcode ran; starting a new "
                        "one there", self.path)
            self._epoch += 1
            self._file.drop_orphan_journals()  # connections still open keep theirs, unlinked
            self._local.reopening = True
            try:
                self._open()
            finally:
                self._local.reopening = False
            self.replacements += 1
        return True

    def _db(self) -> sqlite_utils.Database:
        """This thread's connection seen through sqlite-utils (a thin wrapper: no SQL runs to make it).
        Recursive triggers stay off, as on the plain connection; no sqlite-utils plugins run."""
        return sqlite_utils.Database(self._conn(), recursive_triggers=False, execute_plugins=False)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction; nested calls join the outer one. Rolled back on any exception."""
        with self._write_lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._follow_replacement()
            conn = self._conn()
            with _sqlite_errors("begin a transaction"):
                conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                with _sqlite_errors("commit"):
                    conn.execute("COMMIT")
                self._file.note_journals()
            finally:
                self._depth = 0

    def close(self) -> None:
        with self._conns_lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error as exc:
                log.debug("closing an index connection failed: %s", exc)

    def __enter__(self) -> IndexStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- writes ---

    def replace_file(self, source: SourceFile, content_hash: str, parsed: ParsedFile,
                     terms: list[str] | None = None) -> None:
        """Replace everything stored for `source.path` with `parsed`, atomically. `terms`: the
        precomputed `chunk_terms(parsed)`, if a worker already did that work."""
        rel = source.rel
        terms = chunk_terms(parsed) if terms is None else terms
        # Raw executemany, not sqlite-utils' insert/insert_all: writing 300 pre-parsed stdlib files
        # (6,002 chunks, 7,294 symbols, 38,936 references) took 1.31x the CPU time through insert_all
        # with dict rows and 1.20x with list rows (medians of 7 runs; 2-core Intel Xeon, Python 3.11,
        # SQLite 3.40, sqlite-utils 4.2.1, 2026-12-02). It inspects the table on every call.
        chunk_rows = [(c.start_line, c.end_line, c.symbol, c.kind, c.text, rel, t)
                      for c, t in zip(parsed.chunks, terms, strict=True)]
        with self.transaction(), _sqlite_errors(f"store {source.path}"):
            conn = self._conn()
            conn.execute("DELETE FROM files WHERE path = ?", (str(source.path),))
            file_id = conn.execute(
                "INSERT INTO files(path, root, rel, language, content_hash, size, mtime, indexed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (str(source.path), str(source.root), rel, parsed.language, content_hash,
                 source.size, source.mtime, time.time()),
            ).lastrowid
            conn.executemany(
                "INSERT INTO chunks(file_id, start_line, end_line, symbol, kind, text, rel, terms) "
                f"VALUES ({file_id}, ?, ?, ?, ?, ?, ?, ?)",
                chunk_rows,
            )
            conn.executemany(
                "INSERT INTO symbols(file_id, name, qualname, tail, kind, start_line, end_line, signature) "
                f"VALUES ({file_id}, ?, ?, ?, ?, ?, ?, ?)",
                ((s.name, s.qualname, s.qualname.rsplit(".", 1)[-1], s.kind, s.start_line, s.end_line,
                  s.signature) for s in parsed.symbols),
            )
            conn.executemany(
                f"INSERT OR IGNORE INTO refs(file_id, name, line) VALUES ({file_id}, ?, ?)",
                ((r.name, r.line) for r in parsed.references),
            )

    def touch_file(self, path: Path | str, size: int, mtime: float) -> bool:
        """Record a new (size, mtime) for a file whose content did not change."""
        with self.transaction(), _sqlite_errors(f"update {path}"):
            cur = self._conn().execute("UPDATE files SET size = ?, mtime = ? WHERE path = ?",
                                       (size, mtime, str(path)))
            return cur.rowcount > 0

    def remove_file(self, path: Path | str) -> bool:
        """Drop a file and everything hanging off it; False if it was not indexed."""
        with self.transaction(), _sqlite_errors(f"remove {path}"):
            return self._conn().execute("DELETE FROM files WHERE path = ?", (str(path),)).rowcount > 0

    def remove_under(self, folder: Path | str) -> int:
        """Drop every file below `folder`; returns how many."""
        with self.transaction(), _sqlite_errors(f"remove files under {folder}"):
            return self._conn().execute("DELETE FROM files WHERE path >= ? AND path < ?",
                                        _under(folder)).rowcount

    def rename_file(self, old: Path | str, new_source: SourceFile) -> bool:
        """Move a file's rows to a new path (content unchanged); False if `old` was not indexed."""
        new = str(new_source.path)
        with self.transaction(), _sqlite_errors(f"rename {old}"):
            conn = self._conn()
            row = conn.execute("SELECT id FROM files WHERE path = ?", (str(old),)).fetchone()
            if row is None:
                return False
            if new != str(old):
                conn.execute("DELETE FROM files WHERE path = ?", (new,))
            conn.execute(
                "UPDATE files SET path = ?, root = ?, rel = ?, size = ?, mtime = ? WHERE id = ?",
                (new, str(new_source.root), new_source.rel, new_source.size, new_source.mtime, row[0]),
            )
            # The embedded text names the module: the vectors are recomputed for the new path.
            conn.execute("UPDATE chunks SET rel = ?, vec_key = NULL WHERE file_id = ?",
                         (new_source.rel, row[0]))
            return True

    # --- vectors (the semantic ranker) ---

    def chunks_without_vectors(self, limit: int, after_id: int = 0) -> list[tuple[int, str, str | None, str]]:
        """(chunk id, rel, symbol, text) of chunks not embedded yet, in id order from `after_id`."""
        return self._rows("SELECT id, rel, symbol, text FROM chunks WHERE vec_key IS NULL AND id > ? "
                          "ORDER BY id LIMIT ?", (after_id, limit))

    def existing_vector_keys(self, keys: Iterable[str]) -> set[str]:
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            marks = ",".join("?" * len(part))
            found.update(r[0] for r in self._rows(f"SELECT key FROM vectors WHERE key IN ({marks})", part))
        return found

    def set_chunk_vectors(self, assignments: Iterable[tuple[int, str]], new_vectors: dict[str, bytes]) -> int:
        """Store new vectors and point chunks at their keys, in one transaction; chunks deleted
        meanwhile are skipped. Returns how many chunks got a vector."""
        with self.transaction(), _sqlite_errors("store vectors"):
            conn = self._conn()
            conn.executemany("INSERT OR IGNORE INTO vectors(key, vec) VALUES (?, ?)", new_vectors.items())
            cur = conn.executemany("UPDATE chunks SET vec_key = ? WHERE id = ? AND vec_key IS NULL",
                                   ((key, chunk_id) for chunk_id, key in assignments))
            return cur.rowcount

    def vector_rows(self) -> Iterator[tuple[int, bytes]]:
        """(chunk id, vector blob) of every embedded chunk."""
        yield from self._iter_rows("SELECT c.id, v.vec FROM chunks c JOIN vectors v ON v.key = c.vec_key")

    def chunks_by_id(self, ids: Iterable[int]) -> dict[int, ChunkRow]:
        """The chunks with these ids (score 0), for hits found outside the FTS index."""
        ids = list(ids)
        out: dict[int, ChunkRow] = {}
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" * len(part))
            for row in self._rows(
                "SELECT c.id, f.path, c.rel, c.start_line, c.end_line, c.symbol, c.kind, c.text "
                f"FROM chunks c JOIN files f ON f.id = c.file_id WHERE c.id IN ({marks})", part):
                out[row[0]] = ChunkRow(*row[1:], score=0.0)
        return out

    def vector_counts(self) -> tuple[int, int]:
        """(chunks with a vector, all chunks)."""
        return tuple(self._rows("SELECT count(vec_key), count(*) FROM chunks")[0])

    def vector_model(self) -> str | None:
        row = self._rows("SELECT value FROM meta WHERE key = 'vector_model'")
        return row[0][0] if row else None

    def reset_vectors(self, model_id: str) -> None:
        """Forget every vector (they were made by another model or setting) and record `model_id`."""
        with self.transaction(), _sqlite_errors("reset vectors"):
            conn = self._conn()
            conn.execute("UPDATE chunks SET vec_key = NULL WHERE vec_key IS NOT NULL")
            conn.execute("DELETE FROM vectors")
            _set_meta(self._db(), "vector_model", model_id)

    def prune_vectors(self) -> int:
        """Drop vectors no chunk points at any more (their chunks changed or went away)."""
        with self.transaction(), _sqlite_errors("prune vectors"):
            return self._conn().execute(
                "DELETE FROM vectors WHERE key NOT IN (SELECT vec_key FROM chunks WHERE vec_key IS NOT NULL)"
            ).rowcount

    def optimize(self) -> None:
        """Merge the FTS index's segments (after a large pass) and refresh the planner's statistics."""
        with self.transaction(), _sqlite_errors("optimize"):
            self._conn().execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('optimize')")
        with _sqlite_errors("optimize"):
            self._conn().execute("PRAGMA optimize")

    # --- reads ---

    def _rows(self, sql: str, params: Iterable[object] = ()) -> list[tuple]:
        with _sqlite_errors("read"):
            return self._conn().execute(sql, tuple(params)).fetchall()

    def _iter_rows(self, sql: str) -> Iterator[tuple]:
        with _sqlite_errors("read"):
            cur = self._conn().execute(sql)
            while rows := cur.fetchmany(_FETCH):
                yield from rows

    def file_hashes(self) -> dict[str, tuple[str, float, int]]:
        """path -> (content_hash, mtime, size) of every indexed file."""
        rows = self._rows("SELECT path, content_hash, mtime, size FROM files")
        return {path: (digest, mtime, size) for path, digest, mtime, size in rows}

    def file(self, path: Path | str) -> FileRow | None:
        rows = self._rows("SELECT path, root, rel, language, content_hash, size, mtime FROM files "
                          "WHERE path = ?", (str(path),))
        return FileRow(*rows[0]) if rows else None

    def all_files(self) -> Iterator[FileRow]:
        for row in self._iter_rows("SELECT path, root, rel, language, content_hash, size, mtime FROM files "
                                   "ORDER BY path"):
            yield FileRow(*row)

    def files_under(self, folder: Path | str) -> list[FileRow]:
        rows = self._rows("SELECT path, root, rel, language, content_hash, size, mtime FROM files "
                          "WHERE path >= ? AND path < ? ORDER BY path", _under(folder))
        return [FileRow(*row) for row in rows]

    def fts_chunks(self, query: str, limit: int) -> list[ChunkRow]:
        """Chunks matching any word of a free-text query, best first. Never raises on odd input."""
        expr = fts_match_expression(query)
        if expr is None or limit <= 0:
            return []
        # Rank inside the full-text index first and join only the winners: joining every match
        # to its chunk text before sorting costs ~20 ms per query on the standard library.
        sql = (
            "SELECT f.path, c.rel, c.start_line, c.end_line, c.symbol, c.kind, c.text, m.r FROM "
            f"(SELECT rowid AS id, {_BM25} AS r FROM chunks_fts WHERE chunks_fts MATCH ? "
            "ORDER BY r LIMIT ?) AS m "
            "JOIN chunks c ON c.id = m.id JOIN files f ON f.id = c.file_id ORDER BY m.r"
        )
        try:
            rows = self._conn().execute(sql, (expr, limit)).fetchall()
        except sqlite3.Error as exc:
            if str(exc).startswith("fts5:"):
                # The expression is built from quoted words only; this is a last line of defence.
                log.debug("FTS query %r failed: %s", expr, exc)
                return []
            raise _translate(exc, "search") from exc
        return [ChunkRow(*row[:7], score=-row[7]) for row in rows]

    def symbols_named(self, names: list[str], limit: int) -> list[SymbolRow]:
        """Definitions named exactly (case-insensitively) as one of `names`; a dotted name matches the
        qualname or its end. Exact-case matches and classes/functions come first."""
        found: dict[tuple, tuple] = {}
        for order, name in enumerate(dict.fromkeys(n.strip() for n in names if n and n.strip())):
            for row in self._symbol_rows_named(name, limit):
                key = (row[0], row[3], row[5])
                exact = row[2] == name or row[3] == name
                found.setdefault(key, ((order, not exact, _KIND_RANK.get(row[4], 3), len(row[1]),
                                        row[1], row[5]), row))
        ranked = sorted(found.values(), key=lambda item: item[0])
        return [SymbolRow(*row) for _, row in ranked[:max(limit, 0)]]

    def _symbol_rows_named(self, name: str, limit: int) -> list[tuple]:
        select = ("SELECT f.path, f.rel, s.name, s.qualname, s.kind, s.start_line, s.end_line, s.signature "
                  "FROM symbols s JOIN files f ON f.id = s.file_id ")
        if "." in name.strip("."):
            escaped = _escape_like(name)
            return self._rows(select + "WHERE s.qualname = ? OR s.qualname LIKE ? ESCAPE '\\' LIMIT ?",
                              (name, "%." + escaped, limit * 4))
        return self._rows(select + "WHERE s.name = ? UNION "
                          + select + "WHERE s.tail = ? LIMIT ?", (name, name, limit * 4))

    def symbols_prefix(self, prefix: str, limit: int) -> list[SymbolRow]:
        """Definitions whose name starts with `prefix` (case-insensitive), shortest names first."""
        rows = self._rows(
            "SELECT f.path, f.rel, s.name, s.qualname, s.kind, s.start_line, s.end_line, s.signature "
            "FROM symbols s JOIN files f ON f.id = s.file_id WHERE s.name LIKE ? ESCAPE '\\' "
            "ORDER BY length(s.name), s.name, f.rel, s.start_line LIMIT ?",
            (_escape_like(prefix) + "%", max(limit, 0)),
        )
        return [SymbolRow(*row) for row in rows]

    def all_symbols(self) -> Iterator[SymbolRow]:
        for row in self._iter_rows(
            "SELECT f.path, f.rel, s.name, s.qualname, s.kind, s.start_line, s.end_line, s.signature "
            "FROM symbols s JOIN files f ON f.id = s.file_id ORDER BY s.file_id, s.start_line"
        ):
            yield SymbolRow(*row)

    def paths_referencing(self, name: str, limit: int) -> list[str]:
        """Paths of the files that use `name` (exactly: a call, an attribute, a type), by their path
        relative to the root."""
        rows = self._rows("SELECT f.path FROM files f WHERE f.id IN "
                          "(SELECT file_id FROM refs WHERE name = ?) ORDER BY f.rel, f.path LIMIT ?",
                          (name, max(limit, 0)))
        return [row[0] for row in rows]

    def all_references(self) -> Iterator[tuple[str, str, int]]:
        """(path, name, line) of every reference."""
        yield from self._iter_rows(
            "SELECT f.path, r.name, r.line FROM refs r JOIN files f ON f.id = r.file_id"
        )

    def generation(self) -> tuple:
        """A fingerprint of the files table that changes whenever a file is added, replaced or removed
        (so derived structures, like the repo map's graph, know when to rebuild)."""
        return tuple(self._rows(
            "SELECT count(*), coalesce(max(indexed_at), 0), coalesce(sum(id), 0) FROM files"
        )[0])

    def vector_generation(self) -> tuple:
        """Changes whenever files change or chunks get vectors (for the semantic ranker's matrix)."""
        return (*self.generation(), self.vector_counts()[0])

    def stats(self, references: bool = True) -> dict[str, int]:
        """Row counts; counting references (the largest table) can be left out when speed matters."""
        refs = "(SELECT count(*) FROM refs)" if references else "-1"
        counts = self._rows(
            "SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM chunks), "
            f"(SELECT count(*) FROM symbols), {refs}"
        )[0]
        names = ("files", "chunks", "symbols", "references")
        return {name: n for name, n in zip(names, counts, strict=True) if n >= 0}

    def integrity_problems(self) -> list[str]:
        """What `PRAGMA integrity_check` and the FTS index's own check report; empty when healthy."""
        problems = [r[0] for r in self._rows("PRAGMA integrity_check") if r[0] != "ok"]
        try:
            self._conn().execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES ('integrity-check', 1)")
        except sqlite3.Error as exc:
            problems.append(f"chunks_fts: {exc}")
        return problems


def _under(folder: Path | str) -> tuple[str, str]:
    """The range of paths strictly below `folder`, for an indexed range scan."""
    prefix = str(folder).rstrip(os.sep) + os.sep
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
