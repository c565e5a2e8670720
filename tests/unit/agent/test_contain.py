"""Code nobody reviewed runs contained (`agent.contain`): a hostile script run as the agent runs the
workspace's tests, on a throwaway copy, tries to read a key from the environment and the user's
`~/.ssh`, reach a port on 127.0.0.1, write outside its copy, follow a symlink out of it (to read the
key, to write outside), allocate 20 GB, fork without end, sleep forever and print a gigabyte; each
is contained and nothing leaks. Real bubblewrap (installed
by .ci/system-packages.sh) or util-linux's `unshare`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from agent.contain import (
    contained_command,
    isolation,
    limited_processes,
    pids_cgroup_parent,
    process_limit,
    scrubbed_env,
)
from agent.errors import SandboxError
from agent.sandbox import run_command

pytestmark = pytest.mark.skipif(not isolation().isolated, reason=f"no isolation here: {isolation().detail}")

HOSTILE = textwrap.dedent('''\
    import json, os, pathlib, socket, sys
    home_key, port, outside, marker = sys.argv[1:5]
    found = {"env_key": os.environ.get("SQUID_HOSTILE_KEY"), "home": os.environ.get("HOME")}
    try:
        found["ssh"] = pathlib.Path(home_key).read_text()
    except OSError:
        found["ssh"] = None
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", int(port)))
        s.sendall(b"leak")
        found["connected"] = True
    except OSError:
        found["connected"] = False
    try:
        pathlib.Path(outside).write_text("escaped")
        found["wrote_outside"] = True
    except OSError:
        found["wrote_outside"] = False
    # A symlink made in the copy, pointing out of it: to the key, and to the file outside.
    os.symlink(home_key, "key-link")
    os.symlink(outside, "outside-link")
    try:
        found["ssh_by_link"] = pathlib.Path("key-link").read_text()
    except OSError:
        found["ssh_by_link"] = None
    try:
        pathlib.Path("outside-link").write_text("escaped by link")
        found["wrote_by_link"] = True
    except OSError:
        found["wrote_by_link"] = False
    pathlib.Path("inside.txt").write_text("fine")  # the copy itself is writable
    found["wrote_inside"] = pathlib.Path("inside.txt").read_text() == "fine"
    try:
        block = bytearray(20 << 30)
        found["allocated_20g"] = True
    except MemoryError:
        found["allocated_20g"] = False
    forks = 0
    try:
        for _ in range(3000):
            pid = os.fork()
            if pid == 0:
                os.execvp("sleep", ["sleep", marker])
            forks += 1
    except OSError:
        pass
    found["forks"] = forks
    print(json.dumps(found), flush=True)
    ''')


def test_a_hostile_script_is_contained_and_nothing_leaks(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SQUID_HOSTILE_KEY", "sk-secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(3)
    got = []
    waiter = threading.Thread(target=lambda: got.append(_accept(listener)), daemon=True)
    waiter.start()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "hostile.py").write_text(HOSTILE)
    outside = tmp_path / "outside.txt"
    marker = f"30{uuid.uuid4().int % 1000}.5"
    result = run_command(["python", "hostile.py", str(home / ".ssh" / "id_ed25519"),
                          str(listener.getsockname()[1]), str(outside), marker],
                         copy, timeout_s=60, env={"PYTHONDONTWRITEBYTECODE": "1"}, contain=copy)
    found = json.loads(result.output.strip().splitlines()[-1])
    waiter.join(timeout=10)
    assert found["env_key"] is None and found["home"] != str(home)
    assert found["ssh"] is None  # the home folder is hidden (or, with unshare, not where HOME points)
    assert found["ssh_by_link"] is None, found  # a link does not bring the hidden home back
    assert found["connected"] is False and got == [None]
    # Outside its copy it writes nowhere that lasts, directly or through a link: a read-only path,
    # or a scratch /tmp of its own.
    assert not outside.exists() and "wrote_by_link" in found
    assert found["wrote_inside"] is True and (copy / "inside.txt").read_text() == "fine"
    assert found["allocated_20g"] is False
    if "not limited" not in process_limit():
        # It stopped forking at the limit (1024 tasks): per user, or for root a cgroup of its own.
        assert found["forks"] < 1100, found
    # Whatever it forked died with it: no sleeper is left on this machine.
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout
    assert left == ""
    listener.close()


def _accept(listener: socket.socket):
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    conn.close()
    return "connected"


def test_sleeping_forever_and_printing_a_gigabyte_are_cut_off(tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    slept = run_command(["python", "-c", "import time; time.sleep(600)"], copy, timeout_s=3, contain=copy)
    assert slept.timed_out and slept.returncode is None and slept.seconds < 30
    printed = run_command(["python", "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"], copy,
                          timeout_s=60, max_output_bytes=10_000, contain=copy)
    assert printed.returncode is None and printed.truncated and "killed: printed more" in printed.output
    assert printed.seconds < 60


def test_the_wrapper_binds_the_copy_writable_and_hides_the_home_folder(tmp_path):
    argv = contained_command(["python", "-V"], tmp_path, tmp_path, "bwrap")
    assert argv[0].endswith("bwrap") and "--unshare-all" in argv and argv[-2:] == ["python", "-V"]
    assert ["--bind", str(tmp_path.resolve()), str(tmp_path.resolve())] == argv[argv.index("--bind"):][:3]
    assert "--tmpfs" in argv and "prlimit" in " ".join(argv)


def test_without_isolation_the_workspaces_code_does_not_run_unless_allowed(tmp_path, monkeypatch):
    from agent import contain

    monkeypatch.setattr(contain, "isolation", lambda: contain.Isolation("none", "nothing to isolate with"))
    with pytest.raises(SandboxError, match="allow_unisolated"):
        run_command(["python", "-c", "print(1)"], tmp_path, timeout_s=10, contain=tmp_path)
    ran = run_command(["python", "-c", "print(1)"], tmp_path, timeout_s=10, contain=tmp_path,
                      allow_unisolated=True)
    assert ran.ok and ran.output.strip() == "1"


def test_the_agents_test_runs_are_contained_and_say_so_when_they_cannot_be(tmp_path, monkeypatch):
    from agent import contain
    from agent.overlay import Overlay
    from agent.sandbox import Workspace
    from agent.tools import ToolContext
    from agent.tools.tests import run_project_tests
    from context.config import AgentConfig

    (tmp_path / "test_env.py").write_text(
        "import os\n\ndef test_no_secret():\n    assert 'SQUID_HOSTILE_KEY' not in os.environ\n")
    monkeypatch.setenv("SQUID_HOSTILE_KEY", "sk-secret")
    workspace = Workspace([tmp_path])
    ctx = ToolContext(workspace, Overlay(workspace), AgentConfig(test_timeout_s=60))
    run = run_project_tests(ctx)
    assert run.passed is True, run.report  # the key never reached the tests
    monkeypatch.setattr(contain, "isolation", lambda: contain.Isolation("none", "nothing to isolate with"))
    refused = run_project_tests(ctx)
    assert refused.passed is None and refused.summary.startswith("not run:")
    assert "allow_unisolated" in refused.summary


def test_the_scrubbed_environment_keeps_how_the_user_runs_pytest_and_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("SQUID_HOSTILE_KEY", "sk-secret")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    env = scrubbed_env(tmp_path, {"PYTHONPATH": "src"})
    assert env["PYTEST_ADDOPTS"] == "-p no:randomly" and env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert "SQUID_HOSTILE_KEY" not in env and env["HOME"] == str(tmp_path) and env["PYTHONPATH"] == "src"


FORKS = textwrap.dedent("""\
    import os, sys
    forks = 0
    try:
        for _ in range(200):
            if os.fork() == 0:
                quiet = os.open(os.devnull, os.O_WRONLY)  # not holding the caller's pipe open
                os.dup2(quiet, 1)
                os.dup2(quiet, 2)
                os.execvp("sleep", ["sleep", sys.argv[1]])
            forks += 1
    except OSError:
        pass
    print(forks, flush=True)
    """)


@pytest.mark.skipif(pids_cgroup_parent() is None, reason="needs root and a writable pids cgroup: elsewhere "
                    "the kernel's per-user limit (prlimit) holds, which root ignores")
def test_as_root_a_contained_commands_processes_are_counted_in_a_cgroup_of_its_own(tmp_path):
    marker = f"40{uuid.uuid4().int % 1000}.5"
    with limited_processes([sys.executable, "-c", FORKS, marker], 20) as argv:
        group = Path(argv[3]).parent
        assert (group / "pids.max").read_text().strip() == "20"
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    forks = int(done.stdout.strip())
    assert 10 <= forks < 20, done.stderr  # stopped at the limit: the shell's task is the command's
    assert not group.exists()  # removed, and whatever it forked killed with it
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout
    assert left == ""
    assert "cgroup" in process_limit()


def test_a_process_limit_is_reported_for_what_this_machine_does(tmp_path, monkeypatch):
    # Not root: the kernel's per-user limit; root: a pids cgroup where one can be made, else said.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert pids_cgroup_parent(tmp_path) is None
    assert "processes limited per user" in process_limit(tmp_path) or "prlimit" in process_limit(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "not limited" in process_limit(tmp_path)  # no cgroup filesystem here
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "cgroup.procs").write_text("")
    assert pids_cgroup_parent(tmp_path) == tmp_path / "pids"
    assert str(tmp_path / "pids") in process_limit(tmp_path)
    with limited_processes(["true"], 0, tmp_path) as argv:  # no limit asked: the command as it is
        assert argv == ["true"]

