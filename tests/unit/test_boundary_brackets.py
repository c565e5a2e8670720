"""Suggestions right after an opening bracket that continue on the next lines (context.boundary)."""

import ast

import pytest

from agent.completion import CompletionRequest, complete
from context.boundary import bracket_at_cursor, cursor_context, leaves_open, may_span_lines, suggestion
from context.config import CompletionConfig


def ctx_at_end(text: str, suffix: str = ""):
    return cursor_context(text + suffix, len(text), suffix_lines=8)


ARGUMENTS = '\n    "--height",\n    type=int,\n    help="Target height.",\n)\nparser.add_argument(\n    "--x"'


def test_an_argument_list_on_the_next_lines_is_offered_up_to_its_closing_line():
    ctx = ctx_at_end('parser.add_argument("--width", type=int)\nparser.add_argument(')
    assert suggestion(ARGUMENTS, ctx, max_lines=8, truncated=True) == (
        '\n    "--height",\n    type=int,\n    help="Target height.",\n)'
    )


def test_a_closing_line_that_also_closes_brackets_before_the_cursor_is_kept_whole():
    ctx = ctx_at_end("total = sum(pick(")
    assert suggestion("\n    values,\n    key))\nprint(total)", ctx, 8, False) == "\n    values,\n    key))"


def test_a_list_literal():
    ctx = ctx_at_end("NAMES = [")
    raw = '\n    "ada",\n    "grace",\n]\n\n\ndef f():\n'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == '\n    "ada",\n    "grace",\n]'


def test_a_dict_literal_is_closed_where_a_block_would_stop_at_the_dedent():
    ctx = ctx_at_end("LIMITS = {")
    raw = '\n    "cpu": 2,\n    "memory": "4G",\n}\nprint(LIMITS)'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == '\n    "cpu": 2,\n    "memory": "4G",\n}'


def test_a_bracket_inside_a_string_does_not_close_the_list():
    ctx = ctx_at_end("parts = [")
    raw = '\n    "a)",\n    "]",\n]'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == raw


def test_a_continuation_that_never_closes_is_not_offered():
    ctx = ctx_at_end("parser.add_argument(")
    assert suggestion('\n    "--height",\n    type=int,\n', ctx, max_lines=8, truncated=False) == ""


def test_a_close_past_max_lines_is_not_offered():
    ctx = ctx_at_end("values = [")
    raw = "\n" + "".join(f"    {i},\n" for i in range(10)) + "]"
    assert suggestion(raw, ctx, max_lines=4, truncated=False) == ""
    assert suggestion(raw, ctx, max_lines=11, truncated=False) == raw


def test_a_line_indented_less_than_the_cursor_ends_the_search():
    ctx = ctx_at_end("def f():\n    call(")
    assert suggestion("\n        a,\nx = 1)", ctx, max_lines=8, truncated=False) == ""


def test_a_continuation_cut_by_the_token_budget_is_finished_then_offered():
    ctx = ctx_at_end("parser.add_argument(")
    raw = '\n    "--height",\n    type=in'
    calls = []

    def finish():
        calls.append(1)
        return raw + 't,\n)\nargs = 1', False

    assert suggestion(raw, ctx, 8, True, "python", finish) == '\n    "--height",\n    type=int,\n)'
    assert calls == [1]
    # Without more tokens nothing closes: not offered.
    assert suggestion(raw, ctx, 8, True, "python", lambda: None) == ""


def test_an_editors_closer_after_the_cursor_is_not_repeated():
    ctx = ctx_at_end("parser.add_argument(", ")\nargs = parser.parse_args()")
    assert bracket_at_cursor(ctx) == "("
    # On a line of its own, the editor's ")" lands where the model's was.
    assert suggestion(ARGUMENTS, ctx, max_lines=8, truncated=True) == (
        '\n    "--height",\n    type=int,\n    help="Target height.",\n'
    )
    # Closed at the end of an argument's line: the suggestion stops before the closer.
    raw = '\n    "--height",\n    type=int)\nargs = 1'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == '\n    "--height",\n    type=int'


def test_lines_that_already_close_the_bracket_below_are_not_repeated():
    text = "parser.add_argument("
    ctx = ctx_at_end(text, '\n    "--width",\n)\nargs = parser.parse_args()')
    raw = '\n    "--height",\n    "--width",\n)\n'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == '\n    "--height",'
    # A ")" indented less than the cursor's line closes an enclosing bracket, not this one.
    inner = ctx_at_end("setup(\n    cmdclass=dict(", "\n)\n")
    assert suggestion("\n        build=Build,\n    )\n)", inner, 8, False) == "\n        build=Build,\n    )"


@pytest.mark.parametrize(
    ("before", "after", "raw", "expected"),
    [
        # Same line: its rest, without the closer the line already holds after the cursor.
        ("total = sum(", ")\nprint(total)", "values)\nprint(1)\n", "values"),
        ("x = compute(", "", "a, b)\ny = 2\n", "a, b)"),
        ("x = f(a, b", ")", "\n)", ""),  # not right after the bracket: the line's rest only
        ("x = f(", ") + g()", "\n    a,\n)", ""),  # code after the cursor: mid-line, one line
    ],
)
def test_other_positions_keep_the_line_rules(before, after, raw, expected):
    ctx = ctx_at_end(before, after)
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == expected


def test_bracket_at_cursor():
    assert bracket_at_cursor(ctx_at_end("f( ")) == "("
    assert bracket_at_cursor(ctx_at_end("x = [", "]")) == "["
    assert bracket_at_cursor(ctx_at_end("f(g(", "))")) == "("
    assert bracket_at_cursor(ctx_at_end("f(", "]")) is None
    assert bracket_at_cursor(ctx_at_end("f(", ") + 1")) is None
    assert bracket_at_cursor(ctx_at_end("f(a")) is None
    # After a comma the list goes on: the innermost bracket the line leaves open.
    assert bracket_at_cursor(ctx_at_end("f(a, [1, 2],")) == "("
    assert bracket_at_cursor(ctx_at_end("x = {'a': g(1),", "}")) == "{"
    assert bracket_at_cursor(ctx_at_end("a, b = 1,")) is None  # no bracket open
    assert bracket_at_cursor(ctx_at_end("f('(',")) == "("  # a bracket inside a string is text
    assert bracket_at_cursor(ctx_at_end("f(a,", ") + 1")) is None


# A parser whose first option spans lines: the model writes the next one the same way.
PARSER = '''import argparse


def build_parser():
    parser = argparse.ArgumentParser(description="Resize images in a folder.")
    parser.add_argument(
        "--width",
        type=int,
        default=800,
        help="Target width in pixels.",
    )
    parser.add_argument('''


@pytest.mark.parametrize("closer", ["", ")"], ids=["typed", "auto-closed"])
def test_the_model_argument_list_on_the_next_lines_is_offered(runtime, closer):
    text = PARSER + closer + "\n    return parser\n"
    completion = complete(runtime, CompletionRequest(text, len(PARSER), "python"), CompletionConfig())
    assert completion is not None and completion.text.startswith("\n") and completion.text.count("\n") >= 2
    assert not leaves_open("(" + completion.text + closer)
    ast.parse(PARSER + completion.text + text[len(PARSER):])  # the file reads as Python once accepted


@pytest.mark.parametrize(
    ("before", "after", "spans"),
    [("f(", "", True), ("f(", ")", True), ("def f():", "", True), ("x = 1", "", False), ("f(a", ")", False)],
)
def test_may_span_lines(before, after, spans):
    assert may_span_lines(ctx_at_end(before, after)) is spans


@pytest.mark.parametrize(("line", "after", "raw", "offered"), [
    ("total = f(", ")", "x)", "x"),  # f(x) -- not f(x))
    ("total = f(", ")", "x) + 1\nmore", "x"),  # its own closer ends what it may insert
    ("total = f(", ")", "g(x), y)", "g(x), y"),  # brackets it opens and closes itself stay
    ("items = [", "]", "1, 2]", "1, 2"),
    ("total = f(", ")", "x", "x"),  # nothing to cut
    ("total = f(", ")", "')'", "')'"),  # a closer inside a string is text
    ("total = f(", "):", "x]", "x]"),  # another bracket's closer: left as the model wrote it
    ("name = ", " # note", "value)", "value)"),  # no closer after the cursor: the rule does not apply
])
def test_inside_brackets_closed_after_the_cursor_the_suggestion_leaves_the_closer_to_the_line(
        line, after, raw, offered):
    ctx = ctx_at_end(line, after)
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == offered


def test_after_a_comma_in_an_open_argument_list_the_next_lines_are_offered_up_to_the_closer():
    ctx = ctx_at_end('parser.add_argument("--width", type=int,')
    raw = '\n    help="Target width.",\n)\nparser.add_argument("--x")'
    assert suggestion(raw, ctx, max_lines=8, truncated=False) == '\n    help="Target width.",\n)'
    # The editor closed it after the cursor: the lines up to the model's closer, without it.
    closed = ctx_at_end('parser.add_argument("--width", type=int,', ")")
    assert suggestion(raw, closed, max_lines=8, truncated=False) == '\n    help="Target width.",\n'
    # On the same line it stays the line's rest.
    assert suggestion(" default=3)\nx = 1", ctx, 8, False) == " default=3)"
