"""`run_tests`: the project's tests (pytest) on the overlay, in a temporary copy of the workspace.

The workspace itself is never touched: its files (git's list in a repository, else a walk) are copied
into a temporary folder, the overlay's edits are written over them, and pytest runs there with a
timeout and a cap on its output. What comes back is the part of the output about what failed.

pytest runs with `--capture=tee-sys`: it still keeps each test's output for its report, and the same
bytes reach the output cap as they are printed, so a test printing without end is stopped within
the cap, not after the whole timeout with its output spooled to a file.

The tests run under the interpreter that runs squidcode. Where it cannot import pytest (pytest is
not a dependency of squidcode's own install: `pip install squidcode` and `./dev demo` have none), the
standard library's unittest runs them instead and the summary says so; `python -m pytest` would
exit 1 there ("No module named pytest"), which reads as failing tests and rejects every edit.
unittest finds only `unittest.TestCase` tests: plain pytest-style test functions come back as "no
tests collected (unittest: pytest is not installed)", never as passing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError, ToolError
from ..sandbox import run_command, trim_middle
from .code import _SKIP_DIRS
from .registry import Tool, ToolContext, ToolResult

__all__ = ["RUN_TESTS", "TestRun", "run_project_tests", "copy_workspace", "python_path"]

MAX_COPY_FILES = 20_000
MAX_COPY_BYTES = 200_000_000
REPORT_CHARS = 3000
_SECTION = re.compile(r"^=+ (FAILURES|ERRORS|short test summary info) =+$", re.M)
_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error|errors|skipped|deselected)\b.*?)\s*=*$", re.M)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
_UNITTEST_COUNTS = re.compile(r"(failures|errors|skipped|expected failures|unexpected successes)=(\d+)")
_UNITTEST_REPORT = re.compile(r"^={20,}$", re.M)
WITHOUT_PYTEST = "unittest: pytest is not installed"


_FAILED_ID = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)
# A frame of a short traceback: "toolz/itertoolz.py:801: in getter".
_FRAME = re.compile(r"^(?:\./)?([^\s:<][^:\n]*\.py):(\d+): in ", re.M)


@dataclass(frozen=True)
class TestRun:
    """One pytest run: `passed` is None when there was nothing to run; `failing`, the ids of the
    tests that failed (pytest's short summary; empty when it printed none)."""

    passed: bool | None
    summary: str
    report: str
    timed_out: bool
    failing: tuple[str, ...] = ()
    # (file, line) of every frame in the failures' tracebacks, the files relative to the workspace.
    frames: tuple[tuple[str, int], ...] = ()

    def failing_through(self, path: str, spans: list[tuple[int, int]]) -> bool:
        """Whether a failing test's traceback passes through lines `spans` (1-based, inclusive) of
        `path`: the code an edit changed still fails for some test."""
        return any(file == path and any(a <= line <= b for a, b in spans) for file, line in self.frames)

    def judged_against(self, before: TestRun | None) -> TestRun:
        """This run (after an edit) judged against `before` (the run before it), when that one
        failed: passed when every test failing now failed before as well, and fewer fail. Tests that
        fail whatever the edit does (a missing service, an uninstalled package's metadata) then
        do not reject every edit, while an edit that breaks a passing test still fails."""
        if before is None or before.passed is not False or not before.failing or self.passed is not False:
            return self
        if self.timed_out or not self.failing or not set(self.failing) < set(before.failing):
            return self
        fixed = len(before.failing) - len(self.failing)
        summary = (f"{self.summary}; {fixed} of the {len(before.failing)} tests failing before the edit "
                   "pass, the rest failed before it too")
        return dataclasses.replace(self, passed=True, summary=summary)


def _listed_files(ctx: ToolContext, root: Path) -> list[Path]:
    if (root / ".git").exists():
        result = run_command(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            root,
            timeout_s=ctx.config.tool_timeout_s,
            max_output_bytes=20_000_000,
            stderr=False,
        )
        if result.ok:
            return [root / name for name in result.output.split("\0") if name]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        files.extend(Path(dirpath) / name for name in filenames)
    return files


def copy_workspace(ctx: ToolContext, target: Path) -> None:
    """The workspace's files plus the overlay's edits, under `target` (symlinks are not followed)."""
    root = ctx.workspace.root
    total = 0
    files = _listed_files(ctx, root)
    if len(files) > MAX_COPY_FILES:
        raise ToolError(f"the workspace has {len(files)} files; run_tests copies at most {MAX_COPY_FILES}")
    for path in files:
        if path.is_symlink() or not path.is_file():
            continue
        total += path.stat().st_size
        if total > MAX_COPY_BYTES:
            raise ToolError(f"the workspace is larger than {MAX_COPY_BYTES // 1_000_000} MB; too big to copy")
        dest = target / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    for path, text in ctx.overlay.edited().items():
        if path.is_relative_to(root):
            dest = target / path.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")


def _failure_report(output: str) -> str:
    match = _SECTION.search(output)
    return trim_middle(output[match.start() :] if match else output, REPORT_CHARS)


def pytest_installed() -> bool:
    """Whether the interpreter that runs the tests (this one: `sandbox` maps "python" to it) has pytest."""
    return importlib.util.find_spec("pytest") is not None


def _unittest_argv(target: str | None) -> list[str]:
    if not target:
        return ["python", "-m", "unittest", "discover", "-f", "-s", ".", "-t", "."]
    path, _, rest = target.partition("::")
    if not rest:
        return ["python", "-m", "unittest", "-f", path]  # unittest takes a test file's path as its module
    module = path.removesuffix(".py").replace("/", ".")
    return ["python", "-m", "unittest", "-f", ".".join([module, *rest.split("::")])]


def _unittest_run(result, output: str) -> TestRun:
    """A finished unittest run as a TestRun, with a pytest-like summary ("1 failed, 2 passed")."""
    ran = _UNITTEST_RAN.search(output)
    if result.returncode == 5 or (ran is not None and int(ran.group(1)) == 0):
        return TestRun(None, f"no tests collected ({WITHOUT_PYTEST})", "", False)
    if ran is None:  # unittest did not get as far as running tests (an import error in a test module)
        return TestRun(False, f"unittest exited with {result.returncode} ({WITHOUT_PYTEST})",
                       trim_middle(output, REPORT_CHARS), False)
    counts = {name: int(n) for name, n in _UNITTEST_COUNTS.findall(output[ran.end():])}
    failed, errors = counts.get("failures", 0), counts.get("errors", 0)
    passed = int(ran.group(1)) - failed - errors - counts.get("skipped", 0)
    parts = [f"{failed} failed"] * bool(failed) + [f"{passed} passed"] * bool(passed or not failed + errors)
    parts += [f"{errors} errors"] * bool(errors)
    summary = f"{', '.join(parts)} ({WITHOUT_PYTEST})"
    if result.returncode == 0:
        return TestRun(True, summary, "", False)
    first = _UNITTEST_REPORT.search(output)  # the first failure's separator line
    return TestRun(False, summary, trim_middle(output[first.start() if first else 0 :], REPORT_CHARS), False)


def python_path(root: Path) -> str:
    """`PYTHONPATH` for tests run in `root` (a copy of the workspace): the copy, and before it its
    `src/` where that holds a package (the src layout). Without it `import pkg` in the tests finds
    the package installed in the interpreter's environment, or nothing, not the code being edited."""
    root = Path(root)
    src = root / "src"
    with_src = src.is_dir() and any((d / "__init__.py").is_file() for d in src.iterdir() if d.is_dir())
    return os.pathsep.join([str(src)] * with_src + [str(root)])


def run_project_tests(ctx: ToolContext, target: str | None = None, timeout_s: float | None = None,
                      stop_first: bool = True) -> TestRun:
    """The tests (all, or `target`) on the overlay; with `stop_first`, up to the first failure.
    Without it, a test module that cannot be imported does not stop the run (pytest stops every test
    at a collection error otherwise): it counts among the failing, and the other modules run."""
    timeout = min(timeout_s or ctx.config.test_timeout_s, ctx.config.test_timeout_s)
    to_the_end = [] if stop_first else ["--continue-on-collection-errors"]
    argv = ["python", "-m", "pytest", "-q", *["-x"] * stop_first, *to_the_end, "--tb=short", "-p",
            "no:cacheprovider", "--color=no", "--capture=tee-sys"]
    if target:
        node = target.split("::", 1)
        ctx.workspace.resolve(node[0])  # inside the workspace, or refused
        argv.append(target)
    with_pytest = pytest_installed()
    if not with_pytest:
        argv = _unittest_argv(target)
    with tempfile.TemporaryDirectory(prefix="squid-tests-") as tmp:
        copy_workspace(ctx, Path(tmp))
        # Code nobody reviewed: contained, with only these variables on top of a scrubbed environment.
        env = {"PYTHONPATH": python_path(Path(tmp)), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            result = run_command(
                argv, Path(tmp), timeout_s=timeout, max_output_bytes=ctx.config.max_output_bytes, env=env,
                contain=Path(tmp), allow_unisolated=ctx.config.allow_unisolated,
            )
        except SandboxError as exc:  # no way to contain them here, and running them anyway not allowed
            return TestRun(None, f"not run: {exc}", "", False)
    output = result.output.replace(tmp, ".")
    if result.timed_out:
        return TestRun(False, f"timed out after {timeout:.0f} s", trim_middle(output, REPORT_CHARS), True)
    if result.returncode is None:  # stopped by the output cap
        return TestRun(False, "stopped: the tests printed more than the output cap",
                       trim_middle(output, REPORT_CHARS), False)
    if not with_pytest:
        return _unittest_run(result, output)
    if result.returncode == 5:
        return TestRun(None, "no tests collected", "", False)
    found = _SUMMARY.findall(output)
    summary = found[-1][0] if found else f"pytest exited with {result.returncode}"
    if result.returncode == 0:
        return TestRun(True, summary, "", False)
    failing = tuple(dict.fromkeys(_FAILED_ID.findall(output)))
    section = _SECTION.search(output)
    tracebacks = output[section.start() :] if section else ""
    frames = tuple(dict.fromkeys((f, int(n)) for f, n in _FRAME.findall(tracebacks)))
    return TestRun(False, summary, _failure_report(output), False, failing, frames)


def run_tests(ctx: ToolContext, args: dict) -> ToolResult:
    run = run_project_tests(ctx, args.get("target"), args.get("timeout"))
    data = {"passed": run.passed, "summary": run.summary, "timed_out": run.timed_out}
    if run.passed is None:
        why = "" if run.summary == "no tests collected" else f": {run.summary}"
        return ToolResult(True, f"no tests were found{why}", data)
    if run.passed:
        return ToolResult(True, f"tests pass: {run.summary}", data)
    return ToolResult(True, f"tests fail: {run.summary}\n{run.report}", data)


RUN_TESTS = Tool(
    "run_tests",
    "Run the project's tests (pytest) on the edited code; shows what failed.",
    {
        "type": "object",
        "properties": {
            "target": {"type": "string", "description": "a test file or node id (default: all tests)"},
            "timeout": {"type": "number", "description": "seconds"},
        },
    },
    run_tests,
)
