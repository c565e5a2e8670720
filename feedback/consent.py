"""The user's own choice about recording and sharing, kept beside the database.

A choice made with `squidcode.feedback.setRecord` / `setShare` (or the CLI) outlives restarts and
wins over configuration files: a team's config cannot turn sharing back on after the user turned it
off. Only `record` and `share` are kept; a missing or unreadable file means "no choice made".
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from context.config import FeedbackConfig

__all__ = ["Consent", "CONSENT_NAME"]

log = logging.getLogger(__name__)

CONSENT_NAME = "feedback-consent.json"


class Consent:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def beside(cls, db_path: Path) -> Consent:
        return cls(db_path.parent / CONSENT_NAME)

    def load(self) -> dict[str, bool]:
        try:
            values = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring the feedback consent file %s: %s", self.path, exc)
            return {}
        if not isinstance(values, dict):
            return {}
        return {k: v for k, v in values.items() if k in ("record", "share") and isinstance(v, bool)}

    def apply(self, config: FeedbackConfig) -> FeedbackConfig:
        return replace(config, **self.load())

    def save(self, **choice: bool) -> None:
        values = {**self.load(), **choice, "changed_at": time.time()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(values), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            # The choice still holds for this run; it just will not survive a restart.
            log.warning("cannot save the feedback consent to %s: %s", self.path, exc)
