"""A team's pooled feedback as a training source: `squidcode train --source TARGET --team NAME`.

The collector (`feedback.collector`) keeps each row a member's server uploaded as it was sent (a
row of the local store's `episodes`, `events` or `outcomes` table, redacted before it was stored
and sent only with sharing on), with the team of the token that sent it, in SQLite or PostgreSQL.
This reads one team's rows back, joins them per episode as the local store does
(`feedback.store.EpisodeOutcomes`), and gives the trainer the same example fields as local
training (`store_source.episode_as_example_fields`): the same dataset, rewards, GRPO and gate.

The reference documents (Squid) a shared completion was composed with are uploaded with it (the
collector's `reference_documents`, per team and content hash, redacted as the member stored them),
so a team's completion episodes train on the references they were served with, as local ones do.
A collector store older than that has none: its episodes train on their prompt windows alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from context.errors import FeedbackStoreError
from feedback.store import REFERENCE_TABLE
from feedback.team_records import EPISODE_TABLES, TeamRecords

from .store_source import episode_as_example_fields

__all__ = ["CollectorSource"]

class CollectorSource:
    """One team's episodes in a collector store: `postgresql://...`, or `sqlite:PATH`."""

    def __init__(self, target: str, team: str):
        if not team:
            raise FeedbackStoreError("training from a collector needs the team whose data it is (--team)")
        if not target.startswith(("postgresql://", "postgres://", "sqlite:")):
            raise FeedbackStoreError(f"a collector store is postgresql://... or sqlite:PATH, not {target!r}")
        self.target = target
        self.team = team

    def __repr__(self) -> str:  # never the password of a PostgreSQL URL
        return f"CollectorSource({self.target.split('@')[-1]!r}, team={self.team!r})"

    def episodes_with_outcomes(self, since: float | None, until: float | None) -> Iterator[dict[str, Any]]:
        for record in TeamRecords(self.team, self._rows()).episodes_with_outcomes(since, until):
            fields = episode_as_example_fields(record)
            if fields is not None:
                yield fields

    def _rows(self) -> list[tuple[str, str]]:
        """The team's episode rows, then its reference documents as (`reference_documents`, row)."""
        query = "SELECT tbl, row FROM received WHERE team = {0} AND tbl IN ({0}, {0}, {0})"
        documents = f"SELECT '{REFERENCE_TABLE}', row FROM {REFERENCE_TABLE} WHERE team = {{0}}"
        if self.target.startswith(("postgresql://", "postgres://")):
            return self._postgres(query.format("%s"), documents.format("%s"))
        return self._sqlite(query.format("?"), documents.format("?"))

    def _sqlite(self, query: str, documents: str) -> list[tuple[str, str]]:
        path = Path(self.target.removeprefix("sqlite:")).expanduser()
        if not path.is_file():
            raise FeedbackStoreError(f"no collector database at {path}")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                rows = conn.execute(query, [self.team, *EPISODE_TABLES]).fetchall()
                if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                [REFERENCE_TABLE]).fetchone():
                    rows += conn.execute(documents, [self.team]).fetchall()
                return rows
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise FeedbackStoreError(f"cannot read the collector database {path}: {exc}") from exc

    def _postgres(self, query: str, documents: str) -> list[tuple[str, str]]:
        try:
            import psycopg
        except ImportError as exc:
            raise FeedbackStoreError("a PostgreSQL collector store needs `pip install psycopg[binary]`"
                                     ) from exc
        try:
            with psycopg.connect(self.target) as conn:
                rows = conn.execute(query, [self.team, *EPISODE_TABLES]).fetchall()
                if conn.execute("SELECT to_regclass(%s)", [REFERENCE_TABLE]).fetchone()[0] is not None:
                    rows += conn.execute(documents, [self.team]).fetchall()
                return rows
        except psycopg.Error as exc:
            where = self.target.split("@")[-1]
            raise FeedbackStoreError(f"cannot read the PostgreSQL collector store {where}: {exc}") from exc
