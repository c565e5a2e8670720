"""Where the trainer's state lives on disk, and its status file (read by the CLI and the server).

    <train dir>/status.json       what the trainer is doing now (atomic writes)
    <train dir>/run/checkpoint/   the run in progress (see trainer.py)
    <train dir>/adapters/         versions and the promoted pointer (see adapters.py)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TrainPaths", "read_status", "train_paths", "write_status"]

STATES = ("idle", "waiting", "loading", "training", "evaluating", "promoted", "rejected", "stopped", "error")


@dataclass(frozen=True)
class TrainPaths:
    root: Path

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def adapters(self) -> Path:
        return self.root / "adapters"


def train_paths(config) -> TrainPaths:
    """The paths for a SquidConfig (its `train.dir`, or <cache_dir>/train)."""
    root = Path(config.train.dir).expanduser() if config.train.dir else config.resolved_cache_dir() / "train"
    return TrainPaths(root)


def write_status(path: Path, state: str, **fields: Any) -> dict[str, Any]:
    """Replace the status file atomically with `state` and `fields`; returns what was written."""
    if state not in STATES:
        raise ValueError(f"unknown trainer state {state!r}")
    status = {"state": state, "pid": os.getpid(), "updated_at": time.time(), **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(status, indent=1))
    os.replace(tmp, path)
    return status


def read_status(path: Path) -> dict[str, Any]:
    """The last status written; a trainer that died mid-run reads as stopped."""
    try:
        status = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"state": "idle"}
    if not isinstance(status, dict):
        return {"state": "idle"}
    busy = status.get("state") in ("waiting", "loading", "training", "evaluating")
    if busy and not _alive(status.get("pid")):
        status = {**status, "state": "stopped", "message": "the trainer process is no longer running"}
    return status


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
