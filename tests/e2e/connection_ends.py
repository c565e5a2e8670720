"""Connections that end at chosen moments: during the model load, the first index pass, a
completion, the pre-encoding of reference documents, or while idle; ended the polite way
(`shutdown` + `exit`), by `exit` alone, or by a client that vanishes (its pipe closed, no `exit`).

Each connection is a fresh `squidcode serve` on a fresh copy of a real package (the standard
library's `email`, 29 files), with Squid and the index on and the Squid disk tier in its own folder,
so the index pass and the pre-encode really run. `run_connection` reports the server's exit code,
how long it took to exit, and every line of its stderr that reads as a failure. Used by
tests/e2e/test_shutdown.py and bench/bench_shutdown.py.
"""

from __future__ import annotations

import email
import random
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.raw_lsp import end_position, start_client

__all__ = ["MOMENTS", "ENDINGS", "ConnectionEnd", "Outcome", "run_connection", "random_ends", "FAILURE_MARKS",
           "failure_lines"]

MOMENTS = ("model-load", "index", "completion", "preencode", "idle")
ENDINGS = ("shutdown", "exit-only", "vanish")
# What a clean stop never writes to stderr.
FAILURE_MARKS = ("ERROR", "CRITICAL", "Traceback", "terminate called", "Fatal Python error",
                 "Segmentation fault", "closed database", "Exception in thread")
_PACKAGE = Path(email.__file__).parent
_EDITED = "feedparser.py"


@dataclass(frozen=True)
class ConnectionEnd:
    moment: str  # one of MOMENTS
    ending: str  # one of ENDINGS
    delay_s: float = 0.0  # how long after the moment began the client ends the connection


@dataclass
class Outcome:
    end: ConnectionEnd
    exit_code: int | None
    exit_s: float  # from the ending message (or closed pipe) to the process gone
    failures: list[str] = field(default_factory=list)

    @property
    def expected_code(self) -> int:
        # LSP: `exit` without `shutdown` is code 1; a client that vanished is not the server's fault.
        return 1 if self.end.ending == "exit-only" else 0

    @property
    def clean(self) -> bool:
        return self.exit_code == self.expected_code and not self.failures


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    shutil.copytree(_PACKAGE, ws / "email", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run(["git", "add", "-A"], cwd=ws, check=True)
    return ws


def _options(tmp: Path, squid: dict | None = None) -> dict:
    return {
        "completion": {"max_tokens": 16, "debounce_ms": 0},
        "squid": {"enabled": True, "cache_dir": str(tmp / "squid-cache"), **(squid or {})},
        "index": {"embeddings": False},
    }


def run_connection(end: ConnectionEnd, tmp: Path, timeout_s: float = 120.0,
                   squid: dict | None = None) -> Outcome:
    """Start a server, bring it to `end.moment`, end the connection `end.delay_s` later; `squid`:
    more Squid settings (a reader)."""
    tmp.mkdir(parents=True, exist_ok=True)
    ws = _workspace(tmp)
    client = start_client(tmp)
    try:
        client.initialize(root=ws, options=_options(tmp, squid))
        _reach(client, end.moment, ws)
        time.sleep(end.delay_s)
        ended = time.monotonic()
        _end(client, end.ending)
        try:
            code = client.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        exit_s = time.monotonic() - ended
    finally:
        if client.proc.poll() is None:
            client.proc.kill()  # it did not stop (a failure, reported by its code) or the test failed
        client.close()
    log = client.stderr_path.read_text(errors="replace")
    return Outcome(end, code, round(exit_s, 3), failure_lines(log))


def failure_lines(log: str) -> list[str]:
    """The lines of `log` that read as a failure; a traceback whole, to its exception's line."""
    failures: list[str] = []
    in_traceback = False
    for line in log.splitlines():
        if in_traceback:
            failures.append(line)
            # The frames are indented; the exception's own line is the first that is not.
            in_traceback = line.startswith((" ", "\t")) or not line.strip()
        elif any(mark in line for mark in FAILURE_MARKS):
            failures.append(line)
            in_traceback = "Traceback" in line
    return failures


def _reach(client, moment: str, ws: Path) -> None:
    if moment in ("model-load", "index"):
        return  # both start at `initialized`; the model load lasts longer than the pass does not
    text = (ws / "email" / _EDITED).read_text()
    cut = text.index("    def _parsegen(self):")
    prefix = text[:cut] + "    def _parsegen(self):\n        "
    uri = (ws / "email" / _EDITED).as_uri()
    client.open(uri, prefix)
    if moment == "completion":
        client.send_request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": end_position(prefix), "context": {"triggerKind": 1}})
        return
    for other in ("message.py", "_policybase.py", "header.py"):
        path = ws / "email" / other
        client.open(path.as_uri(), path.read_text())
    # The first completion schedules the other open files for pre-encoding once it has answered.
    client.inline_completion(uri, end_position(prefix))
    if moment == "idle":
        time.sleep(3.0)


def _end(client, ending: str) -> None:
    if ending == "shutdown":
        client.send_request("shutdown")
        client.notify("exit")
    elif ending == "exit-only":
        client.notify("exit")
    elif ending == "vanish":
        client.proc.stdin.close()
    else:
        raise ValueError(f"unknown ending {ending!r}")


def random_ends(n: int, seed: int, max_delay_s: float = 4.0) -> list[ConnectionEnd]:
    """`n` connection ends drawn with `seed`: every moment, mostly polite endings, random delays."""
    rng = random.Random(seed)
    ends = []
    for _ in range(n):
        ending = rng.choices(ENDINGS, weights=(6, 1, 3))[0]
        ends.append(ConnectionEnd(rng.choice(MOMENTS), ending, round(rng.uniform(0.0, max_delay_s), 2)))
    return ends
