"""Completion tasks the trainer makes from the workspace's own code: hide a statement, ask for it.

The embedded model barely reads cross-file context it is given (issue 22): the tasks here teach it to.
Each task is a position in a real file of the workspace, prompted as the server would prompt it
there, with the statement that stood there as the answer to come close to:

  - the position: the start of a statement's line, at its indentation (the cursor of a developer
    about to write it), in a document that holds the rest of the file and not the statement (what
    the editor holds at that moment); statements of at most `max_lines` lines (what a suggestion
    may hold);
  - the prompt: `ServedPrompt.build`, the server's rule, over that document; the Squid reference
    documents are the ones the server would compose there (`select_definitions` through the index's
    symbols, the same rules, the same order), so training runs through composed caches exactly as
    serving does;
  - the answer: the statement's lines, starting with the indentation (`kept_text`); the reward
    (`feedback.rewards.score_output` for a bare completion) pays for parsing and for coming close
    to it (edit similarity; 1 for an exact match).

Only positions that reading a reference can help are kept: the statement uses a name whose
definition is among the composed references (defined in another file, found through the index), so
the reward pays for using them. A task belongs to its file (`group`): held-out files are never
trained on, and the gate scores the model on them (`split_files`).
"""

from __future__ import annotations

import ast
import hashlib
import keyword
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from context.boundary import cursor_context
from context.config import CompletionConfig, SquidCacheConfig
from context.fim import FimFormat
from context.prompt_record import Codec, ReferenceIdentity, ServedPrompt
from context.squid.keys import token_hash
from context.squid.references import select_definitions

from .dataset import TrainingExample

__all__ = ["Position", "body_positions", "repository_tasks", "split_files", "statement_positions",
           "workspace_tasks"]

COMPLETION_INSTRUCTION = "Continue the code at the cursor."
# Statements whose line starts a block are asked for by their header only.
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMPLETION, _SQUID = CompletionConfig(), SquidCacheConfig()  # the server's defaults


@dataclass(frozen=True)
class Position:
    """A statement of a file that a task hides: its lines [start, end) (0-based)."""

    start: int
    end: int
    indent: str


def statement_positions(text: str, max_lines: int) -> list[Position]:
    """The statements of a Python file that start their own line and span at most `max_lines`
    lines (a compound statement: its header), in file order; [] when the file does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    found: dict[int, Position] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or a bare constant
        start = node.lineno - 1
        if isinstance(node, _COMPOUND):
            body = getattr(node, "body", None) or []
            end = body[0].lineno - 1 if body and body[0].lineno > node.lineno else node.lineno
            if isinstance(node, ast.Try):
                continue  # `try:` alone says nothing about the repository
        else:
            end = node.end_lineno or node.lineno
        line = lines[start] if start < len(lines) else ""
        indent = line[: len(line) - len(line.lstrip())]
        if node.col_offset != len(indent) or not 0 < end - start <= max_lines:
            continue  # `a; b`, or too long for one suggestion
        found.setdefault(start, Position(start, end, indent))
    return [found[k] for k in sorted(found)]


def body_positions(text: str) -> list[Position]:
    """The bodies of a Python file's functions, each whole (docstring included): the cursor of a
    developer about to write a function below its `def` line, in file order; [] when the file does
    not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first, last = node.body[0], node.body[-1]
        start = first.lineno - 1
        line = lines[start] if start < len(lines) else ""
        indent = line[: len(line) - len(line.lstrip())]
        if first.lineno == node.lineno or first.col_offset != len(indent) or not indent:
            continue  # `def f(): return 1`, or a body that shares its line
        found.append(Position(start, last.end_lineno or last.lineno, indent))
    return sorted(found, key=lambda p: p.start)


def _defines(document_text: str, name: str) -> bool:
    """Whether a definition document (`# path:line`, then the definition) defines `name` itself (its
    header's name, not a parameter or a method listed under it), at the top level of its module: a
    method reached through an attribute may be any class's."""
    body = document_text.split("\n", 1)[1] if document_text.startswith("# ") else document_text
    header = next((line for line in body.splitlines()
                   if line.strip() and not line.lstrip().startswith(("@", "#"))), "")
    pattern = rf"(?:async\s+def|def|class)\s+{re.escape(name)}\b|{re.escape(name)}\s*[:=]"
    return re.match(pattern, header) is not None


def repository_tasks(
    files: Iterable[tuple[str, str]], *, symbols: Callable[[list[str], int], list], codec: Codec,
    completion: CompletionConfig = _COMPLETION, squid: SquidCacheConfig = _SQUID,
    roots: Iterable[Path] = (), per_file: int | None = 4, max_tasks: int = 64, seed: int = 0,
    require_reference: bool = True, label: Callable[[str], str] | None = None,
    positions_of: Callable[[str], list[Position]] | None = None, fim: FimFormat | None = None,
) -> list[TrainingExample]:
    """Up to `per_file` tasks from each of `files` ((path, text) pairs of Python files), at most
    `max_tasks` in all, picked at random (`seed`) among the statements a reference can help with
    (all statements without `require_reference`). `symbols` is the index's `symbols_named`.
    `positions_of`: where the tasks may be in a file's text (default: `statement_positions`).
    `fim`: the fill-in-the-middle format the prompts are built in (the text after the cursor too,
    as the server builds them with that `completion.fim`); None: the text before the cursor only.

    `per_file` None spreads the tasks: the files in a random order, one task from each in turn
    until `max_tasks` (as many from a file as that takes when files are few), so that they come
    from all over the workspace and not from its first files by name."""
    rng = random.Random(seed)
    roots = list(roots)

    def make(path: str, text: str, position: Position) -> TrainingExample | None:
        return _task(path, text, position, symbols=symbols, codec=codec, completion=completion, squid=squid,
                     roots=roots, require_reference=require_reference, group=label(path) if label else path,
                     fim=fim)

    def shuffled_positions(text: str) -> list[Position]:
        positions = (statement_positions(text, completion.max_lines) if positions_of is None
                     else positions_of(text))
        rng.shuffle(positions)
        return positions

    if per_file is None:
        return _spread(sorted(files), rng, make, shuffled_positions, max_tasks)
    tasks: list[TrainingExample] = []
    for path, text in sorted(files):
        if len(tasks) >= max_tasks:
            break
        taken = 0
        for position in shuffled_positions(text):
            if taken >= per_file or len(tasks) >= max_tasks:
                break
            task = make(path, text, position)
            if task is not None:
                tasks.append(task)
                taken += 1
    return tasks


def _spread(files: list[tuple[str, str]], rng: random.Random, make, shuffled_positions,
            max_tasks: int) -> list[TrainingExample]:
    """`repository_tasks` with no cap per file: passes over the files in a random order, a task from
    each file a pass; a file's positions are found when it is first visited. A task prompted as an
    earlier one is (a function's body and its first statement, without the text after the cursor
    in the prompt) is the same question, and is left out."""
    rng.shuffle(files)
    tasks: list[TrainingExample] = []
    asked: set = set()
    left: dict[str, list[Position]] = {}
    active = files
    while active and len(tasks) < max_tasks:
        still = []
        for path, text in active:
            if len(tasks) >= max_tasks:
                break
            if path not in left:
                left[path] = shuffled_positions(text)
            queue = left[path]
            task = None
            while queue and task is None:
                task = make(path, text, queue.pop(0))
                if task is not None and (task.prompt_text, task.served.references) in asked:
                    task = None
            if task is not None:
                asked.add((task.prompt_text, task.served.references))
                tasks.append(task)
                if queue:
                    still.append((path, text))
        active = still
    return tasks


def _task(path, text, position: Position, *, symbols, codec, completion, squid, roots,
          require_reference: bool, group: str, fim: FimFormat | None = None) -> TrainingExample | None:
    lines = text.splitlines(keepends=True)
    before = "".join(lines[: position.start])
    hidden = "".join(lines[position.start : position.end]).rstrip("\r\n")
    after = "".join(lines[position.end :])
    if not hidden.strip():
        return None
    # The editor's document while the statement is being written: the cursor on its line, after
    # the indentation, with the rest of the file below.
    document = before + position.indent + "\n" + after
    offset = len(before) + len(position.indent)
    ctx = cursor_context(document, offset, completion.suffix_lines)
    documents = select_definitions(
        current_path=path, prefix_text=ctx.prefix, current_text=document, open_documents={},
        symbols=symbols, max_documents=squid.max_documents, roots=roots)
    code = hidden[len(position.indent):]
    code_names = set(_NAME.findall(re.sub(r"(['\"]).*?\1|#.*", " ", code))) - set(keyword.kwlist)
    helps = any(_defines(doc.text, name) for doc in documents for name in code_names)
    if require_reference and not helps:
        return None
    served = ServedPrompt.build(codec, ctx, completion, fim, after=document[offset:] if fim else "")
    references = tuple(
        ReferenceIdentity(token_hash(ids), doc.source, len(ids), doc.text)
        for doc in documents
        if (ids := codec.encode(doc.text)[: squid.document_tokens])
    )
    if references:
        served = replace(served, references=references, reference_tokens=sum(r.tokens for r in references))
    prompt_text = served.text.rstrip(" \t")
    lead = served.text[len(prompt_text):]
    if not hidden.startswith(lead):
        return None  # the window ends inside the indentation in a way the answer does not start with
    digest = hashlib.sha256(f"{path}\0{position.start}\0{hidden}".encode()).hexdigest()[:16]
    return TrainingExample(
        id=f"repo-{digest}", created_at=0.0,
        instruction=f"{COMPLETION_INSTRUCTION}\n\n```\n{prompt_text}\n```",
        original="", kept_text=hidden, prompt_text=prompt_text, prompt_lead=lead, served=served,
        group=group, verification={"source": "repository", "path": path, "line": position.start + 1,
                                   "references": len(references), "needs_reference": helps},
    )


def split_files(tasks: list[TrainingExample], holdout_fraction: float,
                seed: int = 0) -> tuple[list[TrainingExample], list[TrainingExample]]:
    """(train, held_out): whole files held out, about `holdout_fraction` of the tasks, chosen by a
    seeded hash of the file (stable as files are added), at least one file each way when there are
    two."""
    groups: dict[str, list[TrainingExample]] = {}
    for task in tasks:
        groups.setdefault(task.group, []).append(task)
    if len(groups) < 2 or holdout_fraction <= 0:
        return list(tasks), []
    order = sorted(groups, key=lambda g: hashlib.sha256(f"{seed}\0{g}".encode()).hexdigest())
    want = max(1, round(len(tasks) * holdout_fraction))
    held: list[str] = []
    count = 0
    for group in order[:-1]:
        if count >= want:
            break
        held.append(group)
        count += len(groups[group])
    held_set = set(held)
    return ([t for t in tasks if t.group not in held_set], [t for t in tasks if t.group in held_set])


def workspace_tasks(
    roots: list[Path], codec: Codec, *, index_path: Path | None = None, max_file_bytes: int = 200_000,
    skip: Callable[[str], bool] = lambda path: False, **options,
) -> list[TrainingExample]:
    """`repository_tasks` over the Python files of a workspace, through its index: the server's
    (`context.index.indexer.default_index_path`) brought up to date first, or the one at
    `index_path`; files whose path `skip` is true for are left out. Paths in task groups are
    relative to their root."""
    from context.index.indexer import Indexer, default_index_path
    from context.index.store import IndexStore

    roots = [Path(r).absolute() for r in roots]
    store = IndexStore(index_path or default_index_path(roots))
    try:
        Indexer(roots, store, workers=0).index_all()
        files = []
        rel = {}
        for row in store.all_files():
            if row.language != "python" or row.size > max_file_bytes or skip(row.path):
                continue
            try:
                files.append((row.path, Path(row.path).read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError):
                continue  # gone or not text since it was indexed
            rel[row.path] = row.rel
        return repository_tasks(files, symbols=store.symbols_named, codec=codec, roots=roots,
                                label=lambda path: rel.get(path, path), **options)
    finally:
        store.close()
