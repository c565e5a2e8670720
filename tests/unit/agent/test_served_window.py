"""The window of text before the cursor that a completion server is sent: bounded, from a line's
start, and with a start that holds while the developer types (the server's prompt cache is a
matching prefix, so a start that moved would make it read the whole window again)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from agent.completion import _WINDOW_STEPS, _server_window


def test_a_short_prefix_is_sent_whole():
    assert _server_window("import os\n\ndef f(", 4096) == "import os\n\ndef f("


def test_typing_moves_the_windows_start_once_a_quarter_of_it_not_once_a_line():
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    chars = 1024
    cursor = 20_000
    starts, windows = [], []
    for typed in range(2_000):  # two thousand keystrokes of real code at the end of the prefix
        prefix = text[: cursor + typed]
        window = _server_window(prefix, chars)
        assert prefix.endswith(window) and chars * 3 // 4 - 200 <= len(window) <= chars
        start = len(prefix) - len(window)
        assert prefix[start - 1] == "\n"  # from a line's start
        starts.append(start)
        windows.append(window)
    moves = sum(1 for a, b in zip(starts, starts[1:], strict=False) if a != b)
    lines_typed = text[cursor: cursor + 2_000].count("\n")
    assert moves <= 2_000 // (chars // _WINDOW_STEPS) + 1 < lines_typed // 4, (moves, lines_typed)
    # Between moves, each keystroke's window is the last one with the typed character added.
    same = [(a, b) for a, b, s, t in zip(windows, windows[1:], starts, starts[1:], strict=False) if s == t]
    assert same and all(b == a + b[-1] for a, b in same)
