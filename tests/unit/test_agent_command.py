"""The agent command's pure parts: argument validation and the WorkspaceEdit built from a change."""

from __future__ import annotations

from pathlib import Path

import pytest
from pygls.exceptions import JsonRpcInvalidParams

from agent.overlay import FileChange
from lsp_server.features.agent_command import _line_edit, parse_arguments, to_lsp_workspace_edit

URI = "file:///ws/calc.py"


def test_arguments_are_validated_and_lines_become_one_based():
    parsed = parse_arguments(
        (
            {
                "instruction": "fix",
                "uri": URI,
                "k": 4,
                "apply": True,
                "workDoneToken": "t",
                "range": {"start": {"line": 3, "character": 0}, "end": {"line": 5, "character": 2}},
            },
        )
    )
    assert parsed == {"instruction": "fix", "uri": URI, "range": (4, 6), "k": 4, "apply": True, "token": "t"}
    for bad in (
        (),
        ({"uri": URI},),
        ({"instruction": " ", "uri": URI},),
        ({"instruction": "x", "uri": "a.py"},),
        ({"instruction": "x", "uri": URI, "k": 0},),
        ({"instruction": "x", "uri": URI, "k": True},),
        ({"instruction": "x", "uri": URI, "apply": "yes"},),
        ({"instruction": "x", "uri": URI, "range": {"start": {"line": 5}, "end": {"line": 2}}},),
        ({"instruction": "x", "uri": URI, "workDoneToken": [1]},),
        ("not an object",),
    ):
        with pytest.raises(JsonRpcInvalidParams):
            parse_arguments(bad)


def test_the_edit_replaces_only_the_changed_lines():
    edit = _line_edit("a\nb\nc\nd\n", "a\nB\nB2\nc\nd\n")
    assert (edit.range.start.line, edit.range.end.line, edit.new_text) == (1, 2, "B\nB2\n")
    tail = _line_edit("a\nb", "a\nc")  # no final newline
    assert (tail.range.start.line, tail.range.end.line, tail.new_text) == (1, 2, "c")
    whole = _line_edit("", "new\n")
    assert (whole.range.start.line, whole.range.end.line, whole.new_text) == (0, 0, "new\n")


def test_workspace_edit_uses_the_clients_uri_for_open_files():
    change = FileChange(Path("/ws/calc.py"), "calc.py", "x = 1\n", "x = 2\n")
    edit = to_lsp_workspace_edit([change], {Path("/ws/calc.py"): URI})
    assert list(edit.changes) == [URI] and edit.changes[URI][0].new_text == "x = 2\n"
    assert to_lsp_workspace_edit([], {}) is None
