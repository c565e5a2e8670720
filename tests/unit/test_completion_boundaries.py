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


# What decided the end (`boundary_cut`): the trainer keeps those characters' tokens in the loss.

def test_a_dedent_decides_the_end_at_the_dedented_lines_first_character():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("def f(x):\n    ")
    raw = "return x + 1\n\ndef g():\n    pass"
    cut = boundary_cut(raw, ctx, max_lines=8)
    assert cut.text == "return x + 1"
    assert raw[: cut.decided] == "return x + 1\n\nd"


def test_a_second_blank_line_decides_the_end_at_its_line_break():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("def f(x):\n    ")
    raw = "y = x * 2\n\n\n    z = y"
    cut = boundary_cut(raw, ctx, max_lines=8)
    assert cut.text == "y = x * 2" and raw[: cut.decided] == "y = x * 2\n\n\n"


def test_repeating_the_code_after_the_cursor_decides_the_end_at_that_lines_end():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("def f(x):\n    ", "\n    return y\n")
    raw = "y = x\n    return y\n    print(y)"
    cut = boundary_cut(raw, ctx, max_lines=8)
    assert cut.text == "y = x" and raw[: cut.decided] == "y = x\n    return y"


def test_a_line_only_suggestion_is_decided_by_its_line_break():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("total = sum(", ")\nprint(total)")
    cut = boundary_cut("values)\nprint(1)", ctx, max_lines=8)
    assert cut.text == "values)" and cut.decided == len("values)\n")
    # Without a line break it ended where the model stopped (its end-of-sequence token), unless
    # tokens ran out: then nothing of the model's decided it.
    assert boundary_cut("values)", ctx, max_lines=8).decided == len("values)")
    assert boundary_cut("values)", ctx, max_lines=8, truncated=True).decided is None


def test_the_line_limit_and_running_out_of_tokens_are_no_decision_of_the_model():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("def f(x):\n    ")
    limited = boundary_cut("a = 1\n    b = 2\n    c = 3\n", ctx, max_lines=2)
    assert limited.text == "a = 1\n    b = 2" and limited.decided is None
    # The unfinished last line dropped: the budget ended it, not the model.
    ran_out = boundary_cut("a = 1\n    b = comp", ctx, max_lines=8, truncated=True)
    assert ran_out.text == "a = 1" and ran_out.decided is None
    # The same text ended by the model's end-of-sequence token: all of it decided the end.
    ended = boundary_cut("a = 1\n    b = 2", ctx, max_lines=8)
    assert ended.text == "a = 1\n    b = 2" and ended.decided == len("a = 1\n    b = 2")


def test_a_leading_blank_line_and_an_echo_dropped_keep_the_offsets_in_the_raw_text():
    from context.boundary import boundary_cut

    ctx = ctx_at_end("def f(x):\n    y = x\n    ")
    raw = "\ny = x\n    return y\nprint(f(1))"
    cut = boundary_cut(raw, ctx, max_lines=8)
    assert cut.text == "    return y" and raw[: cut.decided] == "\ny = x\n    return y\np"


METHOD = ("class Matcher:\n    def set_seq2(self, b):\n        ",
          "\n        if b is self.b:\n            return\n")


@pytest.mark.parametrize(("raw", "shown"), [
    # The summary on the opening line, a blank line after it: closed on that line.
    ('"""Set the second sequence.\n\n        The first is\n        kept as',
     '"""Set the second sequence."""'),
    # A summary of two lines ending a sentence, then the tokens ran out: the quotes on a line of their own.
    ('"""Set the second sequence to b, and clear\n        the caches that depend on it.\n        The fir',
     '"""Set the second sequence to b, and clear\n        the caches that depend on it.\n        """'),
    # The summary on the line after the quotes, the model's own indentation kept.
    ("'''\n            Sets the second sequence.\n\n            This is a special case of set_seqs() that",
     "'''\n            Sets the second sequence.\n        '''"),
    ('r"""Match b\\s. And more.\n\n        Args:\n            b: the', 'r"""Match b\\s. And more."""'),
    # A field list right after the summary ends it, as a blank line does.
    ('"""\n        Set the second sequence\n        :param b: the sequence.\n        :retu',
     '"""\n        Set the second sequence\n        """'),
])
def test_a_docstring_the_budget_cut_is_offered_as_its_summary_closed(raw, shown):
    from context.boundary import suggestion

    ctx = ctx_at_end(*METHOD)
    offered = suggestion(raw, ctx, max_lines=8, truncated=True, language="python")
    assert offered == shown and not leaves_open(offered)
    # The budget ran out inside the docstring, then the tokens to finish it too: the same.
    assert suggestion(raw[:12], ctx, 8, True, "python", finish=lambda: (raw, True)) == shown


@pytest.mark.parametrize("raw", [
    '"""Set the second sequence to b, and clear\n        the caches that depend on',  # no complete summary
    '"""Return the value of self.',  # one line the budget cut: "self." is no sentence's end
    '"""\n\n',  # no summary at all
    '"""\n        :param url: URL for the new object.\n        :param data: D',  # its fields first
    'b = list(b)\n        """Not a docstring: code came first.\n\n        More',
    '"""' + "".join(f"\n        Line {i} of a summary that goes on" for i in range(9)) + ".\n\n        x",
])
def test_no_complete_summary_no_docstring_or_too_long_is_not_offered(raw):
    from context.boundary import suggestion

    ctx = ctx_at_end(*METHOD)
    assert suggestion(raw, ctx, max_lines=8, truncated=True, language="python") in ("", "b = list(b)")
    # Other languages' strings are cut back as before; prose is not code.
    assert suggestion(raw, ctx, max_lines=8, truncated=True, language="javascript") in ("", "b = list(b)")


def test_the_trainer_masks_after_the_part_of_a_summary_the_model_wrote():
    from feedback.train.policy import _shown_end

    generated = '"""Set the second sequence.\n\n        The first is'
    assert _shown_end(generated, '"""Set the second sequence."""') == len('"""Set the second sequence.')
    assert _shown_end("\n    x = 1\n", "x = 1") == len("\n    x = 1")
    assert _shown_end("anything", "") == 0
