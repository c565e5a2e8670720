"""Rewards for one model output, bounded in [-1, 1], from verifiable checks and recorded outcomes.

A reward is a weighted sum of parts, each in [0, 1]:

- verifiable: `format` (the output holds code: a fenced block, or bare code), `parses` (ast for
  Python, tree-sitter for the other languages), `lint` (real ruff, errors only, on Python), `tests`
  (the share of tests passing in a sandboxed temporary copy: never the user's files);
- outcome: `kept` (similarity to the code the user finally kept at the last checkpoint), and
  `preference` (how likely this user is to keep such an answer, from a model fitted on all their
  recorded outcomes: `feedback.preference`; only when one was fitted and predicts them);

minus `reverted` (similarity to what the user reverted, weighted by its own penalty weight).
An inline completion (`RewardContext.bare`) is a fragment indented as the code around it: it is
dedented before the checks, a fence counts against its format, it is not linted (its names are
defined around it), and one that does not parse earns nothing but the reverted penalty.
Doing nothing earns nothing: an empty output, or one that returns the original text unchanged,
scores exactly 0 and runs no check.

Kept / reverted labels belong to one recorded sample, not to the G fresh samples of a group, so they
are never handed out as a constant (that would give every sample of the group the same reward and no
advantage). They act through reference texts: a kept or modified episode contributes the code the
user ended with (`kept_text`), and a reverted one contributes the reverted output (`reverted_text`)
as a text to stay away from, while the text left in place of it is the `kept_text`. Each sample is
scored by how close it is to those texts, which differs from sample to sample.
"""

from __future__ import annotations

import ast
import difflib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RewardBreakdown",
    "RewardContext",
    "RewardWeights",
    "extract_code",
    "lint_errors",
    "parses",
    "run_tests_sandboxed",
    "score_output",
    "similarity",
]

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
SIMILARITY_CHARS = 4000  # difflib is quadratic: compare at most this much of each text
TEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the parts. The positive parts are averaged by weight over the parts checked, so
    their total stays in [0, 1], and the reverted penalty brings it down to at least -1."""

    format: float = 0.1
    parses: float = 0.15
    lint: float = 0.1
    tests: float = 0.4
    kept: float = 0.25
    preference: float = 0.3  # the learned P(kept), when a preference model is in use
    reverted: float = 0.5  # the penalty for resembling reverted text


@dataclass(frozen=True)
class RewardContext:
    """What an output is judged against: the task, the checks available, the recorded outcome."""

    language: str = "python"
    original: str = ""  # the text the output replaces; returning it unchanged is doing nothing
    kept_text: str | None = None  # the code the user finally kept (last checkpoint)
    reverted_text: str | None = None  # an output the user reverted
    # Tests: assert statements run one by one after the candidate, or pytest files run in the copy.
    test_asserts: tuple[str, ...] = ()
    test_files: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)  # the workspace files the sandbox copies
    target_path: str = "candidate.py"  # where the candidate code goes in the sandbox
    timeout_s: float = TEST_TIMEOUT_S  # a test run past this scores 0
    # An inline completion: bare code inserted at the cursor (a fence is chat drift, not format),
    # indented as the code around it; it and the reference texts are dedented before the checks.
    bare: bool = False
    # The user's learned preference (`feedback.preference.PreferenceModel.score`): P(kept) of a code text.
    preference: Callable[[str], float] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RewardBreakdown:
    """The total reward and the part scores (each in [0, 1]) it was made of."""

    total: float
    parts: dict[str, float]
    code: str | None = None


def extract_code(output: str, language: str = "python") -> tuple[str | None, bool]:
    """The code in a model output and whether it came in a fence: (code, fenced).

    The first fenced block wins (a language tag other than the expected one is still accepted);
    without a fence the whole stripped output is taken as code. None when there is nothing.
    """
    match = _FENCE.search(output)
    if match:
        code = match.group(2).strip("\n")
        return (code if code.strip() else None), True
    stripped = output.strip("\n")
    return (stripped if stripped.strip() else None), False


def parses(code: str, language: str = "python") -> bool:
    """Whether `code` is syntactically valid in `language` (ast for Python, tree-sitter otherwise)."""
    if language == "python":
        try:
            ast.parse(code)
        except (SyntaxError, ValueError):
            return False
        return True
    return _tree_sitter_parses(code, language)


def _tree_sitter_parses(code: str, language: str) -> bool:
    import importlib

    import tree_sitter

    module_name = {"typescript": "tree_sitter_typescript", "javascript": "tree_sitter_javascript"}.get(
        language, f"tree_sitter_{language}"
    )
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return True  # no grammar: nothing to hold against the output
    grammar = module.language_typescript() if language == "typescript" else module.language()
    tree = tree_sitter.Parser(tree_sitter.Language(grammar)).parse(code.encode())
    return not tree.root_node.has_error


def _ruff_binary() -> str | None:
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("ruff")


def lint_errors(code: str) -> int | None:
    """How many ruff errors (pyflakes F and pycodestyle E9 syntax) `code` has; None without ruff."""
    ruff = _ruff_binary()
    if ruff is None:
        return None
    proc = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F,E9", "--output-format", "json",
         "--stdin-filename", "candidate.py", "-"],
        input=code, capture_output=True, text=True, timeout=30,
    )
    try:
        return len(json.loads(proc.stdout or "[]"))
    except json.JSONDecodeError:
        return None


_ASSERT_HARNESS = """
import json, sys
namespace = {"__name__": "candidate"}
passed = 0
tests = json.loads(sys.argv[1])
try:
    exec(compile(open("candidate.py").read(), "candidate.py", "exec"), namespace)
except BaseException:
    tests = []
for test in tests:
    try:
        exec(compile(test, "<test>", "exec"), dict(namespace))
        passed += 1
    except BaseException:
        pass
print("SQUID-TESTS", json.dumps(passed))
"""


def _limit_resources() -> None:
    import resource

    # A runaway candidate must not take the machine: 2 GiB of memory, 20 s of CPU.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (20, 20))
    os.nice(10)


def run_tests_sandboxed(code: str, context: RewardContext) -> float | None:
    """The share of the context's tests that pass with `code` in place, in a temporary copy.

    None when the context has no tests. The user's workspace is never written: the files are copied
    into a fresh temporary directory that is removed afterwards.
    """
    total = len(context.test_asserts)
    if not total and not context.test_files:
        return None
    with tempfile.TemporaryDirectory(prefix="squid-reward-") as tmp:
        root = Path(tmp)
        try:
            for rel, text in {**context.files, **context.test_files}.items():
                _write_inside(root, rel, text)
            _write_inside(root, context.target_path, code)
        except ValueError as exc:
            # A recorded path outside the workspace: the tests cannot be run faithfully.
            log.warning("tests not run: %s", exc)
            return None
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", "HOME": tmp}
        if context.test_asserts:
            _write_inside(root, "candidate.py", code)
            cmd = [sys.executable, "-I", "-c", _ASSERT_HARNESS, json.dumps(list(context.test_asserts))]
        else:
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *context.test_files]
        from agent.contain import Limits, contained_command, isolation, limited_processes

        # Model-written code: no network and the home folder hidden too, where this machine can
        # (agent.contain); the limits above hold either way.
        limits = Limits(cpu_s=20, memory_bytes=2 << 30)
        cmd = contained_command(cmd, root, root, isolation().kind, limits)
        try:
            with limited_processes(cmd, limits.processes) as cmd:
                proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                                      timeout=context.timeout_s, preexec_fn=_limit_resources)
        except subprocess.TimeoutExpired:
            return 0.0
    if context.test_asserts:
        found = re.search(r"SQUID-TESTS (\d+)", proc.stdout)
        return int(found.group(1)) / total if found else 0.0
    return _pytest_share(proc.stdout)


def _pytest_share(output: str) -> float:
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|error|errors)", output)}
    passed = counts.get("passed", 0)
    total = passed + counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return passed / total if total else 0.0


def _write_inside(root: Path, rel: str, text: str) -> None:
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError(f"sandbox path {rel!r} leaves the sandbox")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def similarity(a: str, b: str) -> float:
    """Similarity in [0, 1] of two code texts, ignoring blank lines and trailing spaces."""
    def norm(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines() if line.strip())[
            :SIMILARITY_CHARS
        ]

    left, right = norm(a), norm(b)
    if not left and not right:
        return 1.0
    return difflib.SequenceMatcher(None, left, right, autojunk=False).ratio()


def score_output(
    output: str, context: RewardContext, weights: RewardWeights = RewardWeights()
) -> RewardBreakdown:
    """The reward of one model output (see the module docstring for the parts)."""
    code, fenced = extract_code(output, context.language)
    if code is None or code.strip() == context.original.strip():
        return RewardBreakdown(0.0, {}, code)
    kept_text, reverted_text = context.kept_text, context.reverted_text
    if context.bare:
        code = textwrap.dedent(code)
        kept_text = textwrap.dedent(kept_text) if kept_text is not None else None
        reverted_text = textwrap.dedent(reverted_text) if reverted_text else reverted_text
        parts: dict[str, float] = {"format": 0.0 if fenced else 1.0}
    else:
        parts = {"format": 1.0 if fenced else 0.5}
    parts["parses"] = 1.0 if parses(code, context.language) else 0.0
    if context.language == "python" and not context.bare:
        # (A completion is a fragment: its names are defined around it, so lint would only count those.)
        errors = lint_errors(code) if parts["parses"] else None
        # Lint only means something for code that parses; a file ruff cannot read scores 0.
        parts["lint"] = 0.0 if errors is None else max(0.0, 1.0 - errors / 4)
    share = run_tests_sandboxed(code, context) if parts["parses"] else None
    if share is not None or context.test_asserts or context.test_files:
        parts["tests"] = share or 0.0
    if kept_text is not None:
        parts["kept"] = similarity(code, kept_text)
    if context.preference is not None and weights.preference > 0:
        parts["preference"] = context.preference(code)
    positive = sum(getattr(weights, name) * value for name, value in parts.items())
    # Parts that could not be checked do not count against the output: rescale to the checked ones.
    available = sum(getattr(weights, name) for name in parts)
    total = positive / available if available else 0.0
    if context.bare and not parts["parses"]:
        # A completion that leaves broken code earns nothing, however close it comes to what was
        # kept: it is the text a user deletes again.
        total = 0.0
    if reverted_text:
        parts["reverted"] = similarity(code, reverted_text)
        total -= weights.reverted * parts["reverted"]
    return RewardBreakdown(max(-1.0, min(1.0, total)), parts, code)
