"""The sandbox: paths stay in the workspace (symlinks resolved); commands are allowlisted and bounded."""

from __future__ import annotations

import os
import time

import pytest

from agent.errors import SandboxError
from agent.sandbox import Workspace, run_command, trim_middle


def test_relative_and_absolute_paths_inside_resolve(project):
    ws = Workspace([project])
    assert ws.resolve("calc.py") == (project / "calc.py").resolve()
    assert ws.resolve(str(project / "calc.py")) == (project / "calc.py").resolve()
    assert ws.rel(ws.resolve("calc.py")) == "calc.py"


@pytest.mark.parametrize("bad", ["../outside.py", "/etc/passwd", "sub/../../x", "", "a\x00b"])
def test_paths_outside_or_malformed_are_refused(project, bad):
    with pytest.raises(SandboxError):
        Workspace([project]).resolve(bad)


def test_a_symlink_pointing_out_is_refused(project, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.symlink(secret, project / "link.txt")
    os.symlink(tmp_path, project / "linkdir")
    ws = Workspace([project])
    with pytest.raises(SandboxError, match="outside the workspace"):
        ws.resolve("link.txt")
    with pytest.raises(SandboxError):
        ws.resolve("linkdir/secret.txt")


def test_a_symlink_inside_the_workspace_is_fine(project):
    os.symlink(project / "calc.py", project / "alias.py")
    assert Workspace([project]).resolve("alias.py") == (project / "calc.py").resolve()


def test_commands_outside_the_allowlist_are_refused(project):
    for argv in (["rm", "-rf", "/"], ["bash", "-c", "echo hi"], ["/usr/bin/git", "status"], []):
        with pytest.raises(SandboxError):
            run_command(argv, project, timeout_s=5)


def test_a_hanging_command_is_killed_at_its_timeout(project):
    started = time.monotonic()
    result = run_command(["python", "-c", "import time; time.sleep(60)"], project, timeout_s=1)
    assert result.timed_out and result.returncode is None and not result.ok
    assert time.monotonic() - started < 10


def test_a_command_printing_gigabytes_is_cut_and_killed(project):
    started = time.monotonic()
    script = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    result = run_command(["python", "-c", script], project, timeout_s=60, max_output_bytes=10_000)
    assert len(result.output.encode()) < 11_000
    assert result.truncated and "killed" in result.output
    assert time.monotonic() - started < 30


def test_output_and_exit_code_come_back(project):
    result = run_command(["python", "-c", "print('hello'); raise SystemExit(3)"], project, timeout_s=20)
    assert result.returncode == 3 and result.output.strip() == "hello" and not result.truncated


def test_trim_middle_keeps_head_and_tail():
    text = "HEAD" + "x" * 1000 + "TAIL"
    cut = trim_middle(text, 100)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and len(cut) < 160
    assert trim_middle("short", 100) == "short"
