"""The agent's sandbox: workspace roots it may touch, and the one way it runs a subprocess.

Every path a tool receives goes through `Workspace.resolve`, which resolves symlinks before checking
that the target lies inside a root, so `link -> /etc` is refused like `../../etc`. Every command goes
through `run_command`: only allowlisted programs, always a timeout, always a cap on the output kept
(a child printing gigabytes is killed once it passes the hard cap, and its process group with it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import SandboxError

__all__ = ["ALLOWED_COMMANDS", "CommandResult", "Workspace", "run_command", "trim_middle"]

# Programs the agent may start. `python` means the interpreter squidcode runs under (for pytest).
ALLOWED_COMMANDS = frozenset({"git", "ruff", "python"})
_READ_CHUNK = 65536


@dataclass(frozen=True)
class CommandResult:
    """What a sandboxed command did: exit code, the (capped) output, and why it stopped."""

    argv: tuple[str, ...]
    returncode: int | None  # None when it was killed
    output: str
    timed_out: bool
    truncated: bool  # more output was produced than kept
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class Workspace:
    """The folders the agent may read and (through the overlay) edit."""

    def __init__(self, roots: Iterable[Path]):
        self.roots = [Path(r).resolve() for r in roots]
        if not self.roots:
            raise SandboxError("the agent needs at least one workspace folder")

    @property
    def root(self) -> Path:
        return self.roots[0]

    def resolve(self, path: str | Path) -> Path:
        """The real path of `path` (relative ones from the first root), refused outside the roots."""
        if not isinstance(path, str | Path) or str(path).strip() == "":
            raise SandboxError("a path is required")
        if "\x00" in str(path):
            raise SandboxError("a path cannot contain NUL")
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = self.root / candidate
        # resolve() follows every symlink on the way, so a link pointing out is caught below.
        real = candidate.resolve()
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            raise SandboxError(f"{path} is outside the workspace ({', '.join(map(str, self.roots))})")
        return real

    def rel(self, path: Path) -> str:
        for root in self.roots:
            if path == root or path.is_relative_to(root):
                return path.relative_to(root).as_posix()
        return str(path)


def _program(argv: Sequence[str]) -> list[str]:
    if not argv:
        raise SandboxError("no command given")
    name = argv[0]
    if name not in ALLOWED_COMMANDS:
        raise SandboxError(
            f"the command {name!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_COMMANDS))})"
        )
    if name == "python":
        return [sys.executable, *argv[1:]]
    found = shutil.which(name) or (shutil.which(name, path=str(Path(sys.executable).parent)))
    if found is None:
        raise SandboxError(f"{name} is not installed (not found on PATH)")
    return [found, *argv[1:]]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(
    argv: Sequence[str],
    cwd: Path,
    *,
    timeout_s: float,
    max_output_bytes: int = 200_000,
    stdin_text: str | None = None,
    env: dict[str, str] | None = None,
    hard_cap_factor: int = 20,
    stderr: bool = True,
    contain: Path | None = None,
    allow_unisolated: bool = False,
) -> CommandResult:
    """Run an allowlisted command with a timeout; keep at most `max_output_bytes` of its output.

    Output beyond the kept bytes is drained and dropped; past `hard_cap_factor` times that the child
    is killed (a runaway printer would otherwise keep us reading until the timeout).

    `contain`: the command runs code nobody reviewed (the workspace's tests); it runs contained
    (`agent.contain`: no network, a scrubbed environment with `env` on top, the home folder hidden,
    resource limits) with `contain`, a throwaway copy of the workspace, the one writable place. A
    machine that cannot isolate it refuses (SandboxError) unless `allow_unisolated`.
    """
    full = _program(argv)
    home, processes = None, 0
    if contain is not None:
        from .contain import Limits, contained_command, isolation, scrubbed_env

        iso = isolation()
        if not iso.isolated and not allow_unisolated:
            raise SandboxError(f"cannot run {argv[0]} contained: {iso.detail}. Install bubblewrap, or set "
                               "agent.allow_unisolated = true to run the workspace's code without isolation")
        limits = Limits(cpu_s=max(1, int(timeout_s) + 5))
        full, processes = contained_command(full, contain, cwd, iso.kind, limits), limits.processes
        if iso.kind == "bwrap":
            env = scrubbed_env(Path("/tmp"), env)  # an empty tmpfs in the sandbox
        else:
            home = tempfile.mkdtemp(prefix="squid-home-")
            env = scrubbed_env(Path(home), env)
    try:
        if not processes:
            return _run(full, argv, cwd, timeout_s, max_output_bytes, stdin_text, env, hard_cap_factor,
                        stderr)
        from .contain import limited_processes

        with limited_processes(full, processes) as limited:
            return _run(limited, argv, cwd, timeout_s, max_output_bytes, stdin_text, env, hard_cap_factor,
                        stderr)
    finally:
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


def _run(full: list[str], argv: Sequence[str], cwd: Path, timeout_s: float, max_output_bytes: int,
         stdin_text: str | None, env: dict[str, str] | None, hard_cap_factor: int,
         stderr: bool) -> CommandResult:
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            full,
            cwd=str(cwd),
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
    kept = bytearray()
    state = {"seen": 0, "killed_for_size": False}

    def pump() -> None:
        assert process.stdout is not None
        while chunk := process.stdout.read1(_READ_CHUNK):
            state["seen"] += len(chunk)
            if len(kept) < max_output_bytes:
                kept.extend(chunk[: max_output_bytes - len(kept)])
            if state["seen"] > max_output_bytes * hard_cap_factor and not state["killed_for_size"]:
                state["killed_for_size"] = True
                _kill_group(process)

    reader = threading.Thread(target=pump, name="squid-agent-pipe", daemon=True)
    reader.start()
    if stdin_text is not None:
        _feed(process, stdin_text)
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        process.wait()
    # A grandchild holding the pipe open must not keep us here.
    reader.join(timeout=2)
    _kill_group(process)
    code = None if timed_out or state["killed_for_size"] else process.returncode
    text = kept.decode("utf-8", errors="replace")
    if state["killed_for_size"]:
        text += f"\n[killed: printed more than {max_output_bytes * hard_cap_factor} bytes]"
    return CommandResult(
        tuple(argv), code, text, timed_out, state["seen"] > len(kept), time.monotonic() - started
    )


def _feed(process: subprocess.Popen, text: str) -> None:
    assert process.stdin is not None
    try:
        process.stdin.write(text.encode("utf-8"))
        process.stdin.close()
    except BrokenPipeError:
        pass


def trim_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail (where errors usually are)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"
