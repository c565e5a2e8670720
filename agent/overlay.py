"""An in-memory overlay of the workspace: the agent's edits live here until the user applies them.

The base of a file is the editor's unsaved buffer when there is one, else the file on disk. Nothing
in the overlay is written to the workspace; `run_tests` copies it into a temporary folder.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolError
from .sandbox import Workspace

__all__ = ["Overlay", "FileChange", "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 2_000_000


@dataclass(frozen=True)
class FileChange:
    """One file's text before and after the agent's edits."""

    path: Path
    rel: str
    before: str
    after: str


class Overlay:
    """Edited file texts over a base (open buffers, then disk)."""

    def __init__(self, workspace: Workspace, buffers: Mapping[Path, str] | None = None):
        self.workspace = workspace
        self._base: dict[Path, str] = {Path(p).resolve(): t for p, t in (buffers or {}).items()}
        self._edits: dict[Path, str] = {}

    def base_text(self, path: Path) -> str:
        if path in self._base:
            return self._base[path]
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ToolError(f"{self.workspace.rel(path)} is larger than {MAX_FILE_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ToolError(f"{self.workspace.rel(path)} does not exist") from None
        except IsADirectoryError:
            raise ToolError(f"{self.workspace.rel(path)} is a folder, not a file") from None
        except UnicodeDecodeError:
            raise ToolError(f"{self.workspace.rel(path)} is not UTF-8 text") from None
        except OSError as exc:
            raise ToolError(f"cannot read {self.workspace.rel(path)}: {exc.strerror}") from exc
        self._base[path] = text
        return text

    def read(self, path: Path) -> str:
        """The current text of `path` (already resolved through the workspace)."""
        return self._edits[path] if path in self._edits else self.base_text(path)

    def write(self, path: Path, text: str) -> None:
        if path not in self._base:
            try:
                self.base_text(path)
            except ToolError:
                self._base[path] = ""  # a new file
        self._edits[path] = text

    def copy(self) -> Overlay:
        clone = Overlay(self.workspace)
        clone._base = dict(self._base)  # the texts are shared, not re-read; new files stay per copy
        clone._edits = dict(self._edits)
        return clone

    def edited(self) -> dict[Path, str]:
        return dict(self._edits)

    def changes(self) -> list[FileChange]:
        out = []
        for path, after in sorted(self._edits.items()):
            before = self._base.get(path, "")
            if before != after:
                out.append(FileChange(path, self.workspace.rel(path), before, after))
        return out

    def diff(self) -> str:
        """A unified diff of every edited file against its base (empty when nothing changed)."""
        return "".join(unified_diff(c.rel, c.before, c.after) for c in self.changes())


def unified_diff(rel: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{rel}",
        tofile=f"b/{rel}",
    )
    text = ""
    for line in lines:
        text += line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
    return text
