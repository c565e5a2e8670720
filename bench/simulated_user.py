"""A simulated user, for the learning-loop benchmark: clearly a simulation, never the product.

It works on a copy of a few standard-library modules (the Python Software Foundation's code, under
the PSF licence that ships with every Python). Its tasks are *spots*: a function whose body it is
about to write, with the cursor on the empty first line of the body. It asks for an inline
completion there, accepts what it is shown (typing it in, then the accept command, as an editor
does) and then judges it by a fixed, hidden preference. There are two users (`USERS`):

`docstring`, a user who documents every function first:
- **revert** (undo: the inserted text is deleted again) when the file no longer parses with it;
- **keep** when it parses and opens with a docstring in the project's style (triple double quotes);
- **modify** otherwise: it types the function's real summary line as a docstring above the code.

`oneline`, a user who writes a body a line at a time and reads each suggestion before taking the
next (the way of working that full-line completion is built for): a preference about the shape of
a suggestion, not its content, so it shares nothing with the first user's:
- **revert** when the file no longer parses with it;
- **keep** when it is a single line of code;
- **modify** when it spans lines: it deletes every line after the first, keeping that one when the
  file still parses with it alone (and reverts otherwise).

Each preference was fixed before any measurement and never tuned to the model. A model can learn
either from outputs alone: for the first, kept and modified code opens with a docstring and reverted
code is unfinished; for the second, what stands after a modify is the suggestion's first line.
Every decision reaches the server as `didChange` edits, so the feedback recorder sees what it would
see from a person.
"""

from __future__ import annotations

import ast
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Decision", "Spot", "copy_modules", "decide", "find_spots", "HELD_OUT_MODULES",
           "TRAINING_MODULES", "UNTOUCHED_MODULES", "USERS"]

# Spots for training sessions come from these modules, held-out spots from the others: the model
# is measured on files it was never trained on.
TRAINING_MODULES = ("textwrap.py", "shlex.py", "heapq.py", "fnmatch.py", "colorsys.py", "bisect.py",
                    "glob.py", "base64.py", "quopri.py", "gettext.py", "dataclasses.py", "string.py")
HELD_OUT_MODULES = ("statistics.py", "calendar.py", "difflib.py", "fractions.py")
# The rest of the repository: on disk beside the training modules, never worked on and never
# measured. The promotion gate's spots come from files no episode is about, so these are where it
# looks; the held-out modules are opened in the editor without being on disk, so that the gate never
# sees the prompts the keep rate is measured on.
UNTOUCHED_MODULES = ("posixpath.py", "contextlib.py", "queue.py", "graphlib.py")
STYLE_DOCSTRING = '"""'


@dataclass(frozen=True)
class Spot:
    """A function body to write: the buffer is `before + after`, the cursor at the end of `before`."""

    path: str  # relative to the workspace
    name: str
    before: str  # the file up to the cursor: the signature line, then the body's indentation
    after: str  # from the end of the cursor's line to the end of the file, the body removed
    indent: str
    summary: str  # the first line of the function's real docstring: what this user would write

    @property
    def text(self) -> str:
        return self.before + self.after

    @property
    def cursor(self) -> tuple[int, int]:
        lines = self.before.split("\n")
        return len(lines) - 1, len(lines[-1])


@dataclass(frozen=True)
class Decision:
    action: str  # "keep" | "modify" | "revert"
    typed: str = ""  # what a modify types at the start of the inserted text
    # What a modify leaves in place of the inserted text (None: `typed` + the inserted text).
    replacement: str | None = None

    def result(self, inserted: str) -> str:
        """The text that stands where the suggestion was inserted, after this decision."""
        if self.action == "revert":
            return ""
        if self.action == "keep":
            return inserted
        return self.replacement if self.replacement is not None else self.typed + inserted

    def retained(self, inserted: str) -> int:
        """How many characters of the suggestion stay in the file after this decision (the measure
        of accepted-and-retained characters)."""
        if self.action == "revert":
            return 0
        if self.action == "keep" or self.replacement is None:
            return len(inserted)  # kept, or kept with the user's own text typed above it
        same = 0
        for a, b in zip(inserted, self.replacement, strict=False):
            if a != b:
                break
            same += 1
        return same


def copy_modules(target: Path, modules: tuple[str, ...]) -> list[Path]:
    """Copy standard-library modules of the running Python into `target` (with the PSF licence)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in modules:
        source = stdlib / name
        if source.is_file():
            shutil.copyfile(source, target / name)
            copied.append(target / name)
    licence = next((p for p in (stdlib / "LICENSE.txt", stdlib.parent / "LICENSE.txt") if p.is_file()), None)
    if licence is not None:
        shutil.copyfile(licence, target / "LICENSE-PSF.txt")
    return copied


def find_spots(text: str, path: str) -> list[Spot]:
    """The functions of a module that make spots: a docstring and at least one statement after it,
    defined at module level or in a class (not nested in another function)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    spots = []
    for node in _top_functions(tree):
        docstring = ast.get_docstring(node)
        if not docstring or len(node.body) < 2 or node.body[0].lineno == node.lineno:
            continue
        first, last = node.body[0], node.body[-1]
        indent = lines[first.lineno - 1][: first.col_offset]
        if indent.strip():
            continue
        before = "".join(lines[: first.lineno - 1]) + indent
        after = "\n" + "".join(lines[last.end_lineno:])
        summary = docstring.strip().splitlines()[0].strip()
        if summary and '"""' not in summary:
            spots.append(Spot(path, node.name, before, after, indent, summary))
    return spots


def _top_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, ast.FunctionDef))


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def decide(spot: Spot, inserted: str, user: str = "docstring") -> Decision:
    """The hidden preference of `user` (one of `USERS`; see the module docstring)."""
    return USERS[user](spot, inserted)


def _docstring_user(spot: Spot, inserted: str) -> Decision:
    if not parses(spot.before + inserted + spot.after):
        return Decision("revert")
    if inserted.lstrip().startswith(STYLE_DOCSTRING):
        return Decision("keep")
    return Decision("modify", f'"""{spot.summary}"""\n{spot.indent}')


def _oneline_user(spot: Spot, inserted: str) -> Decision:
    if not parses(spot.before + inserted + spot.after):
        return Decision("revert")
    lines = inserted.rstrip().split("\n")
    if len([line for line in lines if line.strip()]) <= 1:
        return Decision("keep")
    first = lines[0].rstrip()
    if first.strip() and parses(spot.before + first + spot.after):
        return Decision("modify", replacement=first)
    return Decision("revert")


USERS = {"docstring": _docstring_user, "oneline": _oneline_user}
