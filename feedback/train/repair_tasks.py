"""Repair tasks the trainer makes from the workspace's own code: put a small bug in, ask the agent
to fix it.

The agent learns the tool format and its repository from its own verified attempts (issue 22): a
task is a function of the workspace that its tests cover, with one plausible one-line bug in it
(`mutations`: a comparison or boolean operator flipped, an off-by-one constant, a condition
inverted, `+` for `-`), kept only when the workspace's tests pass without it and fail with it. The
agent is asked as a developer would ask it: the failing test, the function to fix, the file and the
function's lines; its answer is checked as best-of-K checks a candidate (`verify_candidate`:
format, applies, parses, lints) and then by the tests: the reward (`repair_reward`) pays for each
check passed and for the share of the tests the bug broke that pass again, nothing for tests when
the edit breaks another one.

Tests run as the agent's own test runs do (`agent.sandbox.run_command`: an allowlisted command
with a timeout, contained by `agent.contain`, on a scratch copy of the workspace), never in the
workspace itself. A task belongs to its file (`group`): held-out files are never trained on.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "REPAIR_SOURCE",
    "Mutation",
    "RepairTask",
    "RepairWorkspace",
    "TestOutcome",
    "cached_repair_tasks",
    "mutations",
    "fix_answer",
    "repair_example_reward",
    "repair_examples",
    "repair_reward",
    "repair_step_constraint",
    "repair_tasks",
    "run_tests",
    "workspace_digest",
]

MAX_FILE_BYTES = 200_000
REPAIR_SOURCE = "repair"  # `TrainingExample.verification["source"]` of a repair task
# The tokens an agent step of a repair task may take in training (an edit block of a line or two).
STEP_TOKENS = 96
_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", "build", "dist", ".tox", ".eggs"}
_COMPARE = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
            ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
            ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}
_BINARY = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.FloorDiv: ("//", "/"), ast.Mult: ("*", "+")}
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")
# The tests' weight in the reward; the four checks before them share the rest.
TESTS_WEIGHT = 0.6
CHECK_WEIGHT = (1 - TESTS_WEIGHT) / 4


@dataclass(frozen=True)
class Mutation:
    """One plausible one-line bug: line `line` (0-based) reads `after` instead of `before`."""

    line: int
    before: str
    after: str
    kind: str  # "compare" | "boolean" | "arithmetic" | "constant" | "condition" | "truth"
    function: str  # the enclosing function's qualified name
    span: tuple[int, int]  # the function's lines, 1-based and inclusive


@dataclass(frozen=True)
class RepairTask:
    """A bug put into a workspace file whose tests catch it (`search` stands where `replace` stood)."""

    id: str
    path: str  # relative to the workspace root
    function: str
    span: tuple[int, int]
    line: int  # 1-based: the line the bug is put in
    kind: str
    search: str  # the buggy line
    replace: str  # the line as the repository has it
    test_files: tuple[str, ...]
    failing: tuple[str, ...]  # the test ids the bug makes fail
    instruction: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> RepairTask:
        fields = dict(data)
        fields["span"] = tuple(fields["span"])
        fields["test_files"] = tuple(fields["test_files"])
        fields["failing"] = tuple(fields["failing"])
        return cls(**fields)

    def broken_text(self, original: str) -> str:
        """The file (as the repository has it: `original`) with the bug in it; ValueError when the
        file no longer holds the line the task was made from."""
        lines = original.splitlines(keepends=True)
        index = self.line - 1
        if not 0 <= index < len(lines) or lines[index].rstrip("\r\n") != self.replace:
            raise ValueError(f"{self.path}:{self.line} changed since the task was made")
        lines[index] = self.search + lines[index][len(self.replace) :]
        return "".join(lines)


@dataclass(frozen=True)
class TestOutcome:
    passed: int
    failed: int
    failing: tuple[str, ...]
    timed_out: bool = False
    summary: str = ""


def _byte_slice(line: bytes, start: int, end: int) -> str:
    return line[start:end].decode("utf-8")


def _splice(line: str, start: int, end: int, text: str) -> str:
    """`line` with its bytes [start, end) (ast's columns are UTF-8 offsets) replaced by `text`."""
    raw = line.encode("utf-8")
    return raw[:start].decode("utf-8") + text + raw[end:].decode("utf-8")


def _replace_between(line: str, start: int, end: int, old: str, new: str) -> str | None:
    """`line` with the first `old` (a whole operator) between byte columns start and end made `new`."""
    raw = line.encode("utf-8")
    gap = _byte_slice(raw, start, end)
    pattern = r"(?<![<>=!])" + r"\s+".join(map(re.escape, old.split())) + r"(?![<>=])"
    if old.isalpha() or " " in old:
        pattern = r"\b" + r"\s+".join(map(re.escape, old.split())) + r"\b"
    match = re.search(pattern, gap)
    if match is None:
        return None
    gap = gap[: match.start()] + new + gap[match.end() :]
    return raw[:start].decode("utf-8") + gap + raw[end:].decode("utf-8")


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(tree, "")


def _own_nodes(func) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions or classes defined inside it."""
    stack = list(func.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                stack.append(child)


def _mutate(node: ast.AST, line: str) -> tuple[str, str] | None:
    """(kind, the line with `node` mutated), or None when `node` offers no one-line bug."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        old, new = _COMPARE[type(node.ops[0])]
        mutated = _replace_between(line, node.left.end_col_offset, node.comparators[0].col_offset, old, new)
        return ("compare", mutated) if mutated else None
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        mutated = _replace_between(line, node.values[0].end_col_offset, node.values[1].col_offset, old, new)
        return ("boolean", mutated) if mutated else None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        old, new = _BINARY[type(node.op)]
        mutated = _replace_between(line, node.left.end_col_offset, node.right.col_offset, old, new)
        return ("arithmetic", mutated) if mutated else None
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64:
        raw = line.encode("utf-8")
        if _byte_slice(raw, node.col_offset, node.end_col_offset) != str(node.value):
            return None
        return "constant", _splice(line, node.col_offset, node.end_col_offset, str(node.value + 1))
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        return "truth", _splice(line, node.col_offset, node.end_col_offset, str(not node.value))
    if isinstance(node, ast.If | ast.While) and node.test.lineno == node.lineno == node.test.end_lineno:
        raw = line.encode("utf-8")
        test = _byte_slice(raw, node.test.col_offset, node.test.end_col_offset)
        if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            inverted = _byte_slice(raw, node.test.operand.col_offset, node.test.operand.end_col_offset)
        elif isinstance(node.test, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
            inverted = f"not {test}"
        elif isinstance(node.test, ast.BoolOp):
            inverted = f"not ({test})"
        else:
            return None  # a comparison: flipping its operator is the bug to make
        return "condition", _splice(line, node.test.col_offset, node.test.end_col_offset, inverted)
    return None


def mutations(source: str) -> list[Mutation]:
    """Every one-line bug `_mutate` can put into the functions of `source`, in source order; a
    mutated line that stands elsewhere in the file too is left out (a search for it would be
    ambiguous), and so is one that no longer parses."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    found: dict[tuple[int, str], Mutation] = {}
    for name, func in _functions(tree):
        span = (func.lineno, func.end_lineno or func.lineno)
        body_start = func.body[0].lineno
        for node in _own_nodes(func):
            lineno = getattr(node, "lineno", None)
            if lineno is None or lineno < body_start or getattr(node, "end_lineno", lineno) != lineno:
                if not isinstance(node, ast.If | ast.While):
                    continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            before = lines[node.lineno - 1]
            result = _mutate(node, before)
            if result is None or result[1] == before or counts.get(result[1]):
                continue
            kind, after = result
            try:
                ast.parse("\n".join([*lines[: node.lineno - 1], after, *lines[node.lineno :]]))
            except SyntaxError:
                continue
            mutation = Mutation(node.lineno - 1, before, after, kind, name, span)
            found.setdefault((mutation.line, after), mutation)
    return sorted(found.values(), key=lambda m: (m.line, m.after))


# -- running the tests ------------------------------------------------------------------------------


def _listed(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / name for name in sorted(filenames))
    return files


class RepairWorkspace:
    """A scratch copy of a workspace to run its tests in, with one file at a time replaced."""

    def __init__(self, root: Path, timeout_s: float = 60.0):
        self.root = Path(root).resolve()
        self.timeout_s = timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="squid-repair-")
        self.scratch = Path(self._tmp.name) / self.root.name
        shutil.copytree(self.root, self.scratch, symlinks=True,
                        ignore=shutil.ignore_patterns(*_SKIP_DIRS, "*.pyc"))

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> RepairWorkspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, test_files: Sequence[str], replaced: dict[str, str] | None = None,
            stop_first: bool = False) -> TestOutcome:
        """The tests in `test_files` with the files in `replaced` (relative path -> text) swapped in."""
        saved = {}
        try:
            for rel, text in (replaced or {}).items():
                path = self.scratch / rel
                saved[rel] = path.read_text(encoding="utf-8")
                path.write_text(text, encoding="utf-8")
            return run_tests(self.scratch, test_files, self.timeout_s, stop_first=stop_first)
        finally:
            for rel, text in saved.items():
                (self.scratch / rel).write_text(text, encoding="utf-8")


def run_tests(root: Path, test_files: Sequence[str], timeout_s: float, stop_first: bool = False,
              allow_unisolated: bool = False) -> TestOutcome:
    """pytest over `test_files` in `root` (a scratch copy), as the agent's test runs run it
    (allowlisted, with a timeout, contained: `agent.contain`); the counts of passed and failed
    tests and the ids that failed."""
    from agent.sandbox import run_command
    from agent.tools.tests import python_path

    argv = ["python", "-m", "pytest", "-q", "-rfE", "--tb=no", "-p", "no:cacheprovider", "--color=no",
            *(["-x"] if stop_first else []), *test_files]
    env = {"PYTHONPATH": python_path(root), "PYTHONDONTWRITEBYTECODE": "1"}
    result = run_command(argv, root, timeout_s=timeout_s, max_output_bytes=2_000_000, env=env, contain=root,
                         allow_unisolated=allow_unisolated)
    output = result.output or ""
    counts = {"passed": 0, "failed": 0, "error": 0}
    for number, what in _COUNT.findall(output[-2000:]):
        counts["error" if what.startswith("error") else what] = int(number)
    failing = tuple(dict.fromkeys(_FAILED.findall(output)))
    failed = counts["failed"] + counts["error"]
    if result.timed_out or result.returncode is None:
        return TestOutcome(counts["passed"], max(failed, 1), failing, True, "timed out")
    if result.returncode != 0 and not failed:
        # Collection failed, an import error, no tests, or the run died before pytest's summary (a
        # test that ends the interpreter, a container that could not start): nothing passed.
        why = f"pytest exited with {result.returncode}"
        return TestOutcome(0, 1, failing or ("<collection>",), False, why)
    summary = f"{failed} failed, {counts['passed']} passed"
    return TestOutcome(counts["passed"], failed, failing, False, summary)


# -- making the tasks -------------------------------------------------------------------------------


def _is_test_file(rel: Path) -> bool:
    return rel.name.startswith("test_") or rel.name.endswith("_test.py") or "tests" in rel.parts[:-1] \
        or rel.name == "conftest.py"


def _covering_tests(module: Path, tests: dict[str, str]) -> tuple[str, ...]:
    """The test files that name `module` (its stem as a word, or its package path)."""
    word = re.compile(rf"\b{re.escape(module.stem)}\b")
    return tuple(rel for rel, text in tests.items() if word.search(text))


def _instruction(task_path: str, function: str, failing: Sequence[str]) -> str:
    name = failing[0] if failing else "a test"
    more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
    return f"{name} fails{more}. Fix the bug in `{function}` in {task_path}."


def repair_tasks(
    root: Path, *, per_file: int = 3, max_tasks: int = 40, seed: int = 0, timeout_s: float = 60.0,
    files: Sequence[str] | None = None, attempts_per_task: int = 4,
) -> list[RepairTask]:
    """Up to `max_tasks` repair tasks in the workspace at `root`, at most `per_file` per file.

    A mutation becomes a task when the test files that name its module pass without it and fail
    with it. Mutations are tried in a seeded random order, at most `attempts_per_task` tries per
    task wanted from a file; `files` limits the source files (relative paths).
    """
    root = Path(root).resolve()
    rng = random.Random(seed)
    sources, tests = {}, {}
    for path in _listed(root):
        rel = path.relative_to(root)
        if path.suffix != ".py" or path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        (tests if _is_test_file(rel) else sources)[rel.as_posix()] = text
    if files is not None:
        sources = {rel: text for rel, text in sources.items() if rel in set(files)}
    tasks: list[RepairTask] = []
    passing: dict[tuple[str, ...], bool] = {}
    with RepairWorkspace(root, timeout_s) as scratch:
        for rel in sorted(sources):
            if len(tasks) >= max_tasks:
                break
            covering = _covering_tests(Path(rel), tests)
            candidates = mutations(sources[rel])
            if not covering or not candidates:
                continue
            if covering not in passing:
                clean = scratch.run(covering)
                passing[covering] = clean.failed == 0 and clean.passed > 0
            if not passing[covering]:
                continue
            rng.shuffle(candidates)
            found = 0
            for mutation in candidates[: per_file * attempts_per_task]:
                if found >= per_file or len(tasks) >= max_tasks:
                    break
                lines = sources[rel].splitlines(keepends=True)
                lines[mutation.line] = mutation.after + lines[mutation.line][len(mutation.before) :]
                broken = "".join(lines)
                outcome = scratch.run(covering, {rel: broken})
                if outcome.timed_out or outcome.failed == 0 or not outcome.failing:
                    continue
                key = f"{rel}\0{mutation.line}\0{mutation.after}".encode()
                tasks.append(RepairTask(
                    id=f"repair-{hashlib.blake2b(key, digest_size=6).hexdigest()}", path=rel,
                    function=mutation.function, span=mutation.span, line=mutation.line + 1,
                    kind=mutation.kind, search=mutation.after, replace=mutation.before, test_files=covering,
                    failing=outcome.failing,
                    instruction=_instruction(rel, mutation.function, outcome.failing),
                ))
                found += 1
    return tasks


def workspace_digest(root: Path) -> str:
    """A digest of the workspace's Python files (paths and contents): what its tasks are made of."""
    root = Path(root).resolve()
    digest = hashlib.sha256()
    for path in _listed(root):
        if path.suffix == ".py" and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            digest.update(f"\0{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()


def cached_repair_tasks(root: Path, cache: Path, **options) -> list[RepairTask]:
    """`repair_tasks(root, **options)`, kept in the JSON file `cache` while the workspace's Python
    files and the options stay the same (making them runs the tests once per candidate bug)."""
    key = hashlib.sha256(f"{workspace_digest(root)}\0{sorted(options.items())}".encode()).hexdigest()
    try:
        saved = json.loads(Path(cache).read_text())
        if saved.get("key") == key:
            return [RepairTask.from_json(t) for t in saved["tasks"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: made again
    tasks = repair_tasks(root, **options)
    cache = Path(cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "tasks": [t.to_json() for t in tasks]}))
    os.replace(tmp, cache)
    return tasks


# -- the reward -------------------------------------------------------------------------------------


@dataclass
class RepairVerdict:
    checks: dict[str, bool | None]
    tests: TestOutcome | None = None
    fixed: float = 0.0  # the share of the tests the bug broke that pass again
    reward: float = 0.0
    detail: str = ""
    answer_files: dict[str, str] = field(default_factory=dict)


def repair_reward(task: RepairTask, answer: str, workspace: RepairWorkspace, original: str) -> RepairVerdict:
    """Score the agent's answer to `task` in `workspace` (a scratch copy of the repository, holding
    `original` at `task.path`): each check of `verify_candidate` passed is worth `CHECK_WEIGHT`; a
    clean edit then earns `TESTS_WEIGHT` times the share of `task.failing` that pass again, and
    nothing for the tests when another test now fails or when it edits a test file."""
    from agent.best_of_k import verify_candidate
    from agent.overlay import Overlay
    from agent.protocol import parse_action
    from agent.sandbox import Workspace
    from agent.tools import ToolContext
    from context.config import AgentConfig

    broken = task.broken_text(original)
    workspace_root = workspace.scratch
    (workspace_root / task.path).write_text(broken, encoding="utf-8")
    try:
        sandbox = Workspace([workspace_root])
        overlay = Overlay(sandbox)
        ctx = ToolContext(sandbox, overlay, AgentConfig())
        action = parse_action(answer, default_path=task.path)
        candidate = verify_candidate(ctx, action, answer, 0.0, run_tests=False)
    finally:
        (workspace_root / task.path).write_text(original, encoding="utf-8")
    checks = dict(candidate.checks)
    reward = CHECK_WEIGHT * sum(bool(checks.get(name)) for name in ("format", "applies", "parse", "lint"))
    verdict = RepairVerdict(checks, reward=reward, detail=candidate.detail or "")
    if not checks.get("lint"):
        return verdict
    edited = {change.rel: change.after for change in candidate.changes}
    if any(_is_test_file(Path(rel)) for rel in edited):
        # Passing tests it rewrote is not a fix (a sample of a GRPO run edited the test file).
        checks["tests"] = False
        verdict.detail = "the answer edits the tests"
        return verdict
    outcome = workspace.run(task.test_files, {task.path: broken, **edited})
    still = set(outcome.failing)
    fixed = sum(test not in still for test in task.failing) / len(task.failing)
    broke_other = bool(still - set(task.failing)) or outcome.timed_out
    checks["tests"] = outcome.failed == 0 and not outcome.timed_out
    verdict.tests, verdict.fixed, verdict.answer_files = outcome, fixed, edited
    verdict.reward = reward + (0.0 if broke_other else TESTS_WEIGHT * fixed)
    return verdict


# -- training examples ------------------------------------------------------------------------------


def repair_examples(tasks: Sequence[RepairTask], root: Path, runtime, agent_config=None,
                    created_at: float = 0.0) -> list:
    """`TrainingExample`s of `tasks` (made in the workspace at `root`): each prompted with the
    agent's first step as `squidcode agent` renders it for the local model on the workspace with
    the bug in (`AgentLoop.first_conversation`: instructions, tools, the file's window, the task
    and the pre-test run's report), documents in the prompt text."""
    from agent.backends import LocalBackend
    from agent.loop import AgentLoop, AgentRequest
    from agent.sandbox import Workspace
    from context.config import AgentConfig

    from .dataset import TrainingExample

    root = Path(root).resolve()
    config = agent_config or AgentConfig(memory=False)
    backend = LocalBackend(runtime)
    examples = []
    with tempfile.TemporaryDirectory(prefix="squid-repair-prompt-") as tmp:
        work = Path(tmp) / root.name
        shutil.copytree(root, work, symlinks=True, ignore=shutil.ignore_patterns(*_SKIP_DIRS, "*.pyc"))
        for task in tasks:
            original = (root / task.path).read_text(encoding="utf-8")
            try:
                (work / task.path).write_text(task.broken_text(original), encoding="utf-8")
            except ValueError:
                continue  # the file changed since the task was made
            try:
                loop = AgentLoop(backend, Workspace([work]), config)
                conversation = loop.first_conversation(AgentRequest(task.instruction, work / task.path,
                                                                    line_range=task.span))
            finally:
                (work / task.path).write_text(original, encoding="utf-8")
            examples.append(TrainingExample(
                id=task.id, created_at=created_at, instruction=task.instruction, original=original,
                kept_text=task.replace, language="python", group=task.path,
                chat_prompt=backend.prompt(conversation),
                verification={"source": REPAIR_SOURCE, "root": str(root), "task": task.to_json(),
                              "max_tokens": STEP_TOKENS, "guide": fix_answer(task),
                              "copy_search": config.copy_search},
            ))
    return examples


def repair_step_constraint(example, vocabulary: Callable[[], dict[str, list[int]]]):
    """How the local backend decodes the agent's step for a repair example: with `agent.copy_search`
    (as the example was made), an edit block of the task's file copies its search text from the file
    with the bug in, starting among the function's lines (`agent.copy_search.EditCopy`); None
    without. Training samples decoded so are the answers the agent gives. `vocabulary` makes the
    token ids by text (`copy_search.copy_vocabulary`), called only when there is a copy to make."""
    from agent.copy_search import EditCopy

    if example.verification.get("source") != REPAIR_SOURCE or not example.verification.get("copy_search"):
        return None
    task = RepairTask.from_json(example.verification["task"])
    try:
        broken = task.broken_text(example.original)
    except ValueError:
        return None
    return EditCopy(task.path, broken, vocabulary(), tuple(task.span))


def fix_answer(task: RepairTask) -> str:
    """The repository's own fix as the agent's answer: one edit block in the text protocol."""
    return (f"```edit {task.path}\n<<<<<<< SEARCH\n{task.search}\n=======\n{task.replace}\n"
            ">>>>>>> REPLACE\n```")


_SCRATCH: dict[str, RepairWorkspace] = {}


def repair_example_reward(text: str, example) -> float:
    """The reward of an agent step's answer `text` for a repair example (`repair_reward` in a
    scratch copy of its workspace, one per workspace for the process)."""
    task = RepairTask.from_json(example.verification["task"])
    root = example.verification["root"]
    scratch = _SCRATCH.get(root)
    if scratch is None:
        scratch = _SCRATCH[root] = RepairWorkspace(Path(root))
    return repair_reward(task, text, scratch, example.original).reward
