"""One team's rows in the collector, read like a local feedback store.

The collector (`feedback.collector`) keeps each uploaded row as it was sent (a row of a member's
local `episodes`, `events`, `outcomes`, `sessions` or `model_switches` table, redacted before it
was stored), and the reference documents shared completions were composed with. `TeamRecords` joins
one team's rows per episode as `feedback.store.FeedbackStore` does, each completion with the texts
of the reference documents it names, for the team trainer (`feedback.train.team_source`) and the
collector's report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator

from .store import REFERENCE_TABLE, EpisodeOutcomes, named_references

__all__ = ["EPISODE_TABLES", "TeamRecords"]

EPISODE_TABLES = ("episodes", "events", "outcomes")  # what an episode's record is joined from


class TeamRecords:
    """One team's uploaded rows, read like a local feedback store (`episodes_with_outcomes`,
    `rows`): what the trainer and the collector's report read."""

    def __init__(self, team: str, rows: Iterable[tuple[str, str]]):
        self.path = f"team {team}"  # what the report names as its source
        self._tables: dict[str, list[dict]] = defaultdict(list)
        self._documents: dict[str, str] = {}  # reference documents' texts by content hash
        for table, text in rows:
            try:
                row = json.loads(text)
            except json.JSONDecodeError:
                continue  # the collector stores what it validated as JSON; a damaged row is skipped
            if not isinstance(row, dict) or "id" not in row:
                continue
            if table == REFERENCE_TABLE:
                if isinstance(row.get("text"), str):
                    self._documents[str(row["id"])] = row["text"]
            else:
                self._tables[table].append(row)

    def rows(self, table: str, since: float | None = None, until: float | None = None) -> Iterator[dict]:
        column = "started_at" if table == "sessions" else "ts"
        chosen = [r for r in self._tables.get(table, ()) if _within(r.get(column) or 0.0, since, until)]
        yield from sorted(chosen, key=lambda r: r.get(column) or 0.0)

    def episodes_with_outcomes(self, since: float | None = None,
                               until: float | None = None) -> Iterator[EpisodeOutcomes]:
        children: dict[str, dict[str, list[dict]]] = {t: defaultdict(list) for t in EPISODE_TABLES[1:]}
        for table in EPISODE_TABLES[1:]:
            for row in self._tables.get(table, ()):
                if row.get("episode_id"):
                    children[table][row["episode_id"]].append(row)
        for episode in self.rows("episodes", since, until):
            events = sorted(children["events"][episode["id"]], key=lambda e: e.get("ts") or 0.0)
            outcomes = sorted(children["outcomes"][episode["id"]],
                              key=lambda o: (o.get("checkpoint_s") or 0.0, o.get("ts") or 0.0))
            named = {h: self._documents[h] for h in named_references(episode) if h in self._documents}
            yield EpisodeOutcomes(episode, events, outcomes, named)


def _within(ts: float, since: float | None, until: float | None) -> bool:
    return (since is None or ts >= since) and (until is None or ts < until)
