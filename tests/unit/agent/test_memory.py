"""The note store's write and forget rules, on a real SQLite file."""

from __future__ import annotations

import sqlite3

import pytest

from agent.errors import MemoryStoreError
from agent.memory import MemoryStore
from agent.tools import default_registry


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def store(tmp_path, clock=None, workspace="/ws"):
    return MemoryStore(tmp_path / "memory.sqlite", workspace, now=clock or Clock())


def test_a_reverted_edit_becomes_a_note_and_a_kept_edit_contradicting_it_removes_it(tmp_path):
    mem = store(tmp_path)
    mem.observe_reverted_edit("calc.py", "return a - b", "return abs(a - b)", None)
    [note] = mem.notes()
    assert note.kind == "revert" and "reverted" in note.body and "return abs(a - b)" in note.body
    assert mem.observe_kept_edit("x = 1\nreturn abs(a - b)\n") == 1
    assert mem.notes() == []


def test_a_rewritten_edit_records_the_users_form(tmp_path):
    mem = store(tmp_path)
    mem.observe_reverted_edit("calc.py", "old", "agent_version()", "user_version()")
    assert "rewrote the agent's `agent_version()` as `user_version()`" in mem.notes()[0].body


def test_a_correction_is_noted_only_the_second_time(tmp_path):
    mem = store(tmp_path)
    assert mem.observe_correction("print(x)", "log.info(x)") is None
    assert mem.notes() == []
    assert mem.observe_correction("print(x)", "log.info(x)") is not None
    assert "Write `log.info(x)` instead of `print(x)` (corrected 2 times)" in mem.notes()[0].body
    assert mem.observe_correction("same", "same") is None


def test_conventions_from_config_files_and_rescan_supersedes(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n[tool.pytest.ini_options]\n")
    (root / ".editorconfig").write_text("[*]\nindent_style = space\nindent_size = 4\n")
    mem = store(tmp_path)
    mem.scan_conventions(root)
    bodies = sorted(n.body for n in mem.notes())
    assert bodies == [
        "Indent with space, 4 wide.",
        "Lines are at most 100 characters (ruff).",
        "Tests run with pytest.",
    ]
    (root / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    mem.scan_conventions(root)
    assert [n.body for n in mem.notes() if n.subject == "convention:line-length"] == [
        "Lines are at most 120 characters (ruff)."
    ]


def test_unused_notes_are_forgotten_and_recall_counts_as_use(tmp_path):
    clock = Clock()
    mem = store(tmp_path, clock)
    mem.remember("a", "alpha note", "agent")
    mem.remember("b", "beta note", "agent")
    clock.t += 50 * 86400
    assert [n.body for n in mem.recall("alpha")] == ["alpha note"]
    clock.t += 50 * 86400
    assert mem.forget_stale(90) == 1
    assert [n.subject for n in mem.notes()] == ["a"]


def test_forget_by_id_and_workspaces_are_separate(tmp_path):
    mem = store(tmp_path)
    other = store(tmp_path, workspace="/other")
    note = mem.remember("s", "body", "agent")
    other.remember("s", "other body", "agent")
    assert [n.body for n in other.notes()] == ["other body"]
    assert mem.forget(note) and not mem.forget(note)
    assert len(mem.notes(all_workspaces=True)) == 1


# The DDL the store ran before its tables were created through sqlite-utils, verbatim.
OLD_DDL = """
CREATE TABLE IF NOT EXISTS notes(
  id INTEGER PRIMARY KEY, workspace TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL,
  kind TEXT NOT NULL, avoid TEXT NOT NULL DEFAULT '', created REAL NOT NULL, last_used REAL NOT NULL,
  uses INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS notes_subject ON notes(workspace, subject);
CREATE TABLE IF NOT EXISTS corrections(
  workspace TEXT NOT NULL, key TEXT NOT NULL, count INTEGER NOT NULL, last_seen REAL NOT NULL,
  PRIMARY KEY(workspace, key));
"""


def _layout(path) -> dict:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        # (name, type, notnull, default, pk) of each column; (name, unique, origin) of each index.
        columns = {t: [tuple(c[1:]) for c in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
        indexes = {t: sorted(tuple(i[1:4]) for i in conn.execute(f"PRAGMA index_list({t})")) for t in tables}
        return {"columns": columns, "indexes": indexes}
    finally:
        conn.close()


def test_a_new_file_has_the_layout_of_the_earlier_ddl_and_an_old_file_opens(tmp_path):
    old = tmp_path / "old.sqlite"
    conn = sqlite3.connect(old)
    conn.executescript(OLD_DDL)
    conn.execute("INSERT INTO notes(workspace, subject, body, kind, created, last_used) "
                 "VALUES ('/ws', 'style', 'Use tabs', 'agent', 1.0, 1.0)")
    conn.commit()
    conn.close()
    MemoryStore(tmp_path / "new.sqlite", "/ws").close()
    assert _layout(tmp_path / "new.sqlite") == _layout(old)
    mem = MemoryStore(old, "/ws", now=Clock())
    [note] = mem.notes()
    assert (note.subject, note.body, note.uses) == ("style", "Use tabs", 0)
    # Writing a note on the same subject replaces it: a new row, its use count reset.
    mem.recall("tabs")
    newer = mem.remember("style", "Use spaces", "agent")
    assert [(n.id, n.body, n.uses) for n in mem.notes()] == [(newer, "Use spaces", 0)]
    assert newer != note.id


def test_a_database_error_is_a_memory_store_error(tmp_path):
    (tmp_path / "memory.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(MemoryStoreError, match="cannot open the agent memory"):
        store(tmp_path)
    mem = store(tmp_path / "fresh")
    mem.close()
    with pytest.raises(MemoryStoreError, match="failed"):
        mem.remember("s", "body", "agent")


def test_the_memory_tool_stores_and_recalls(ctx, tmp_path):
    ctx.memory = store(tmp_path)
    registry = default_registry()
    assert registry.call(ctx, "memory", {"action": "store", "subject": "style", "body": "Use f-strings"}).ok
    recalled = registry.call(ctx, "memory", {"action": "recall", "query": "strings"})
    assert "Use f-strings" in recalled.output
    assert not registry.call(ctx, "memory", {"action": "forget"}).ok
    assert not registry.call(ctx, "memory", {"action": "store"}).ok
    ctx.memory = None
    assert "turned off" in registry.call(ctx, "memory", {"action": "recall"}).output


def test_a_memory_file_deleted_while_open_takes_new_notes_in_a_new_file(tmp_path, caplog):
    mem = store(tmp_path)
    mem.remember("before", "written before the file went", "convention")
    (tmp_path / "memory.sqlite").unlink()
    with caplog.at_level("WARNING", logger="agent.memory"):
        mem.remember("after", "written after", "convention")
    assert "deleted or replaced" in caplog.text
    assert [n.subject for n in mem.notes()] == ["after"]
    mem.close()
    # On disk at the path, not in the unlinked file.
    assert [n.subject for n in store(tmp_path).notes()] == ["after"]
