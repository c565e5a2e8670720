"""The indexer on real files: full and incremental passes, per-path updates, moves, overlays, files
that vanish or cannot be read mid-update, a pass SIGKILLed half-way and resumed, and the running
interpreter's standard library as a real code base."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from context.index import indexer as indexer_module
from context.index.indexer import OVERLAY_MTIME, Indexer, default_index_path
from context.index.store import IndexStore

REPO = Path(__file__).resolve().parents[3]

FILES = {
    "pkg/__init__.py": "from .urls import url_split\n",
    "pkg/urls.py": textwrap.dedent('''\
        """Splitting and joining addresses."""


        def url_split(address):
            scheme, _, rest = address.partition("://")
            return scheme, rest


        class AddressBook:
            def lookup(self, name):
                return url_split(name)
        '''),
    "pkg/maths.py": "def add_numbers(a, b):\n    return a + b\n",
    "notes/readme.md": "# Notes\n\nThe address book keeps every contact.\n",
    "data/blob.bin": b"\x00\x01\x02binary\x00",
    "skipme/ignored.py": "def should_not_be_indexed():\n    pass\n",
    ".gitignore": "skipme/\n",
}


def write_tree(root: Path, files: dict) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


@pytest.fixture
def ws(tmp_path) -> Path:
    return write_tree(tmp_path / "ws", FILES)


@pytest.fixture
def store(tmp_path) -> IndexStore:
    with IndexStore(tmp_path / "db" / "index.sqlite3") as s:
        yield s


def rels(store: IndexStore) -> list[str]:
    return [f.rel for f in store.all_files()]


def symbol_names(store: IndexStore) -> set[str]:
    return {s.qualname for s in store.all_symbols()}


def bump_mtime(path: Path, seconds: float = 5.0) -> None:
    info = path.stat()
    os.utime(path, (info.st_atime, info.st_mtime + seconds))


# --- full and incremental passes --------------------------------------------------------------


def test_full_pass_indexes_what_the_walk_finds(ws, store):
    report = Indexer([ws], store).index_all()
    assert rels(store) == [".gitignore", "notes/readme.md", "pkg/__init__.py", "pkg/maths.py", "pkg/urls.py"]
    assert report.parsed == 5 and report.removed == 0 and report.files == 5
    assert report.skipped["binary"] == 1 and report.skipped["ignored"] >= 1
    assert {"url_split", "AddressBook", "AddressBook.lookup", "add_numbers"} <= symbol_names(store)
    assert report.symbols == store.stats()["symbols"] and report.chunks == store.stats()["chunks"]
    assert report.seconds > 0
    hit = store.symbols_named(["url_split"], 5)[0]
    assert (hit.rel, hit.start_line, hit.path) == ("pkg/urls.py", 4, str(ws / "pkg/urls.py"))
    assert store.fts_chunks("address book contact", 3)[0].rel == "notes/readme.md"
    assert store.integrity_problems() == []


def test_touch_without_change_parses_nothing(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    before = store.file_hashes()
    bump_mtime(ws / "pkg/urls.py")
    report = indexer.index_all()
    assert report.parsed == 0 and report.removed == 0
    after = store.file_hashes()
    # Same content hash; the new mtime is recorded so the next pass does not even read the file.
    assert after[str(ws / "pkg/urls.py")][0] == before[str(ws / "pkg/urls.py")][0]
    assert after[str(ws / "pkg/urls.py")][1] == (ws / "pkg/urls.py").stat().st_mtime
    assert indexer.index_all().parsed == 0


def test_content_change_parses_only_that_file(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    (ws / "pkg/maths.py").write_text("def multiply_numbers(a, b):\n    return a * b\n", encoding="utf-8")
    bump_mtime(ws / "pkg/maths.py")
    report = indexer.index_all()
    assert report.parsed == 1 and report.removed == 0
    assert "multiply_numbers" in symbol_names(store) and "add_numbers" not in symbol_names(store)
    hits = store.fts_chunks("add numbers", 5)
    assert [h.rel for h in hits] == ["pkg/maths.py"] and "multiply_numbers" in hits[0].text
    assert store.fts_chunks("addnumbers", 5) == []
    assert store.integrity_problems() == []


def test_deleted_and_renamed_files_on_the_next_pass(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    (ws / "pkg/maths.py").unlink()
    (ws / "pkg/urls.py").rename(ws / "pkg/addresses.py")
    report = indexer.index_all()
    assert report.removed == 2 and report.parsed == 1
    assert "pkg/addresses.py" in rels(store) and "pkg/urls.py" not in rels(store)
    assert "add_numbers" not in symbol_names(store)
    assert [s.rel for s in store.symbols_named(["url_split"], 5)] == ["pkg/addresses.py"]


def test_progress_and_should_stop_between_batches_then_resume(tmp_path, store):
    files = {f"m{i:03}.py": f"def func_{i}():\n    return {i}\n" for i in range(50)}
    root = write_tree(tmp_path / "many", files)
    calls: list[tuple[int, int]] = []
    indexer = Indexer([root], store, workers=0, batch_files=10)
    report = indexer.index_all(progress=lambda done, total: calls.append((done, total)),
                               should_stop=lambda: len(calls) >= 3)
    assert calls == [(0, 50), (10, 50), (20, 50)]
    assert report.parsed == 20 and store.stats()["files"] == 20
    calls.clear()
    report = indexer.index_all(progress=lambda done, total: calls.append((done, total)))
    assert report.parsed == 30 and calls[0] == (0, 30) and calls[-1] == (30, 30)
    assert store.stats()["files"] == 50


def test_updates_during_a_full_pass_win_over_its_older_reads(tmp_path, store):
    files = {f"m{i:03}.py": f"def func_{i}():\n    return {i}\n" for i in range(50)}
    root = write_tree(tmp_path / "many", files)
    indexer = Indexer([root], store, workers=0, batch_files=10)
    last = root / "m049.py"

    def edit_while_indexing(done: int, total: int) -> None:
        if done == 10:
            for version in ("first_version", "second_version"):
                last.write_text(f"def {version}():\n    pass\n", encoding="utf-8")
                indexer.update_paths([last])

    indexer.index_all(progress=edit_while_indexing)
    assert {"second_version"} == {s.name for s in store.all_symbols() if s.name.endswith("_version")}
    assert store.stats()["files"] == 50


def test_default_index_path_is_per_set_of_roots(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    path = default_index_path([a, b])
    assert path == default_index_path([b, a])
    assert path != default_index_path([a])
    assert path.name == "index.sqlite3" and path.parent.parent == tmp_path / "cache" / "squidcode" / "index"
    assert len(path.parent.name) == 16


# --- per-path updates -------------------------------------------------------------------------


def test_update_paths_adds_changes_and_drops(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    (ws / "pkg/new_module.py").write_text("def brand_new():\n    pass\n", encoding="utf-8")
    (ws / "pkg/maths.py").write_text("def subtract(a, b):\n    return a - b\n", encoding="utf-8")
    (ws / "notes/readme.md").unlink()
    report = indexer.update_paths([ws / "pkg/new_module.py", ws / "pkg/maths.py", ws / "notes/readme.md",
                                   ws / "pkg/urls.py", tmp_path_outside(ws)])
    assert report.parsed == 2 and report.removed == 1
    assert {"brand_new", "subtract"} <= symbol_names(store) and "add_numbers" not in symbol_names(store)
    assert "notes/readme.md" not in rels(store)
    assert report.files == store.stats()["files"]


def tmp_path_outside(ws: Path) -> Path:
    outside = ws.parent / "outside.py"
    outside.write_text("def outside():\n    pass\n", encoding="utf-8")
    return outside


def test_update_paths_drops_a_file_that_became_ignored(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    (ws / ".gitignore").write_text("skipme/\nmaths.py\n", encoding="utf-8")
    report = indexer.update_paths([ws / "pkg/maths.py"])
    assert report.removed == 1 and report.skipped["ignored"] == 1
    assert "pkg/maths.py" not in rels(store)


def test_update_paths_on_folders(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    write_tree(ws / "extra", {"one.py": "def one():\n    pass\n", "sub/two.py": "def two():\n    pass\n"})
    report = indexer.update_paths([ws / "extra"])
    assert report.parsed == 2 and {"one", "two"} <= symbol_names(store)
    shutil.rmtree(ws / "pkg")
    report = indexer.update_paths([ws / "pkg"])
    assert report.removed == 3
    assert rels(store) == [".gitignore", "extra/one.py", "extra/sub/two.py", "notes/readme.md"]


def test_move_path_keeps_rows_when_content_is_unchanged(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    (ws / "pkg/urls.py").rename(ws / "pkg/addresses.py")
    report = indexer.move_path(ws / "pkg/urls.py", ws / "pkg/addresses.py")
    assert report.parsed == 0
    assert [s.rel for s in store.symbols_named(["url_split"], 5)] == ["pkg/addresses.py"]
    # A move that changes the language re-parses.
    (ws / "pkg/maths.py").rename(ws / "pkg/maths.txt")
    report = indexer.move_path(ws / "pkg/maths.py", ws / "pkg/maths.txt")
    assert report.parsed == 1 and report.removed == 1
    assert "add_numbers" not in symbol_names(store) and "pkg/maths.txt" in rels(store)
    # A folder move renames every file under it.
    (ws / "pkg").rename(ws / "lib")
    report = indexer.move_path(ws / "pkg", ws / "lib")
    assert report.parsed == 0
    assert sorted(r for r in rels(store) if r.startswith(("lib/", "pkg/"))) == [
        "lib/__init__.py", "lib/addresses.py", "lib/maths.txt"]
    assert store.integrity_problems() == []


def test_vanished_while_read_is_handled_and_the_rest_indexed(ws, store, monkeypatch, caplog):
    indexer = Indexer([ws], store)
    indexer.index_all()
    real_classify = indexer_module.classify_file
    victim = ws / "pkg/urls.py"

    def classify_then_delete(root, path, *args, **kwargs):
        verdict = real_classify(root, path, *args, **kwargs)
        if Path(path) == victim:
            victim.unlink()  # gone between the walk's verdict and the indexer's read
        return verdict

    monkeypatch.setattr(indexer_module, "classify_file", classify_then_delete)
    (ws / "pkg/maths.py").write_text("def still_indexed():\n    pass\n", encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="context.index.indexer"):
        report = indexer.update_paths([victim, ws / "pkg/maths.py"])
    assert report.skipped["unreadable"] == 1 and report.removed == 1 and report.parsed == 1
    assert "pkg/urls.py" not in rels(store) and "still_indexed" in symbol_names(store)
    assert any("urls.py" in r.getMessage() and "FileNotFoundError" in r.getMessage() for r in caplog.records)


PERMISSION_CHILD = """
import json, sys
from pathlib import Path
from context.index.indexer import Indexer
from context.index.store import IndexStore
ws, db = Path(sys.argv[1]), Path(sys.argv[2])
with IndexStore(db) as store:
    indexer = Indexer([ws], store)
    update = indexer.update_paths([ws / "pkg/urls.py", ws / "pkg/maths.py"])
    full = indexer.index_all()
    print(json.dumps({"update": [update.parsed, update.removed, dict(update.skipped)],
                      "full": [full.parsed, full.removed, dict(full.skipped)],
                      "rels": [f.rel for f in store.all_files()]}))
"""


def test_permission_denied_is_handled_and_the_rest_indexed(ws, store, tmp_path):
    Indexer([ws], store).index_all()
    store.close()
    (ws / "pkg/maths.py").write_text("def changed_meanwhile():\n    pass\n", encoding="utf-8")
    secret = ws / "pkg/urls.py"
    secret.chmod(0)
    command = [sys.executable, "-c", PERMISSION_CHILD, str(ws), str(store.path)]
    if os.geteuid() == 0:
        # root reads anything; drop the capabilities that let it, so the denial is real.
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a permission denial real")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        secret.chmod(0o644)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    parsed, removed, skipped = result["update"]
    assert (parsed, removed, skipped) == (1, 1, {"unreadable": 1})
    assert result["full"][2].get("unreadable") == 1 and result["full"][0] == 0
    assert "pkg/urls.py" not in result["rels"] and "pkg/maths.py" in result["rels"]
    with IndexStore(store.path) as reopened:
        assert "changed_meanwhile" in symbol_names(reopened)


# --- overlays ---------------------------------------------------------------------------------


def test_overlay_takes_precedence_until_cleared(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    target = ws / "pkg/maths.py"
    report = indexer.set_overlay(target, "def unsaved_buffer_function():\n    pass\n")
    assert report.parsed == 1
    assert "unsaved_buffer_function" in symbol_names(store) and "add_numbers" not in symbol_names(store)
    assert store.file_hashes()[str(target)][1] == OVERLAY_MTIME
    # A full pass keeps the buffer's text, not the disk's.
    assert indexer.index_all().parsed == 0
    assert "unsaved_buffer_function" in symbol_names(store)
    report = indexer.clear_overlay(target)
    assert report.parsed == 1
    assert "add_numbers" in symbol_names(store) and "unsaved_buffer_function" not in symbol_names(store)
    assert store.file_hashes()[str(target)][1] == target.stat().st_mtime
    assert indexer.clear_overlay(target).parsed == 0


def test_overlay_of_a_file_not_saved_yet(ws, store):
    indexer = Indexer([ws], store)
    indexer.index_all()
    draft = ws / "pkg/draft.py"
    indexer.set_overlay(draft, "def draft_only():\n    pass\n")
    assert "pkg/draft.py" in rels(store) and "draft_only" in symbol_names(store)
    assert indexer.index_all().removed == 0 and "pkg/draft.py" in rels(store)
    indexer.clear_overlay(draft)
    assert "pkg/draft.py" not in rels(store)


# --- killed half-way --------------------------------------------------------------------------


KILL_CHILD = """
import sys
from pathlib import Path
from context.index.indexer import Indexer
from context.index.store import IndexStore

def main():
    store = IndexStore(Path(sys.argv[2]))
    indexer = Indexer([Path(sys.argv[1])], store, workers=int(sys.argv[3]), batch_files=40)
    indexer.index_all(progress=lambda done, total: print(done, total, flush=True))
    print("finished", flush=True)

if __name__ == "__main__":
    main()
"""


def generated_module(i: int) -> str:
    funcs = "\n\n".join(
        f"def handler_{i}_{j}(value_{j}):\n    total = value_{j} * {j}\n    return helper_{j}(total)\n"
        for j in range(25)
    )
    return f'"""Generated module {i}."""\n\nclass Thing{i}:\n    size = {i}\n\n\n{funcs}'


def snapshot(store: IndexStore) -> dict:
    """Everything stored, keyed by relative path, without ids or timestamps."""
    conn = store._conn()
    rows = {}
    for rel, digest, chunks, symbols, refs in conn.execute(
        "SELECT f.rel, f.content_hash, "
        "(SELECT group_concat(start_line || ':' || end_line || ':' || text, '|') FROM chunks "
        " WHERE file_id = f.id),"
        "(SELECT group_concat(qualname || ':' || start_line, '|') FROM symbols WHERE file_id = f.id),"
        "(SELECT count(*) FROM refs WHERE file_id = f.id) FROM files f"
    ):
        rows[rel] = (digest, chunks, symbols, refs)
    return rows


def children_of(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow to collect it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads process trees from /proc")
def test_killed_mid_index_leaves_a_consistent_index_and_resumes(tmp_path):
    root = write_tree(tmp_path / "big", {f"mod{i:04}.py": generated_module(i) for i in range(600)})
    with IndexStore(tmp_path / "clean.sqlite3") as clean_store:
        Indexer([root], clean_store, workers=0).index_all()
        clean = snapshot(clean_store)
    db = tmp_path / "killed.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(root), str(db), "2"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        done = 0
        while done < 120:
            line = child.stdout.readline()
            assert line and line != "finished\n", f"the child ended unkilled: {child.stderr.read()}"
            done = int(line.split()[0])
        workers = children_of(child.pid)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    # The parse workers notice their parent is gone and leave (no orphans left running).
    assert workers and wait_until(lambda: not any(map(is_running, workers)), 10), workers

    with IndexStore(db) as store:
        assert store.recovered_from is None
        assert store.integrity_problems() == []
        partial = snapshot(store)
        assert 120 <= len(partial) < 600
        # Every file that made it in is complete: exactly what a clean index holds for it.
        assert all(partial[rel] == clean[rel] for rel in partial)
        report = Indexer([root], store, workers=2).index_all()
        assert report.parsed == 600 - len(partial) and report.removed == 0
        assert snapshot(store) == clean
        assert store.integrity_problems() == []


def test_prune_removes_indexes_of_vanished_roots_only(tmp_path):
    import os

    from context.index.indexer import EMPTY_INDEX_MAX_AGE_S, prune_stale_indexes

    index_dir = tmp_path / "cache" / "index"
    live, gone = tmp_path / "live", tmp_path / "gone"
    for root in (live, gone):
        root.mkdir()
        (root / "m.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    dbs = {}
    for name, root in (("live", live), ("gone", gone), ("in_use", gone)):
        dbs[name] = index_dir / name / "index.sqlite3"
        with IndexStore(dbs[name]) as store:
            Indexer([root], store, workers=0).index_all()
    for name in ("empty_new", "empty_old"):
        dbs[name] = index_dir / name / "index.sqlite3"
        IndexStore(dbs[name]).close()
    old = time.time() - EMPTY_INDEX_MAX_AGE_S - 60
    for path in dbs["empty_old"].parent.iterdir():
        os.utime(path, (old, old))
    (index_dir / "not_an_index").mkdir()
    (index_dir / "damaged").mkdir()
    (index_dir / "damaged" / "index.sqlite3").write_bytes(b"garbage" * 100)
    import shutil

    shutil.rmtree(gone)
    removed = prune_stale_indexes(index_dir, keep=[dbs["in_use"].parent])
    assert sorted(p.name for p in removed) == ["empty_old", "gone"]
    assert sorted(p.name for p in index_dir.iterdir()) == ["damaged", "empty_new", "in_use", "live",
                                                           "not_an_index"]
    assert prune_stale_indexes(tmp_path / "no such folder") == []
