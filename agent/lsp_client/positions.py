"""Paths, URIs, positions and text edits as LSP counts them.

LSP positions are 0-based lines and UTF-16 code units within the line (the encoding every server
supports); the agent's tools speak 1-based lines and Python string indices. A character outside the
Basic Multilingual Plane is one Python index and two UTF-16 units, so the two differ after an emoji.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = [
    "path_to_uri",
    "uri_to_path",
    "utf16_column",
    "python_column",
    "offset_of",
    "TextEdit",
    "apply_text_edits",
    "LANGUAGE_IDS",
    "language_id_for",
]

# File suffix -> the LSP languageId sent with didOpen.
LANGUAGE_IDS = {
    ".py": "python",
    ".pyi": "python",
    ".go": "go",
    ".rs": "rust",
    ".ts": "typescript",
    ".tsx": "typescriptreact",
    ".js": "javascript",
    ".jsx": "javascriptreact",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".lua": "lua",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
}


def language_id_for(path: Path) -> str | None:
    return LANGUAGE_IDS.get(path.suffix.lower())


def path_to_uri(path: Path) -> str:
    return Path(path).resolve().as_uri()


def uri_to_path(uri: str) -> Path:
    parsed = urlparse(uri)
    return Path(unquote(parsed.path))


def utf16_column(line: str, column: int) -> int:
    """The UTF-16 offset of Python index `column` within `line`."""
    prefix = line[:column]
    return column + sum(1 for ch in prefix if ord(ch) > 0xFFFF)


def python_column(line: str, units: int) -> int:
    """The Python index of UTF-16 offset `units` within `line` (clamped to the line's end)."""
    count = 0
    for index, ch in enumerate(line):
        if count >= units:
            return index
        count += 2 if ord(ch) > 0xFFFF else 1
    return len(line)


def offset_of(text: str, line: int, units: int) -> int:
    """The index in `text` of the LSP position (0-based `line`, UTF-16 `units`), clamped to the text."""
    lines = text.split("\n")
    if line >= len(lines):
        return len(text)
    start = sum(len(x) + 1 for x in lines[:line])
    return start + python_column(lines[line].rstrip("\r"), units)


@dataclass(frozen=True)
class TextEdit:
    """One LSP TextEdit: replace the range from (start_line, start_units) to (end_line, end_units)."""

    start_line: int
    start_units: int
    end_line: int
    end_units: int
    new_text: str

    @classmethod
    def from_lsp(cls, raw: dict) -> TextEdit:
        start, end = raw["range"]["start"], raw["range"]["end"]
        return cls(start["line"], start["character"], end["line"], end["character"], raw.get("newText", ""))


def apply_text_edits(text: str, edits: Iterable[TextEdit]) -> str:
    """`text` with `edits` applied; LSP's edits of one document never overlap and refer to the
    original text, so they are applied from the last to the first."""
    spans = sorted(
        (
            (
                offset_of(text, e.start_line, e.start_units),
                offset_of(text, e.end_line, e.end_units),
                e.new_text,
            )
            for e in edits
        ),
        key=lambda span: (span[0], span[1]),
        reverse=True,
    )
    for start, end, new_text in spans:
        text = text[:start] + new_text + text[end:]
    return text
