"""A %-format expression converted by hand goes on at the next one (`context.format_repeat`), in the
style the developer's own conversion shows; through `context.next_edit.predict` as a user types it."""

from __future__ import annotations

import pytest

from context.format_repeat import Style, conversion_of, convert, percent_expressions
from context.next_edit import EditHistory, predict


def converted(source: str, style: Style) -> str | None:
    (expression,) = percent_expressions(source)
    return convert(expression, style)


@pytest.mark.parametrize(("source", "format_style", "fstring"), [
    ('"Status for %s" % config.path', '"Status for {}".format(config.path)', 'f"Status for {config.path}"'),
    ('"%s: %r" % (key, value)', '"{}: {!r}".format(key, value)', 'f"{key}: {value!r}"'),
    ('"%02d:%02d" % (h, m)', '"{:02}:{:02}".format(h, m)', 'f"{h:02}:{m:02}"'),
    ('"%.2f%%" % ratio', '"{:.2f}%".format(ratio)', 'f"{ratio:.2f}%"'),
    ('"%5s|" % name', '"{:>5}|".format(name)', 'f"{name:>5}|"'),
    ('"{%s}" % (x,)', '"{{{}}}".format(x)', 'f"{{{x}}}"'),
    ('"[%s]" % "|".join(items)', '"[{}]".format("|".join(items))', "f\"[{'|'.join(items)}]\""),
    ('"FOO:[%s]" % (foo * 2)', '"FOO:[{}]".format(foo * 2)', 'f"FOO:[{foo * 2}]"'),
])
def test_each_spec_converts_to_what_it_means(source, format_style, fstring):
    assert converted(source, Style(fstring=False)) == format_style
    assert converted(source, Style(fstring=True)) == fstring


@pytest.mark.parametrize("source", [
    '"%(name)s" % data',  # a key: a mapping operand
    '"%*d" % (width, n)',  # a width taken from the operands
    '"%c" % code',
    '"<%d|%d>" % item',  # one operand for two placeholders: a tuple held in a variable
    'b"%s" % data',
    '"%s and %s" % (a,)',
])
def test_what_does_not_convert_faithfully_is_not_converted(source):
    expressions = list(percent_expressions(source))
    assert all(convert(e, Style(fstring)) is None for e in expressions for fstring in (False, True))


def test_an_expression_that_cannot_stand_in_an_fstring_is_left_to_format():
    (expression,) = percent_expressions('"%s" % ("a" + \'b\')')  # both quotes
    assert convert(expression, Style(fstring=True)) is None
    assert convert(expression, Style(fstring=False)) == '"{}".format("a" + \'b\')'


def test_the_style_is_read_from_what_the_developer_wrote():
    assert conversion_of('echo("Count: %d" % count)', 'echo("Count: {:d}".format(count))')[1] == \
        Style(fstring=False, int_spec=True)
    expression, style = conversion_of("return 'Hello %s!' % name", 'return f"Hello {name}!"')
    assert style == Style(fstring=True, double_quotes=True) and expression.operands == ("name",)
    # A conversion this module would not write the same way is not a style to repeat.
    assert conversion_of('write("%44s" % f(x))', 'write(f"{f(x):44}")') is None
    assert conversion_of('x = a % b', 'x = a // b') is None


CODE = '''def greet(name):
    print("Hello %s" % name)  # say "%s" % it


def fail(code, why):
    """Raise "%s" % code."""
    raise ValueError("error %d: %r" % (code, why))


def total(items):
    return "%d items" % len(items)
'''


def type_conversion(history: EditHistory, uri: str, old: str, new: str) -> int:
    """Replace `old` by `new` in the document the way a developer might: the `%s` typed over, the
    operand's `% ` removed and `.format(` typed, as separate edits. The offset after the change."""
    text = history.text(uri)
    at = text.index(old)
    # Three edits on one line, as made by hand: the line before them all is what is compared.
    history.change(uri, at, at + len(old), new[: len(new) // 2] + old[len(old) // 2 :])
    text = history.text(uri)
    end = at + len(new[: len(new) // 2] + old[len(old) // 2 :])
    history.change(uri, at, end, new)
    return at + len(new)


def test_a_conversion_made_by_hand_goes_on_at_the_next_expression_in_code():
    history = EditHistory(burst_s=0.0)  # each change its own edit, as after pauses in typing
    history.open("g.py", CODE)
    cursor = type_conversion(history, "g.py", '"Hello %s" % name', '"Hello {}".format(name)')
    assert len(history.edits("g.py")) == 2
    text = history.text("g.py")
    found = predict(history, "g.py", cursor)
    # Not the comment's nor the docstring's words: the raise, converted the same way.
    expected = '"error {}: {!r}".format(code, why)'
    assert (text[found.start:found.end], found.text) == ('"error %d: %r" % (code, why)', expected)
    assert found.kind == "repeat"
    # Waved off: the one after it.
    after = predict(history, "g.py", cursor, [(found.start, found.end)])
    assert after.text == '"{} items".format(len(items))'


def test_an_fstring_conversion_goes_on_as_fstrings():
    history = EditHistory()
    history.open("g.py", CODE)
    cursor = type_conversion(history, "g.py", '"Hello %s" % name', 'f"Hello {name}"')
    found = predict(history, "g.py", cursor)
    assert found.text == 'f"error {code}: {why!r}"'


def test_outside_python_the_path_repeats_text_only():
    history = EditHistory()
    history.open("g.txt", CODE)
    cursor = type_conversion(history, "g.txt", '"Hello %s" % name', '"Hello {}".format(name)')
    found = predict(history, "g.txt", cursor)
    assert found is None or "format(code" not in found.text


def test_the_same_expression_comes_before_a_nearer_other_one():
    code = ('def a(self):\n    return "<%s %s>" % (self.kind, self.name)\n\n\n'
            'def b(self):\n    return "%s!" % self.name\n\n\n'
            'def c(self):\n    return "<%s %s>" % (self.kind, self.name)\n')
    history = EditHistory()
    history.open("r.py", code)
    cursor = type_conversion(history, "r.py", '"<%s %s>" % (self.kind, self.name)',
                             '"<{} {}>".format(self.kind, self.name)')
    text = history.text("r.py")
    found = predict(history, "r.py", cursor)
    assert found.start == text.index('"<%s') and found.text == '"<{} {}>".format(self.kind, self.name)'


def test_an_expression_with_the_same_neighbours_comes_before_a_nearer_other_one():
    code = ('def sdist(format):\n    click.echo("sdist called %s" % format)\n\n\n'
            'def check(x):\n    assert x, "bad %s" % x\n\n\n'
            'def bdist(format):\n    click.echo("bdist called %s" % format)\n')
    history = EditHistory()
    history.open("c.py", code)
    cursor = type_conversion(history, "c.py", '"sdist called %s" % format',
                             '"sdist called {}".format(format)')
    text = history.text("c.py")
    found = predict(history, "c.py", cursor)
    assert (found.start, found.text) == (text.index('"bdist'), '"bdist called {}".format(format)')
    # Waved off: the nearer one, converted the same way.
    other = predict(history, "c.py", cursor, [(found.start, found.end)])
    assert (other.start, other.text) == (text.index('"bad'), '"bad {}".format(x)')


@pytest.mark.parametrize("source", [
    'x = "a" "%s" % y',  # the literal continues another: `%` formats both
    'x = 2 * "%s" % y',  # `(2 * "%s") % y`
    'x = "%s" % y ** 2',  # formats `y ** 2`
])
def test_a_percent_whose_left_or_right_is_more_than_it_seems_is_no_expression_to_convert(source):
    assert list(percent_expressions(source)) == []
    assert [e.operands for e in percent_expressions('x = "%s" % f(r"a", b)')] == [('f(r"a", b)',)]
