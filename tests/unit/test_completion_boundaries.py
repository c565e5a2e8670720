"""Where a suggestion ends: the pure boundary rules, no model involved."""

import pytest

from agent.completion import cursor_context, cut_at_boundary
from context.boundary import leaves_open


def ctx_at_end(text: str, suffix: str = ""):
    return cursor_context(text + suffix, len(text), suffix_lines=8)


def test_mid_line_keeps_only_the_rest_of_the_line():
    ctx = ctx_at_end("total = sum(", ")\nprint(total)")
    assert cut_at_boundary("values)\nprint(1)\n", ctx, max_lines=8) == "values)"


def test_after_a_complete_statement_keeps_one_line():
    ctx = ctx_at_end("x = compute(")
    assert cut_at_boundary("a, b)\ny = 2\n", ctx, max_lines=8) == "a, b)"


def test_block_stops_when_indentation_drops():
    ctx = ctx_at_end("def f(x):\n    ")
    raw = "if x:\n        return 1\n    return 2\ndef g():\n    pass"
    assert cut_at_boundary(raw, ctx, max_lines=8) == "if x:\n        return 1\n    return 2"


def test_block_stops_before_repeating_the_code_after_the_cursor():
    ctx = ctx_at_end("def f(x):\n    ", "\n    return y\n")
    raw = "y = x * 2\n    return y\n"
    assert cut_at_boundary(raw, ctx, max_lines=8) == "y = x * 2"


def test_block_respects_max_lines():
    ctx = ctx_at_end("def f():\n    ")
    raw = "\n".join(f"    a{i} = {i}" for i in range(20)).lstrip()
    assert cut_at_boundary(raw, ctx, max_lines=3).count("\n") == 2


def test_truncated_generation_drops_its_unfinished_last_line():
    ctx = ctx_at_end("def f():\n    ")
    assert cut_at_boundary("a = 1\n    b = fib", ctx, max_lines=8, truncated=True) == "a = 1"


def test_echo_of_the_previous_line_is_dropped():
    ctx = ctx_at_end("def fibonacci(n):\n")
    raw = "def fibonacci(n):\n    if n < 2:\n        return n"
    assert cut_at_boundary(raw, ctx, max_lines=8) == "    if n < 2:\n        return n"


def test_two_blank_lines_end_a_block():
    ctx = ctx_at_end("class A:\n    ")
    assert cut_at_boundary("x = 1\n\n\ndef other():", ctx, max_lines=8) == "x = 1"


def test_cursor_context_reads_lines_around_the_cursor():
    text = "a\nbc|de\nf\ng\n"
    ctx = cursor_context(text.replace("|", ""), text.index("|"), suffix_lines=1)
    assert (ctx.line_prefix, ctx.line_suffix, ctx.following_lines) == ("bc", "de", ("f",))


@pytest.mark.parametrize(
    ("text", "language", "open_"),
    [
        ('"""Set the second sequence to be compared.', "python", True),
        ('"""Summary."""\nreturn x', "python", False),
        ("return f(a, [b", "python", True),
        ("return f(a, b)", "python", False),
        ("return a)", "python", False),  # closes something opened before the completion
        ("x = \"it's\"", "python", False),
        ("# don't\nreturn 1", "python", False),
        ('s = "abc', "python", True),
        ('s = "a\\"b"', "python", False),
        ("const s = `a\nb`;", "javascript", False),
        ("// it's\nf(1);", "javascript", False),
        ("if (x) {\n  y();", "javascript", True),
        ("It's a note (see below", "markdown", False),
        ('"""Convert the flags."""\nfor item in fromlist:', "python", True),  # a block with no body
        ("if x:  # why\n", "python", True),
        ("if x:\n    y = d[1:]", "python", False),
        ("d = {'a':", "python", True),  # open anyway: the brace
        ("x = 'a:'", "python", False),
        ("case 1:", "javascript", False),  # Python's rule only
    ],
)
def test_leaves_open(text, language, open_):
    assert leaves_open(text, language) is open_
