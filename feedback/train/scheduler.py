"""The background scheduler: train in a low-priority process of its own while the machine is idle.

`run_scheduler` lowers its own priority (os.nice), waits until the load average per core is below
`train.idle_load`, and runs training rounds; between steps it checks again, so a busy machine (or a
SIGTERM / SIGINT) stops the round at the next step boundary with its checkpoint saved, and the next
round resumes it. A new round starts only when what it would train on changed since the last
finished one (`service.training_inputs`: new or changed episodes, and with
`train.repository_tasks` the workspace's files); with nothing new, and `train.reader_sets`, it
distils the workspace's Squid reader when one is due (`reader_round`); otherwise an idle machine
stays idle.
`spawn_background` starts it detached from the editor (`squidcode train` in a new session); the
server and `squidcode train status` follow it through the status file.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from context.config import SquidConfig
from context.errors import SquidcodeError

from .status import TrainPaths, read_status, train_paths, write_status

__all__ = ["IdleDetector", "install_stop_signals", "run_scheduler", "spawn_background"]

log = logging.getLogger(__name__)


class IdleDetector:
    """The machine counts as idle while the 1-minute load average per core is below a threshold.

    The trainer's own work raises the load by about one core-share, which is discounted while it
    trains so that it does not stop itself.
    """

    def __init__(self, threshold: float, loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
                 cores: int | None = None):
        self.threshold = threshold
        self.loadavg = loadavg
        self.cores = cores or os.cpu_count() or 1

    def is_idle(self, training: bool = False) -> bool:
        load = self.loadavg()[0] - (1.0 if training else 0.0)
        return load / self.cores < self.threshold


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`: the round ends at the next step boundary, checkpointed."""
    def handler(signum, frame) -> None:
        log.info("signal %d: stopping after the current step", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_scheduler(
    config: SquidConfig, *, stop: threading.Event, rounds: int | None = None, poll_s: float = 30.0,
    idle: IdleDetector | None = None, steps: int | None = None, round_fn=None, inputs_fn=None,
    reader_fn=None,
) -> int:
    """Run training rounds while idle until `stop` is set (or `rounds` rounds ran); returns rounds run.

    `inputs_fn(config)` digests what a round would train on (default `service.training_inputs` of
    the current directory); a round that finished (promoted or rejected) records it, and no new
    round starts until it changes. A stopped round's checkpoint is always resumed. With nothing new
    to train on, `reader_fn(config, paths=, should_stop=)` (default `reader_round.run_reader_round`:
    the workspace's Squid reader, with `train.reader_sets`) may distil; a distillation counts as a
    round, and None from it (none due) as nothing done.
    """
    from .reader_round import run_reader_round
    from .service import run_round, training_inputs

    round_fn = round_fn or run_round
    inputs_fn = inputs_fn or training_inputs
    reader_fn = reader_fn or run_reader_round
    paths = train_paths(config)
    idle = idle or IdleDetector(config.train.idle_load)
    _lower_priority(config.train.nice)

    def should_stop() -> bool:
        return stop.is_set() or not idle.is_idle(training=True)

    done = 0
    while not stop.is_set() and (rounds is None or done < rounds):
        if not idle.is_idle():
            write_status(paths.status, "waiting", message="waiting for the machine to be idle")
            stop.wait(poll_s)
            continue
        try:
            inputs = inputs_fn(config)
            if inputs == _last_inputs(paths) and not (paths.run_dir / "checkpoint").exists():
                if reader_fn(config, paths=paths, should_stop=should_stop) is None:
                    write_status(paths.status, "waiting",
                                 message="nothing new to train on since the last round")
                    stop.wait(poll_s)
                    continue
                done += 1
                continue
            result = round_fn(config, steps=steps, paths=paths, should_stop=should_stop)
            if getattr(result, "state", None) in ("promoted", "rejected"):
                _record_inputs(paths, inputs)
        except SquidcodeError as exc:
            log.error("training round failed: %s", exc)
            write_status(paths.status, "error", message=str(exc))
            stop.wait(poll_s)
        done += 1
    return done


def _inputs_file(paths: TrainPaths) -> Path:
    return paths.root / "last_round_inputs"


def _last_inputs(paths: TrainPaths) -> str | None:
    try:
        return _inputs_file(paths).read_text().strip() or None
    except OSError:
        return None


def _record_inputs(paths: TrainPaths, inputs: str) -> None:
    path = _inputs_file(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(inputs)
    os.replace(tmp, path)


def _lower_priority(nice: int) -> None:
    try:
        current = os.nice(0)
        if nice > current:
            os.nice(nice - current)
    except OSError as exc:
        log.info("cannot lower the trainer's priority: %s", exc)


def spawn_background(config_root: Path | None = None, paths: TrainPaths | None = None) -> int:
    """Start `squidcode train` detached (a new session, low priority); returns its pid.

    Does nothing and returns the running trainer's pid when one is already running.
    """
    if paths is not None:
        status = read_status(paths.status)
        if status.get("state") in ("waiting", "loading", "training", "evaluating"):
            return int(status["pid"])
    log_path = (paths.root if paths else Path.cwd()) / "trainer.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lsp_server", "train"], cwd=str(config_root or Path.cwd()),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
        )
    return proc.pid
