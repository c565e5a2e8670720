"""A SQLite database file that may be deleted or replaced under an open connection.

SQLite keeps writing into the file it opened: deleted, its rows vanish when the connection
closes; replaced (a restore, a `mv`), they go to the old copy. A store notes the file it opened
and, when the path names another file (or none), closes and opens the path again.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["OpenedFile", "file_identity"]

_JOURNALS = ("-wal", "-shm", "-journal")


def file_identity(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class OpenedFile:
    """The database file a connection opened, and the journal files beside it that are its own."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.identity = file_identity(self.path)
        self.journals: dict[str, tuple[int, int] | None] = {}
        self.note_journals()

    def note_journals(self) -> None:
        """Record the WAL and shared-memory files now beside the database (call after a write)."""
        self.journals = {suffix: file_identity(f"{self.path}{suffix}") for suffix in _JOURNALS}

    def replaced(self) -> bool:
        """True when the path no longer names the file that was opened."""
        return file_identity(self.path) != self.identity

    def drop_orphan_journals(self) -> None:
        """After the connection closed: remove the old file's journals still at the path.

        SQLite removes its WAL at the last close only while the database file is where it was; left
        there, a new database at the path would read the old file's write-ahead log as its own.
        """
        for suffix, identity in self.journals.items():
            journal = Path(f"{self.path}{suffix}")
            if identity is not None and file_identity(journal) == identity:
                journal.unlink(missing_ok=True)
