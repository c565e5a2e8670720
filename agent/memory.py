"""The agent's memory: a SQLite note store with explicit rules for what to write and what to forget.

Notes are short sentences about one workspace, each on a `subject`. They are written only by rules:

- a user reverted or rewrote an agent edit (`observe_reverted_edit`): "do not propose X again",
  or "the user prefers Y over X";
- the same correction (text the user replaced by other text) seen twice (`observe_correction`);
- project conventions found in config files (`scan_conventions`: ruff/flake8 line length and rule
  selection, .editorconfig indentation, the test runner);
- the model itself, through the `memory` tool's `store` (kind "agent").

And forgotten only by rules:

- unused for `stale_days` (`forget_stale`; recalling a note counts as a use);
- superseded by a newer note on the same subject (writing one replaces the older);
- contradicted by a kept edit (`observe_kept_edit`: a note that says to avoid a text the user has
  since kept in an edit goes);
- explicitly, by `squidcode memory forget ID`.
"""

from __future__ import annotations

import configparser
import hashlib
import logging
import re
import sqlite3
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlite_utils

from context.sqlite_file import OpenedFile

from .errors import MemoryStoreError

log = logging.getLogger(__name__)

__all__ = ["Note", "MemoryStore", "default_memory_path"]

CORRECTION_THRESHOLD = 2
_SNIPPET = 120


@dataclass(frozen=True)
class Note:
    id: int
    workspace: str
    subject: str
    body: str
    kind: str  # convention | revert | correction | agent
    created: float
    last_used: float
    uses: int


def default_memory_path(cache_dir: Path) -> Path:
    return cache_dir / "agent" / "memory.sqlite"


def _create_tables(db: sqlite_utils.Database) -> None:
    """The notes and corrections tables and the one-note-per-subject index; a file that has them
    already (from this code or from the SQL DDL before it: the same columns) is left as it is."""
    db["notes"].create(
        {"id": int, "workspace": str, "subject": str, "body": str, "kind": str, "avoid": str,
         "created": float, "last_used": float, "uses": int},
        pk="id",
        not_null={"workspace", "subject", "body", "kind", "avoid", "created", "last_used", "uses"},
        defaults={"avoid": "", "uses": 0},
        if_not_exists=True,
    )
    db["notes"].create_index(["workspace", "subject"], index_name="notes_subject", unique=True,
                             if_not_exists=True)
    db["corrections"].create(
        {"workspace": str, "key": str, "count": int, "last_seen": float},
        pk=("workspace", "key"),
        not_null={"workspace", "key", "count", "last_seen"},
        if_not_exists=True,
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "..."


class MemoryStore:
    """Notes for one workspace in a SQLite file shared by all workspaces."""

    def __init__(self, db_path: Path, workspace: str, now: Callable[[], float] = time.time):
        self.path = Path(db_path)
        self.workspace = workspace
        self.now = now
        self._lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=10
            )
            # No sqlite-utils plugins: nothing installed elsewhere gets to change this connection.
            self._db = sqlite_utils.Database(self._conn, execute_plugins=False)
            _create_tables(self._db)
        except (OSError, sqlite3.Error) as exc:
            raise MemoryStoreError(f"cannot open the agent memory {self.path}: {exc}") from exc
        self._file = OpenedFile(self.path)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _locked(self) -> Iterator[sqlite_utils.Database]:
        """The database, for one operation under the lock; sqlite3 errors become MemoryStoreError.

        A file deleted or replaced since it was opened is let go of first: SQLite would go on writing
        into the unlinked file, and every note written after would be lost.
        """
        try:
            with self._lock:
                if self._file.replaced():
                    log.warning("agent memory %s was deleted or replaced while squidcode ran; new notes "
                                "go to a new file there", self.path)
                    self._conn.close()
                    self._file.drop_orphan_journals()
                    self._open()
                yield self._db
        except sqlite3.Error as exc:
            raise MemoryStoreError(f"the agent memory {self.path} failed: {exc}") from exc

    def _run(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._locked() as db:
            return db.execute(sql, params).fetchall()

    # -- notes -------------------------------------------------------------------------------

    def remember(self, subject: str, body: str, kind: str, avoid: str = "") -> int:
        """Write a note; an older note on the same subject is superseded (replaced)."""
        now = self.now()
        note = {"workspace": self.workspace, "subject": subject, "body": body, "kind": kind,
                "avoid": avoid, "created": now, "last_used": now}
        # INSERT OR REPLACE: the unique (workspace, subject) index makes the older note go, uses and all.
        with self._locked() as db:
            return db["notes"].insert(note, replace=True).last_pk

    def notes(self, all_workspaces: bool = False) -> list[Note]:
        where, params = ("", ()) if all_workspaces else ("WHERE workspace = ?", (self.workspace,))
        rows = self._run(
            "SELECT id, workspace, subject, body, kind, created, last_used, uses FROM notes "
            f"{where} ORDER BY id",
            params,
        )
        return [Note(*row) for row in rows]

    def recall(self, query: str = "", limit: int = 8) -> list[Note]:
        """Notes whose subject or body shares a word with `query` (all, newest first, when empty)."""
        words = [w.lower() for w in re.findall(r"\w{3,}", query)][:12]
        notes = self.notes()
        if words:
            notes = [n for n in notes if any(w in f"{n.subject} {n.body}".lower() for w in words)]
        notes = sorted(notes, key=lambda n: -n.created)[:limit]
        now = self.now()
        for note in notes:
            self._run("UPDATE notes SET last_used = ?, uses = uses + 1 WHERE id = ?", (now, note.id))
        return notes

    def forget(self, note_id: int) -> bool:
        before = len(self._run("SELECT id FROM notes WHERE id = ?", (note_id,)))
        self._run("DELETE FROM notes WHERE id = ?", (note_id,))
        return before == 1

    def forget_stale(self, days: float) -> int:
        cutoff = self.now() - days * 86400
        stale = self._run(
            "SELECT id FROM notes WHERE workspace = ? AND last_used < ?", (self.workspace, cutoff)
        )
        self._run("DELETE FROM notes WHERE workspace = ? AND last_used < ?", (self.workspace, cutoff))
        return len(stale)

    # -- write rules ---------------------------------------------------------------------------

    def observe_reverted_edit(self, rel: str, removed: str, agent_text: str, user_text: str | None) -> int:
        """The user reverted (`user_text` None or equal to `removed`) or rewrote an agent edit."""
        if user_text is None or user_text.strip() == removed.strip():
            body = (
                f"In {rel} the user reverted an agent edit that replaced `{_short(removed)}` with "
                f"`{_short(agent_text)}`; do not propose it again."
            )
        else:
            body = (
                f"In {rel} the user rewrote the agent's `{_short(agent_text)}` as `{_short(user_text)}`; "
                "prefer the user's form."
            )
        subject = f"edit:{rel}:{hashlib.sha1(agent_text.strip().encode()).hexdigest()[:10]}"
        return self.remember(subject, body, "revert", avoid=agent_text.strip())

    def observe_correction(self, before: str, after: str) -> int | None:
        """Count a correction (text replaced by other text); the second sighting becomes a note."""
        before, after = before.strip(), after.strip()
        if not before or before == after:
            return None
        key = hashlib.sha1(f"{before}\0{after}".encode()).hexdigest()
        # Plain SQL: an upsert that adds to the stored count, which sqlite-utils' upsert (it sets
        # values) cannot say in one statement.
        self._run(
            "INSERT INTO corrections(workspace, key, count, last_seen) VALUES (?, ?, 1, ?) "
            "ON CONFLICT(workspace, key) DO UPDATE SET count = count + 1, last_seen = excluded.last_seen",
            (self.workspace, key, self.now()),
        )
        count = self._run(
            "SELECT count FROM corrections WHERE workspace = ? AND key = ?", (self.workspace, key)
        )[0][0]
        if count < CORRECTION_THRESHOLD:
            return None
        return self.remember(
            f"correction:{_short(before)}",
            f"Write `{_short(after)}` instead of `{_short(before)}` (corrected {count} times).",
            "correction",
            avoid=before,
        )

    def observe_kept_edit(self, added_text: str) -> int:
        """An edit the user kept: notes telling to avoid text it contains are contradicted; forget them."""
        gone = 0
        for note_id, avoid in self._run(
            "SELECT id, avoid FROM notes WHERE workspace = ? AND avoid != ''", (self.workspace,)
        ):
            if avoid in added_text:
                gone += self.forget(note_id)
        return gone

    def scan_conventions(self, root: Path) -> list[int]:
        """Notes for the conventions the project's config files state (re-scans supersede)."""
        found = _conventions(root)
        return [self.remember(f"convention:{key}", body, "convention") for key, body in found.items()]


def _conventions(root: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}
        ruff = data.get("tool", {}).get("ruff", {})
        if "line-length" in ruff:
            found["line-length"] = f"Lines are at most {ruff['line-length']} characters (ruff)."
        select = ruff.get("lint", {}).get("select") or ruff.get("select")
        if select:
            found["lint-rules"] = f"ruff checks the rule groups {', '.join(map(str, select))}."
        if "pytest" in data.get("tool", {}) or (root / "pytest.ini").is_file():
            found["tests"] = "Tests run with pytest."
    setup_cfg = root / "setup.cfg"
    if setup_cfg.is_file():
        parser = configparser.ConfigParser()
        try:
            parser.read(setup_cfg, encoding="utf-8")
            if parser.has_option("flake8", "max-line-length"):
                found["line-length"] = (
                    f"Lines are at most {parser.get('flake8', 'max-line-length')} characters (flake8)."
                )
        except (configparser.Error, UnicodeDecodeError):
            pass
    editorconfig = root / ".editorconfig"
    if editorconfig.is_file():
        try:
            text = editorconfig.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        style = re.search(r"^\s*indent_style\s*=\s*(\w+)", text, re.M)
        size = re.search(r"^\s*indent_size\s*=\s*(\d+)", text, re.M)
        if style:
            found["indent"] = f"Indent with {style.group(1)}" + (f", {size.group(1)} wide." if size else ".")
    return found
