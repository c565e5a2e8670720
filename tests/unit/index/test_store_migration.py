"""Schema migration of the index store: a database of schema version 1 (before chunk vectors) is
migrated in place on open, keeping every row, and an indexer finds nothing to re-parse.

Version-1 databases are made two ways: from the version-1 DDL kept verbatim in
`tests/data/index_schema_v1.sql` (rows written with version 1's own INSERT statements), and by
indexing a real tree with the current code and then taking the database back to version 1's
structure (checked column by column against the DDL), so the incremental check runs on real rows.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np

from context.index.embeddings import EMBEDDING_DIM, vector_to_blob
from context.index.indexer import Indexer
from context.index.store import SCHEMA_VERSION, IndexStore

V1_SQL = Path(__file__).resolve().parents[2] / "data" / "index_schema_v1.sql"


def _v1_database(path: Path) -> None:
    """A version-1 index holding two files, written with version 1's statements."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(V1_SQL.read_text(encoding="utf-8"))
    conn.execute("BEGIN")
    for file_id, (rel, name) in enumerate([("net/urls.py", "url_split"), ("web/server.py", "serve")], 1):
        text = f"def {name}(x):\n    return len(x)\n"
        conn.execute("INSERT INTO files(id, path, root, rel, language, content_hash, size, mtime, "
                     "indexed_at) VALUES (?, ?, '/ws', ?, 'python', ?, 30, 1000.0, 1.0)",
                     (file_id, f"/ws/{rel}", rel, f"h{file_id}"))
        conn.execute("INSERT INTO chunks(file_id, start_line, end_line, symbol, kind, text, rel, terms) "
                     "VALUES (?, 1, 2, ?, 'definition', ?, ?, ?)",
                     (file_id, name, text, rel, name.replace("_", "")))
        conn.execute("INSERT INTO symbols(file_id, name, qualname, tail, kind, start_line, end_line, "
                     "signature) VALUES (?, ?, ?, ?, 'function', 1, 2, ?)",
                     (file_id, name, name, name, f"def {name}(x):"))
        conn.execute("INSERT INTO refs(file_id, name, line) VALUES (?, 'len', 2)", (file_id,))
    conn.execute("COMMIT")
    conn.close()


def _columns(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'chunks_fts_%' ORDER BY name")]
    return {t: [tuple(c[1:]) for c in conn.execute(f"PRAGMA table_info({t})")] for t in tables}


def _version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    finally:
        conn.close()


def test_version_1_database_is_migrated_in_place_keeping_its_rows(tmp_path):
    path = tmp_path / "index.sqlite3"
    _v1_database(path)
    assert _version(path) == "1"
    with IndexStore(path) as store:
        assert store.migrated_from == 1
        assert store.recovered_from is None
        assert store.stats() == {"files": 2, "chunks": 2, "symbols": 2, "references": 2}
        assert [r.symbol for r in store.fts_chunks("url split", 5)] == ["url_split"]
        assert [s.name for s in store.symbols_named(["serve"], 5)] == ["serve"]
        assert store.integrity_problems() == []
        # Migrated chunks have no vector yet; the new table takes them.
        pending = store.chunks_without_vectors(10)
        assert [row[2] for row in pending] == ["url_split", "serve"]
        blob = vector_to_blob(np.ones(EMBEDDING_DIM, dtype=np.float32) / EMBEDDING_DIM ** 0.5)
        assert store.set_chunk_vectors([(pending[0][0], "k1")], {"k1": blob}) == 1
        assert store.vector_counts() == (1, 2)
    assert _version(path) == str(SCHEMA_VERSION) == "2"
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name or "moved" in p.name) == []
    # Opening again is a plain open: nothing left to migrate, the vector is still there.
    with IndexStore(path) as store:
        assert store.migrated_from is None
        assert store.vector_counts() == (1, 2)


def test_migrated_schema_matches_a_fresh_one(tmp_path):
    old, fresh = tmp_path / "old.sqlite3", tmp_path / "fresh.sqlite3"
    _v1_database(old)
    IndexStore(old).close()
    IndexStore(fresh).close()
    a, b = sqlite3.connect(old), sqlite3.connect(fresh)
    try:
        assert _columns(a) == _columns(b)
        indexes = "SELECT name FROM sqlite_master WHERE type IN ('index', 'trigger') ORDER BY name"
        assert [r[0] for r in a.execute(indexes)] == [r[0] for r in b.execute(indexes)]
    finally:
        a.close()
        b.close()


def _downgrade_to_v1(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP INDEX chunks_vec_key")
    conn.execute("ALTER TABLE chunks DROP COLUMN vec_key")
    conn.execute("DROP TABLE vectors")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()


def test_an_indexed_version_1_database_needs_no_rebuild(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(5):
        (root / f"mod{i}.py").write_text(f"def function_{i}(a):\n    return a + {i}\n", encoding="utf-8")
    path = tmp_path / "index.sqlite3"
    with IndexStore(path) as store:
        assert Indexer([root], store, workers=0).index_all().parsed == 5
    _downgrade_to_v1(path)
    # The downgraded file is structurally what version 1 created.
    reference = tmp_path / "reference.sqlite3"
    ref = sqlite3.connect(reference)
    ref.executescript(V1_SQL.read_text(encoding="utf-8"))
    got = sqlite3.connect(path)
    try:
        assert _columns(got) == _columns(ref)
    finally:
        got.close()
        ref.close()
    with IndexStore(path) as store:
        assert store.migrated_from == 1
        report = Indexer([root], store, workers=0).index_all()
        assert (report.parsed, report.removed, report.files) == (0, 0, 5)
        assert store.symbols_named(["function_3"], 1)[0].rel == "mod3.py"
        assert len(store.chunks_without_vectors(100)) == 5


def test_two_stores_opening_one_old_database_at_once_migrate_it_once(tmp_path):
    path = tmp_path / "index.sqlite3"
    _v1_database(path)
    results: list[object] = []

    def open_it() -> None:
        try:
            with IndexStore(path) as store:
                results.append((store.migrated_from, store.stats(references=False)["chunks"]))
        except Exception as exc:  # noqa: BLE001 - the assertion below shows what went wrong
            results.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results, key=str) == sorted([(1, 2), (None, 2)], key=str), results
    assert _version(path) == "2"


def test_unknown_older_version_is_still_rebuilt(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    _v1_database(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    conn.close()
    with IndexStore(path) as store:
        assert store.recovered_from is not None and store.migrated_from is None
        assert store.stats()["files"] == 0
    assert "schema version 0" in caplog.text
