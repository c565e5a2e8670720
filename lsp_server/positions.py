"""LSP positions (line, UTF-16 code units) <-> offsets into a Python string, clamped, never raising.

pygls has its own codec, but it re-splits the whole document on every call and maps a column past
the end of a line to one character *before* the end; completions need the end of the line, and a
20 MB document should not be split into lines per keystroke.
"""

from __future__ import annotations

from lsprotocol import types

__all__ = ["offset_at", "position_at", "utf16_len"]


def utf16_len(text: str) -> int:
    # Characters outside the Basic Multilingual Plane take two UTF-16 code units.
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _line_bounds(text: str, line: int) -> tuple[int, int]:
    """Start and end (before the line break) of `line`, clamped to the last line."""
    start = 0
    for _ in range(max(line, 0)):
        nxt = text.find("\n", start)
        if nxt < 0:
            break
        start = nxt + 1
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    if end > start and text[end - 1] == "\r":
        end -= 1
    return start, end


def offset_at(text: str, position: types.Position, encoding: str = "utf-16") -> int:
    """The string index of an LSP position; lines and columns past the end clamp to the end."""
    last_line = text.count("\n")
    if position.line > last_line:
        return len(text)
    start, end = _line_bounds(text, position.line)
    if encoding == "utf-32":
        return min(start + max(position.character, 0), end)
    units = 0
    index = start
    while index < end and units < position.character:
        units += 2 if ord(text[index]) > 0xFFFF else 1
        index += 1
    return index


def position_at(text: str, offset: int) -> types.Position:
    """The LSP position (UTF-16 columns) of a string index."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return types.Position(line=line, character=utf16_len(text[line_start:offset]))
