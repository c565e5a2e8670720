"""Keep/revert signals recorded on the user's machine, shared only on opt-in, for rewards and training.

What other parts call:

- the server and the agent: `FeedbackRecorder` (`record_completion_episode`, `record_agent_episode`,
  `accept_completion`, `track_applied_edit`, `on_did_change`, `tick`), one per server, at
  `SquidServer.feedback`;
- the trainer: `episodes_with_outcomes(db_path=None, since=None, until=None)`, the episodes with
  their prompt (as recorded, redacted), output, candidates, events and the outcome of each tracked
  region at each checkpoint (status, kept text, distance).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .recorder import FeedbackRecorder
from .store import EpisodeOutcomes, FeedbackStore, default_db_path
from .tracking import STATUSES, TextChange, classify

__all__ = [
    "FeedbackRecorder",
    "FeedbackStore",
    "EpisodeOutcomes",
    "TextChange",
    "STATUSES",
    "classify",
    "default_db_path",
    "episodes_with_outcomes",
]


def episodes_with_outcomes(
    db_path: Path | str | None = None, since: float | None = None, until: float | None = None
) -> Iterator[EpisodeOutcomes]:
    """Episodes recorded in [since, until) (unix seconds), oldest first, from the store at `db_path`
    (default: the user's feedback store)."""
    store = FeedbackStore(db_path or default_db_path(), readonly=True)
    try:
        yield from store.episodes_with_outcomes(since, until)
    finally:
        store.close()
