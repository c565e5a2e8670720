"""Running code nobody reviewed: the workspace's tests, in a sandbox that holds.

The agent runs the workspace's tests on its own (the pre-test run: nobody asked for it, and the
workspace may be a repository just cloned from anywhere), on every candidate edit, and the trainer
runs them on every repair reward. That code gets, on a throwaway copy of the workspace:

- no network: a network namespace of its own (`bwrap --unshare-net`, else `unshare --net`);
- a scrubbed environment: the locale, `PATH` and the variables the caller sets, nothing else (no
  tokens, keys or credentials), `HOME` an empty folder;
- the user's home hidden (an empty tmpfs over it; the Python interpreter is bound back read-only
  when it lives there), `/tmp` empty, every other path read-only, the copy the one writable place;
- its own process namespace (everything it started dies with it), and limits on CPU time, memory
  (address space), processes, file size and open files (util-linux's `prlimit`). The kernel does
  not hold root to a process limit (`RLIMIT_NPROC`), so a server running as root (a container, a
  shared machine's service) puts each contained command in a cgroup of its own whose `pids.max` is
  the limit instead (`limited_processes`), where the cgroup filesystem lets it.

`isolation()` finds what this machine offers, once: bubblewrap (installed by the project's setup:
`.ci/system-packages.sh`), else util-linux's `unshare` with a user namespace, else nothing. With
nothing, the tests run only when `agent.allow_unisolated` says so; `squidcode doctor` reports which.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Isolation",
    "Limits",
    "contained_command",
    "contained_server_command",
    "isolation",
    "limited_processes",
    "pids_cgroup_parent",
    "process_limit",
    "scrubbed_env",
]

log = logging.getLogger(__name__)

# Variables a test run keeps from the caller's environment: the locale, the search path, and how
# the user runs pytest (its options and plugin loading: settings, not secrets; a test run the agent
# starts should behave as the user's own).
_KEPT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
         "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")


@dataclass(frozen=True)
class Isolation:
    """How contained commands run on this machine: "bwrap", "unshare" or "none", and why."""

    kind: str
    detail: str

    @property
    def isolated(self) -> bool:
        return self.kind != "none"


@dataclass(frozen=True)
class Limits:
    """Resource limits of a contained command (0: that limit is not set)."""

    cpu_s: int = 120
    memory_bytes: int = 8 << 30
    processes: int = 1024  # counted over the user's tasks on the whole machine, threads included
    file_bytes: int = 256 << 20
    open_files: int = 1024


def _probe(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, (done.stderr or done.stdout).strip()[:200]


@functools.cache
def isolation() -> Isolation:
    """What this machine offers to contain a command (probed once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap:
        ok, why = _probe([bwrap, *_BWRAP_BASE, "--ro-bind", "/", "/", "--", "true"])
        if ok:
            return Isolation("bwrap", f"bubblewrap ({bwrap}): no network, own process and user namespace")
        failed = f"bubblewrap did not start ({why}); "
    else:
        failed = "bubblewrap is not installed; "
    unshare = shutil.which("unshare")
    if unshare:
        ok, why = _probe([unshare, *_UNSHARE_BASE, "true"])
        if ok:
            return Isolation("unshare", failed + f"unshare ({unshare}): no network, own process namespace; "
                             "the home folder stays readable")
        failed += f"unshare did not start ({why}); "
    else:
        failed += "unshare is not installed; "
    return Isolation("none", failed + "tests would run with the network and the home folder reachable")


_BWRAP_BASE = ("--die-with-parent", "--new-session", "--unshare-all", "--unshare-user", "--uid", "1000",
               "--gid", "1000")
_UNSHARE_BASE = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")


def _interpreter_paths() -> list[Path]:
    """Where the running Python lives (bound back read-only when the home folder hides it)."""
    real = Path(os.path.realpath(sys.executable))
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), real.parent.parent}
    return sorted(p for p in paths if p.is_dir())


def scrubbed_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a contained command: `_KEPT` from this one, `HOME` and `TMPDIR` in the
    sandbox, then `extra` (the caller's own settings, as `PYTHONPATH`)."""
    env = {name: os.environ[name] for name in _KEPT if name in os.environ}
    env.update(HOME=str(home), TMPDIR="/tmp", PYTHONNOUSERSITE="1")
    env.update(extra or {})
    return env


def _limit_args(limits: Limits) -> list[str]:
    """util-linux's `prlimit` in front of the command, when installed (the limits hold for it and
    everything it starts)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    args = [prlimit]
    for flag, value in (("cpu", limits.cpu_s), ("as", limits.memory_bytes), ("nproc", limits.processes),
                        ("fsize", limits.file_bytes), ("nofile", limits.open_files)):
        if value > 0:
            args.append(f"--{flag}={value}:{value}")
    return [*args, "--"]


def contained_command(argv: list[str], copy: Path, cwd: Path, kind: str,
                      limits: Limits = Limits()) -> list[str]:
    """`argv` (its program resolved) wrapped to run contained (`kind`: an `Isolation.kind`) under
    `limits`, with `copy` (the throwaway copy of the workspace) the one writable place and `cwd` in it."""
    copy, cwd = Path(copy).resolve(), Path(cwd).resolve()
    argv = [*_limit_args(limits), *argv]
    if kind == "bwrap":
        return [*_bwrap_prefix(), "--bind", str(copy), str(copy), "--chdir", str(cwd), "--", *argv]
    if kind == "unshare":
        return [shutil.which("unshare") or "unshare", *_UNSHARE_BASE, *argv]
    return list(argv)


def contained_server_command(argv: list[str], roots: list[Path], home: Path, kind: str) -> list[str]:
    """A long-running program the agent starts on the workspace, a language server (which may run
    the workspace's own interpreter to find its packages), wrapped like a test run: no network, its
    own process namespace, the user's home hidden, every path read-only but `home` (its `HOME`, a
    temporary folder), `roots` readable, `argv[0]`'s installation bound back. No resource limits:
    a server's runtime reserves more address space than it uses (Node.js), and it lives as long as
    the agent's pool; the pool ends it."""
    if kind == "bwrap":
        program = Path(os.path.realpath(argv[0]))
        readable = [Path(root).resolve() for root in roots] + [program.parent.parent]
        binds = [arg for path in readable if path.is_dir() for arg in ("--ro-bind", str(path), str(path))]
        home = Path(home).resolve()
        return [*_bwrap_prefix(), *binds, "--bind", str(home), str(home),
                "--chdir", str(Path(roots[0]).resolve()), "--", *argv]
    if kind == "unshare":
        return [shutil.which("unshare") or "unshare", *_UNSHARE_BASE, *argv]
    return list(argv)


def _bwrap_prefix() -> list[str]:
    """bubblewrap with the whole tree read-only, empty /tmp, /run and home, the interpreter bound back."""
    wrapped = [shutil.which("bwrap") or "bwrap", *_BWRAP_BASE, "--ro-bind", "/", "/", "--dev", "/dev",
               "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/var/tmp"]
    home = Path.home()
    if home != Path("/") and home.is_dir():
        wrapped += ["--tmpfs", str(home)]
    for path in _interpreter_paths():
        wrapped += ["--ro-bind", str(path), str(path)]
    return wrapped


# -- a process limit that holds for root ------------------------------------------------------------

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def pids_cgroup_parent(root: Path = _CGROUP_ROOT) -> Path | None:
    """A cgroup folder this process may make children with a `pids` controller in (cgroup v1's pids
    hierarchy, or v2's root where it delegates `pids`), or None: not root, or not writable here."""
    if os.geteuid() != 0:
        return None
    v1 = root / "pids"
    if (v1 / "cgroup.procs").is_file() and os.access(v1, os.W_OK):
        return v1
    with contextlib.suppress(OSError):
        if "pids" in (root / "cgroup.subtree_control").read_text().split() and os.access(root, os.W_OK):
            return root
    return None


def process_limit(root: Path = _CGROUP_ROOT) -> str:
    """How a contained command's processes are limited on this machine, in words (`squidcode doctor`)."""
    if os.geteuid() != 0:
        return "processes limited per user (prlimit)" if shutil.which("prlimit") else \
            "processes not limited (util-linux's prlimit is not installed)"
    parent = pids_cgroup_parent(root)
    if parent is not None:
        return f"running as root: processes limited by a cgroup of their own ({parent})"
    return "running as root and no writable pids cgroup: processes not limited (root ignores RLIMIT_NPROC)"


@contextlib.contextmanager
def limited_processes(argv: list[str], limit: int, root: Path = _CGROUP_ROOT) -> Iterator[list[str]]:
    """`argv` made to run in a cgroup of its own holding at most `limit` tasks, while the block
    runs, where this process is root and may make one (`pids_cgroup_parent`); else `argv` as it is
    (`prlimit`'s per-user limit holds for other users). On leaving, whatever is left in the cgroup
    is killed and the cgroup removed."""
    parent = pids_cgroup_parent(root) if limit > 0 else None
    group = None
    if parent is not None:
        group = parent / f"squidcode-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(limit))
        except OSError as exc:
            log.warning("no process limit for a contained command: cannot make a cgroup in %s (%s)",
                        parent, exc)
            with contextlib.suppress(OSError):
                group.rmdir()
            group = None
    if group is None:
        yield list(argv)
        return
    # The shell joins the cgroup, then becomes the command: everything it starts is counted there.
    shell = shutil.which("sh") or "/bin/sh"
    try:
        yield [shell, "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *argv]
    finally:
        _remove_cgroup(group)


def _remove_cgroup(group: Path) -> None:
    for _ in range(100):
        with contextlib.suppress(OSError, ValueError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # its last tasks are still exiting
    log.warning("could not remove the cgroup %s of a contained command", group)

