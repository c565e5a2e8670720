"""The fenced-block text protocol: what parses into which action, and what is refused with a reason."""

from __future__ import annotations

from agent.protocol import Done, ParseFailure, ToolCall, parse_action, render_tool_call


def test_tool_block():
    action = parse_action('thinking...\n```tool\n{"tool": "read_file", "args": {"path": "a.py"}}\n```')
    assert action == ToolCall("read_file", {"path": "a.py"})


def test_json_block_with_a_tool_and_string_arguments():
    action = parse_action('```json\n{"name": "grep", "arguments": "{\\"pattern\\": \\"x\\"}"}\n```')
    assert action == ToolCall("grep", {"pattern": "x"})


def test_edit_block_with_search_replace():
    text = (
        "```edit calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```"
    )
    action = parse_action(text)
    assert action == ToolCall(
        "edit", {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + b"}]}
    )


def test_the_instructions_placeholder_for_the_path_means_the_file_asked_about():
    # The embedded model, trained on the repository's fixes, still wrote "```edit PATH" at times.
    text = "```edit PATH\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n```"
    assert parse_action(text, "pkg/m.py") == ToolCall(
        "edit", {"path": "pkg/m.py", "blocks": [{"search": "x = 1", "replace": "x = 2"}]}
    )
    assert isinstance(parse_action(text), ParseFailure)  # no file asked about: still no file named


def test_markers_without_a_fence_use_the_default_path():
    text = "<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE"
    assert parse_action(text, "m.py") == ToolCall(
        "edit", {"path": "m.py", "blocks": [{"search": "x = 1", "replace": "x = 2"}]}
    )


def test_a_python_block_with_a_definition_is_a_whole_definition_edit():
    action = parse_action("```python\ndef add(a, b):\n    return a + b\n```", "calc.py")
    assert action == ToolCall("edit", {"path": "calc.py", "code": "def add(a, b):\n    return a + b\n"})


def test_done():
    assert parse_action("```done\nall good\n```") == Done("all good")


def test_malformed_answers_say_what_is_wrong():
    cases = {
        "": "empty",
        "I think the bug is in add.": "no fenced",
        '```tool\n{"tool": "read_file", "args": {"path": \n```': "not valid JSON",
        '```tool\n["read_file"]\n```': "must hold",
        '```tool\n{"tool": "read_file", "args": [1]}\n```': "JSON object",
        "```edit\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n```": "names no file",
        "```edit x.py\njust text\n```": "no <<<<<<< SEARCH",
    }
    for text, reason in cases.items():
        action = parse_action(text)
        assert isinstance(action, ParseFailure), text
        assert reason in action.message, (text, action.message)


def test_non_string_input_is_a_failure_not_a_crash():
    assert isinstance(parse_action(None), ParseFailure)  # type: ignore[arg-type]


def test_render_round_trips():
    call = ToolCall("edit", {"path": "a.py", "blocks": [{"search": "x", "replace": "y"}]})
    assert parse_action(render_tool_call(call)) == call
    tool = ToolCall("grep", {"pattern": "foo"})
    assert parse_action(render_tool_call(tool)) == tool
