"""The SQLite index store: schema, round trips, FTS query safety and ranking, symbol lookups,
damaged database files moved aside and rebuilt, and readers running while a writer holds a
transaction. Every test uses a real database file; parsed files are built by hand."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from context.errors import IndexStoreError
from context.index.store import (
    SCHEMA_VERSION,
    ChunkRow,
    IndexStore,
    fts_match_expression,
    identifier_terms,
    query_terms,
)
from context.index.types import Chunk, ParsedFile, Reference, SourceFile, Symbol

ROOT = Path("/ws")


def source(rel: str, size: int = 100, mtime: float = 1000.0) -> SourceFile:
    return SourceFile(root=ROOT, path=ROOT / rel, rel=rel, size=size, mtime=mtime)


def definition(name: str, body: str, start: int = 1, kind: str = "function",
               qualname: str = "") -> ParsedFile:
    """A one-definition Python file."""
    text = f"def {name}(x):\n{body}\n"
    end = start + text.count("\n") - 1
    qual = qualname or name
    return ParsedFile(
        language="python",
        chunks=[Chunk(start, end, text, qual, "definition")],
        symbols=[Symbol(name, qual, kind, start, end, f"def {name}(x):")],
        references=[Reference("len", start + 1), Reference("len", start + 1), Reference("print", start + 1)],
    )


@pytest.fixture
def store(tmp_path) -> IndexStore:
    with IndexStore(tmp_path / "index.sqlite3") as s:
        yield s


def fill(store: IndexStore) -> None:
    store.replace_file(source("net/urls.py"), "h1", definition("url_split", "    return len(x)"))
    store.replace_file(source("net/other.py"), "h2", definition("urlsplit", "    return x.split('/')"))
    store.replace_file(source("web/server.py"), "h3",
                       definition("HTTPServerFactory", "    return HttpHandler(x)", kind="class"))
    store.replace_file(source("docs/notes.txt"), "h4", ParsedFile(None, [
        Chunk(1, 2, "naïve café notes about 日本語 text\nsecond line", None, "window")]))


# --- schema and round trip --------------------------------------------------------------------


def test_schema_pragmas_and_version(store, tmp_path):
    conn = sqlite3.connect(tmp_path / "index.sqlite3")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    assert {"meta", "files", "chunks", "chunks_fts", "symbols", "refs"} <= tables
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert version == str(SCHEMA_VERSION)
    own = store._conn()
    assert own.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert own.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    plan = " ".join(r[3] for r in own.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM symbols WHERE name LIKE 'ab%' ESCAPE '\\'"))
    assert "USING INDEX symbols_name" in plan
    assert store.recovered_from is None
    conn.close()


def test_round_trip_of_every_table(store):
    fill(store)
    assert store.stats() == {"files": 4, "chunks": 4, "symbols": 3, "references": 6}
    hashes = store.file_hashes()
    assert hashes[str(ROOT / "net/urls.py")] == ("h1", 1000.0, 100)
    row = store.file(ROOT / "net/urls.py")
    assert (row.rel, row.language, row.root) == ("net/urls.py", "python", str(ROOT))
    assert store.file(ROOT / "missing.py") is None
    symbols = list(store.all_symbols())
    assert sorted(s.name for s in symbols) == ["HTTPServerFactory", "url_split", "urlsplit"]
    urls = next(s for s in symbols if s.name == "url_split")
    assert (urls.path, urls.rel, urls.kind, urls.start_line, urls.end_line, urls.signature) == (
        str(ROOT / "net/urls.py"), "net/urls.py", "function", 1, 2, "def url_split(x):")
    refs = sorted(store.all_references())
    # Duplicates of one name on one line are stored once.
    assert (str(ROOT / "net/urls.py"), "len", 2) in refs and len(refs) == 6
    assert [f.rel for f in store.all_files()] == ["docs/notes.txt", "net/other.py", "net/urls.py",
                                                  "web/server.py"]
    assert store.integrity_problems() == []


def test_replace_leaves_no_stale_rows(store):
    fill(store)
    store.replace_file(source("net/urls.py", size=7, mtime=2.0), "h9", definition("join_parts", "    pass"))
    assert store.stats() == {"files": 4, "chunks": 4, "symbols": 3, "references": 6}
    assert store.symbols_named(["url_split"], 10) == []
    assert all(r.path != str(ROOT / "net/urls.py") or "join_parts" in r.text
               for r in store.fts_chunks("url split join parts", 10))
    assert store.file_hashes()[str(ROOT / "net/urls.py")] == ("h9", 2.0, 7)
    assert store.integrity_problems() == []


def test_remove_cascades_into_every_table_and_the_fts_index(store):
    fill(store)
    assert store.remove_file(ROOT / "net/urls.py") is True
    assert store.remove_file(ROOT / "net/urls.py") is False
    assert store.stats() == {"files": 3, "chunks": 3, "symbols": 2, "references": 4}
    assert [r.rel for r in store.fts_chunks("len", 10)] == []
    assert store.remove_under(ROOT / "net") == 1
    assert store.remove_under(ROOT / "ne") == 0  # a prefix of a folder name is not the folder
    assert [f.rel for f in store.all_files()] == ["docs/notes.txt", "web/server.py"]
    assert store.integrity_problems() == []


def test_rename_keeps_rows_and_searches_the_new_path(store):
    fill(store)
    assert store.rename_file(ROOT / "net/urls.py", source("lib/addresses.py", mtime=5.0)) is True
    assert store.rename_file(ROOT / "nope.py", source("x.py")) is False
    sym = store.symbols_named(["url_split"], 5)
    assert [(s.rel, s.path) for s in sym] == [("lib/addresses.py", str(ROOT / "lib/addresses.py"))]
    hits = store.fts_chunks("addresses", 5)
    assert [h.rel for h in hits] == ["lib/addresses.py"]
    assert store.file_hashes()[str(ROOT / "lib/addresses.py")] == ("h1", 5.0, 100)
    assert store.integrity_problems() == []


def test_transaction_rolls_back_every_file_on_error(store):
    fill(store)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction():
        store.remove_file(ROOT / "net/urls.py")
        store.replace_file(source("new.py"), "h", definition("fresh", "    pass"))
        raise Boom
    assert store.stats()["files"] == 4 and store.file(ROOT / "new.py") is None


def test_closed_store_raises_a_named_error(tmp_path):
    store = IndexStore(tmp_path / "i.db")
    store.close()
    with pytest.raises(IndexStoreError):
        store.stats()


# --- full-text search -------------------------------------------------------------------------


ODD_QUERIES = [
    "", "   ", "\n\t", '"', "'", '""', '"unbalanced', "a AND", "AND OR NOT", "NOT url", "*", "url*",
    "(", ")", "((url)", "NEAR(url split)", "^url", "url:split", "text:url", "-url", "+", "\\", "\x00",
    "{url split}", "url -- ; DROP TABLE files", "%_%", "🙂", "\u0301", "日本語", "a" * 5000,
    " ".join(["url"] * 500),
]


@pytest.mark.parametrize("query", ODD_QUERIES)
def test_fts_never_raises_on_odd_input(store, query):
    fill(store)
    hits = store.fts_chunks(query, 5)
    assert isinstance(hits, list) and len(hits) <= 5
    assert all(isinstance(h, ChunkRow) for h in hits)


def test_fts_query_expressions_are_quoted_terms():
    assert fts_match_expression("") is None and fts_match_expression("?!") is None
    assert fts_match_expression('url" OR x') == '"url" OR "x"'
    assert query_terms("parse HTTPServer") == ["parse", "httpserver", "http", "server", "parsehttpserver"]
    # Stop words go when something else is left; their joins are never added.
    assert query_terms("how do I split the url") == ["split", "url"]
    assert query_terms("the") == ["the"]


def test_identifier_terms_split_camel_case_and_join_snake_case():
    terms = identifier_terms("return HTTPServerFactory(url_split) + getXML2Doc")
    assert set(terms.split()) >= {"http", "server", "factory", "urlsplit", "get", "xml", "doc"}


def test_fts_finds_every_spelling_of_split_words(store):
    fill(store)
    assert {h.rel for h in store.fts_chunks("url split", 10)} >= {"net/urls.py", "net/other.py"}
    # "urlsplit" reaches url_split through the joined form stored with the chunk.
    assert {h.rel for h in store.fts_chunks("urlsplit", 10)} == {"net/urls.py", "net/other.py"}
    assert [h.rel for h in store.fts_chunks("server factory", 10)] == ["web/server.py"]
    assert [h.rel for h in store.fts_chunks("http handler", 10)] == ["web/server.py"]


def test_fts_unicode_and_diacritics(store):
    fill(store)
    assert [h.rel for h in store.fts_chunks("naive cafe", 5)] == ["docs/notes.txt"]
    assert [h.rel for h in store.fts_chunks("NAÏVE", 5)] == ["docs/notes.txt"]
    assert [h.rel for h in store.fts_chunks("日本語", 5)] == ["docs/notes.txt"]


def test_fts_scores_are_higher_for_better_matches(store):
    fill(store)
    store.replace_file(source("misc/mention.py"), "h5", ParsedFile("python", [Chunk(
        1, 3, "# many words here that mention a server once\nx = 1\ny = 2\n", None, "merged")]))
    hits = store.fts_chunks("server", 10)
    assert [h.rel for h in hits] == ["web/server.py", "misc/mention.py"]
    assert hits[0].score > hits[1].score > 0
    assert (hits[0].start_line, hits[0].end_line, hits[0].symbol, hits[0].kind) == (1, 2, "HTTPServerFactory",
                                                                                    "definition")
    assert store.fts_chunks("server", 1) == hits[:1]
    assert store.fts_chunks("server", 0) == []


# --- symbols ----------------------------------------------------------------------------------


def test_symbols_named_case_insensitive_qualname_tail_and_dotted(store):
    fill(store)
    store.replace_file(source("pkg/a.py"), "h6", definition("geturl", "    pass", kind="method",
                                                            qualname="SplitResult.geturl"))
    store.replace_file(source("pkg/b.py"), "h7", definition("URL_SPLIT", "    pass", kind="variable"))
    found = store.symbols_named(["url_split"], 10)
    # Exact case first, then by kind.
    assert [(s.rel, s.name) for s in found] == [("net/urls.py", "url_split"), ("pkg/b.py", "URL_SPLIT")]
    assert [s.qualname for s in store.symbols_named(["GETURL"], 10)] == ["SplitResult.geturl"]
    assert [s.qualname for s in store.symbols_named(["splitresult.geturl"], 10)] == ["SplitResult.geturl"]
    assert [s.rel for s in store.symbols_named(["nothing", "", "  ", "urlsplit"], 10)] == ["net/other.py"]
    assert len(store.symbols_named(["url_split", "urlsplit", "geturl"], 2)) == 2
    assert store.symbols_named(["%"], 10) == []


def test_symbols_prefix_is_case_insensitive_and_literal(store):
    fill(store)
    assert [s.name for s in store.symbols_prefix("URL", 10)] == ["urlsplit", "url_split"]
    assert [s.name for s in store.symbols_prefix("url_", 10)] == ["url_split"]
    assert store.symbols_prefix("%", 10) == [] and store.symbols_prefix("u_l", 10) == []
    assert len(store.symbols_prefix("", 2)) == 2


# --- damaged files ----------------------------------------------------------------------------


def _filled_db(path: Path, files: int = 60) -> None:
    with IndexStore(path) as store, store.transaction():
        for i in range(files):
            store.replace_file(source(f"m{i}.py"), f"h{i}", definition(f"func_{i}", "    return 1\n" * 40))


def _assert_rebuilt(path: Path, original: bytes, caplog, reason: str) -> None:
    with caplog.at_level(logging.WARNING, logger="context.index.store"), IndexStore(path) as store:
        moved = store.recovered_from
        assert moved is not None and moved.name.startswith(path.name + ".corrupt-")
        assert moved.read_bytes() == original
        assert store.stats() == {"files": 0, "chunks": 0, "symbols": 0, "references": 0}
        store.replace_file(source("a.py"), "h", definition("works", "    pass"))
        assert [s.name for s in store.symbols_named(["works"], 1)] == ["works"]
    assert any(reason in r.getMessage() and str(moved) in r.getMessage() for r in caplog.records)
    with IndexStore(path) as again:  # the fresh database is healthy on the next open
        assert again.recovered_from is None and again.stats()["files"] == 1


def test_garbage_file_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"this is not a database, just some garbage bytes\x00\xff" * 100)
    _assert_rebuilt(path, path.read_bytes(), caplog, "not a database")


def test_truncated_file_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    _filled_db(path)
    data = path.read_bytes()
    assert len(data) > 100_000
    path.write_bytes(data[: len(data) // 2])
    _assert_rebuilt(path, path.read_bytes(), caplog, "unusable")


def test_tiny_truncated_header_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    _filled_db(path, files=2)
    path.write_bytes(path.read_bytes()[:50])
    _assert_rebuilt(path, path.read_bytes(), caplog, "unusable")


def test_damaged_page_fails_quick_check_and_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    _filled_db(path)
    data = bytearray(path.read_bytes())
    page = 4096
    # Scribble over the middle of the file, sparing the header and the schema page.
    middle = (len(data) // page // 2) * page
    data[middle:middle + 3 * page] = bytes([0xA5]) * (3 * page)
    path.write_bytes(bytes(data))
    _assert_rebuilt(path, bytes(data), caplog, "unusable")


def test_wrong_schema_version_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    _filled_db(path, files=3)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.close()
    _assert_rebuilt(path, path.read_bytes(), caplog, "schema version 999")


def test_foreign_database_is_moved_aside(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes(x)")
    conn.close()
    _assert_rebuilt(path, path.read_bytes(), caplog, "not a squidcode index")


def test_wal_and_shm_move_with_the_database(tmp_path):
    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"garbage" * 1000)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").write_bytes(b"stale " + suffix.encode())
    with IndexStore(path) as store:
        moved = store.recovered_from
    assert Path(f"{moved}-wal").read_bytes() == b"stale -wal"
    assert Path(f"{moved}-shm").exists()  # shared-memory scratch: SQLite may rewrite it
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").read_bytes() != b"stale -wal"


def test_empty_file_is_a_fresh_index(tmp_path):
    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"")
    with IndexStore(path) as store:
        assert store.recovered_from is None and store.stats()["files"] == 0


# --- threads ----------------------------------------------------------------------------------


def test_readers_proceed_while_a_writer_holds_a_transaction(store):
    fill(store)
    in_transaction, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def writer() -> None:
        with store.transaction():
            store.replace_file(source("late.py"), "h", definition("late_arrival", "    pass"))
            in_transaction.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    assert in_transaction.wait(10)
    started = time.monotonic()
    seen["during"] = [s.name for s in store.symbols_named(["late_arrival"], 5)]
    seen["hits"] = [h.rel for h in store.fts_chunks("url split", 5)]
    seen["elapsed"] = time.monotonic() - started
    release.set()
    thread.join(10)
    assert seen["during"] == [] and "net/urls.py" in seen["hits"]
    assert seen["elapsed"] < 1.0
    assert [s.name for s in store.symbols_named(["late_arrival"], 5)] == ["late_arrival"]


def test_two_writer_threads_serialise(store):
    errors: list[BaseException] = []

    def write(prefix: str) -> None:
        try:
            for i in range(30):
                store.replace_file(source(f"{prefix}{i}.py"), "h", definition(f"{prefix}_{i}", "    pass"))
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and store.stats()["files"] == 60
    assert store.integrity_problems() == []


def test_a_folder_in_the_way_raises_and_is_left_alone(tmp_path):
    path = tmp_path / "index.sqlite3"
    path.mkdir()
    with pytest.raises(IndexStoreError):
        IndexStore(path)
    assert path.is_dir() and list(tmp_path.iterdir()) == [path]
