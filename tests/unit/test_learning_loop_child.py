"""bench/learning_loop.py's trainer child dies with the bench: killed by a caller's timeout, the
bench used to leave `squidcode train` running (an orphan seen 24 minutes later, 5.7 GiB)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from bench.learning_loop import die_with_parent
# Like the trainer, the child takes SIGTERM as a request to finish its work first (here: ignores it).
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code], preexec_fn=die_with_parent, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_trainer_child_is_terminated_when_the_bench_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()  # SIGKILL: no handler of the bench's runs
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived the killed bench"
    finally:
        parent.kill()
        try:
            os.kill(child, 9)
        except (ProcessLookupError, UnboundLocalError):
            pass
