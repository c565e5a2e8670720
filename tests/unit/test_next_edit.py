"""Next-edit suggestions' deterministic path (`context.next_edit`): typing bursts merged into one
edit, a rename carried to the next occurrence, a repeated change carried to the next place it
fits, never an edit that undoes one the user made."""

from __future__ import annotations

from context.next_edit import EditHistory, predict

CODE = """def report(items):
    total = 0
    for item in items:
        total += item.price
    print(total)
    return total
"""


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def type_over(history: EditHistory, uri: str, start: int, old: str, new: str, clock: Clock) -> None:
    """Select `old` at `start` and type `new` a character at a time, as an editor sends it."""
    history.change(uri, start, start + len(old), new[0])
    for i, char in enumerate(new[1:], start=1):
        clock.now += 0.1
        history.change(uri, start + i, start + i, char)


def typed_in(code: str, uri: str, at: int, text: str) -> EditHistory:
    """A history of `code` open as `uri`, `text` typed at `at` a character at a time."""
    history = EditHistory()
    history.open(uri, code)
    for i, char in enumerate(text):
        history.change(uri, at + i, at + i, char)
    return history


def accepted_lines(history: EditHistory, uri: str, cursor: int, limit: int = 10) -> list[str]:
    """Each next edit accepted in turn from `cursor` (at most `limit`): the line it changed, as it
    reads after it, stripped."""
    lines = []
    while len(lines) < limit and (found := predict(history, uri, cursor)) is not None:
        history.change(uri, found.start, found.end, found.text)
        text = history.text(uri)
        lines.append(text[text.rfind("\n", 0, found.start) + 1:text.find("\n", found.start)].strip())
        cursor = found.start + len(found.text)
    return lines


def test_typing_over_a_name_is_one_edit_and_the_next_occurrence_is_renamed():
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("a.py", CODE)
    first = CODE.index("total")
    type_over(history, "a.py", first, "total", "subtotal", clock)
    (edit,) = history.edits("a.py")  # one edit: the document before the burst against after it
    assert (edit.start, edit.old, edit.new) == (first, "", "sub")
    text = history.text("a.py")
    cursor = first + len("subtotal")
    nxt = predict(history, "a.py", cursor)
    assert nxt.kind == "rename" and text[nxt.start:nxt.end] == "total" and nxt.text == "subtotal"
    assert nxt.start == text.index("total +=")
    # Applying it and asking again walks on to the next one.
    history.change("a.py", nxt.start, nxt.end, "subtotal")
    text = history.text("a.py")
    again = predict(history, "a.py", nxt.start + len("subtotal"))
    assert again is not None and again.start == text.index("total)")


def test_a_name_typed_in_front_of_an_old_one_is_a_rename_too():
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("a.py", CODE)
    at = CODE.index("total")
    for i, char in enumerate("sub"):
        history.change("a.py", at + i, at + i, char)
        clock.now += 0.1
    nxt = predict(history, "a.py", at + 3)
    assert nxt is not None and nxt.kind == "rename" and nxt.text == "subtotal"


def test_an_argument_added_to_a_call_is_offered_at_the_next_same_call():
    code = "fetch(url)\nlog('x')\nfetch(url)\nfetch(other)\n"
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("b.py", code)
    at = code.index(")")
    for i, char in enumerate(", timeout=5"):
        history.change("b.py", at + i, at + i, char)
        clock.now += 0.05
    text = history.text("b.py")
    nxt = predict(history, "b.py", at + len(", timeout=5"))
    assert nxt is not None and nxt.kind == "repeat" and nxt.text == ", timeout=5"
    assert nxt.start == nxt.end == text.index("fetch(url)\nfetch(other)") + len("fetch(url")
    history.change("b.py", nxt.start, nxt.end, nxt.text)
    # `fetch(other)` has other neighbours, and is the next call of that name: the argument goes on
    # there; `log('x')` is another call. Then every `fetch` has it: nothing more to offer.
    text = history.text("b.py")
    last = predict(history, "b.py", nxt.start)
    assert (last.start, last.text) == (text.index("fetch(other)") + len("fetch(other"), ", timeout=5")
    history.change("b.py", last.start, last.end, last.text)
    assert predict(history, "b.py", last.start) is None


def test_an_argument_added_to_a_call_goes_on_at_the_next_call_of_that_name_only():
    code = ("for a, b in zip(expected, click.utils.KeepOpenFile(f)):\n    pass\n"
            "# zip(expected, lf) in a comment\nlf = open(f)\nfor a, b in zip(expected, lf):\n    pass\n"
            "def zip_all(x):\n    return list(x)\n")
    history = EditHistory()
    history.open("z.py", code)
    at = code.index(")):") + 1
    history.change("z.py", at, at, ", strict=False")
    text = history.text("z.py")
    found = predict(history, "z.py", at + len(", strict=False"))
    # Not in the comment, not `open(f)`, not the def: the next call of `zip`.
    place = text.index("zip(expected, lf):") + len("zip(expected, lf")
    assert (found.start, found.end, found.text) == (place, place, ", strict=False")


def test_a_return_annotation_added_goes_on_at_the_next_def_that_returns_nothing():
    # A typing pass (httpx's tests): `-> None` after one test's parameters, then the next test's,
    # though a test further down shares more of the first one's name (`..._cookie():`); not a
    # function that returns a value, nor one that yields, nor one annotated already; a def whose
    # parameters span lines gets it after its closing `)`.
    code = ("async def test_set_cookie():\n    a = 1\n\n\n"
            "def helper(x):\n    return x + 1\n\n\n"
            "def stream():\n    yield 1\n\n\n"
            "def annotated() -> None:\n    pass\n\n\n"
            "async def test_set_cookie_with_cookiejar():\n    b = 2\n\n\n"
            "def test_many(\n    first,\n    second,\n):\n    c = 3\n\n\n"
            "async def test_get_cookie():\n    if c:\n        return\n")
    at = code.index("():") + 2
    history = typed_in(code, "t.py", at, " -> None")
    assert accepted_lines(history, "t.py", at + len(" -> None")) == [
        "async def test_set_cookie_with_cookiejar() -> None:", ") -> None:",
        "async def test_get_cookie() -> None:"]


def test_a_parameter_added_to_a_def_goes_on_at_the_nearest_def_with_the_same_parameters():
    # httpx: `iter_bytes(self)` gains `chunk_size`; the nearest def below with the parameters it had
    # (`iter_text(self)`), though `aiter_bytes(self)` shares more of its name; not `read(self,
    # n)`, nor the call `self.iter_bytes()`, nor a def whose parameters span lines differently.
    code = ("class Response:\n"
            "    def iter_bytes(self) -> Iterator[bytes]:\n        yield from self.iter_raw()\n\n"
            "    def read(self, n):\n        return self.iter_bytes()\n\n"
            "    def iter_text(self) -> Iterator[str]:\n        yield ''\n\n"
            "    async def aiter_bytes(self) -> AsyncIterator[bytes]:\n        yield b''\n")
    history = EditHistory()
    history.open("m.py", code)
    at = code.index("(self)") + len("(self")
    history.change("m.py", at, at, ", chunk_size: int = None")
    text = history.text("m.py")
    found = predict(history, "m.py", at + len(", chunk_size: int = None"))
    place = text.index("iter_text(self") + len("iter_text(self")
    assert (found.start, found.end, found.text) == (place, place, ", chunk_size: int = None")
    history.change("m.py", found.start, found.end, found.text)
    text = history.text("m.py")
    found = predict(history, "m.py", found.start + len(found.text))
    place = text.index("aiter_bytes(self") + len("aiter_bytes(self")
    assert (found.start, found.end, found.text) == (place, place, ", chunk_size: int = None")
    # click: a test's first parameter (a fixture), then the next test that has none
    code = "def test_a():\n    pass\n\n\ndef test_b(x):\n    pass\n\n\ndef test_c():\n    pass\n"
    history = EditHistory()
    history.open("t.py", code)
    at = code.index("test_a(") + len("test_a(")
    history.change("t.py", at, at, "runner")
    found = predict(history, "t.py", at + len("runner"))
    place = history.text("t.py").index("test_c(") + len("test_c(")
    assert (found.start, found.end, found.text) == (place, place, "runner")


def test_a_comment_put_after_a_blocks_header_goes_on_at_the_next_header_of_its_kind():
    # httpx: `  # pragma: nocover` after `async def restart(self) -> None:`, then after the next def
    # below (another name, no annotation), not the def above it, not an `if` header, not a def with
    # a comment of its own; after `except TimeoutException:`, the next `except`.
    code = ("def install(self) -> None:\n    pass\n\n"
            "async def restart(self) -> None:\n    if self.x:\n        pass\n\n"
            "def marked(self):  # noqa\n    pass\n\n"
            "async def watch_restarts(self):\n    try:\n        go()\n"
            "    except TimeoutException:\n        pass\n    except socket.gaierror:\n        pass\n")
    comment = "  # pragma: nocover"
    for header, expected in (("-> None:\n    if", "async def watch_restarts(self):"),
                             ("except TimeoutException:", "    except socket.gaierror:")):
        history = EditHistory()
        history.open("c.py", code)
        at = code.index(header) + (len("-> None:") if header.startswith("->") else len(header))
        history.change("c.py", at, at, comment)
        text = history.text("c.py")
        found = predict(history, "c.py", at + len(comment))
        place = text.index(expected) + len(expected)
        assert (found.start, found.end, found.text) == (place, place, comment)
    # after an import it is that line's own (`# type: ignore`): not carried to the next `from` line
    code = "from a import b\nfrom c import d\n"
    history = EditHistory()
    history.open("c.py", code)
    history.change("c.py", len("from a import b"), len("from a import b"), "  # type: ignore")
    assert predict(history, "c.py", len("from a import b  # type: ignore")) is None


def test_a_parameters_annotation_changed_goes_on_at_that_parameter_of_the_next_def():
    # click: `show_default: bool = False` -> `bool | str` goes on at `show_default: bool = True` of
    # the next def, not at `hide_input: bool = False` (the same neighbours, another parameter);
    # `stream: t.IO` -> `t.IO[t.Any]` at the nearest `stream: t.IO`, before the end of its list.
    code = ("def build(\n    text: str,\n    show_default: bool = False,\n) -> str:\n    pass\n\n\n"
            "def prompt(\n    hide_input: bool = False,\n    show_default: bool = True,\n"
            ") -> None:\n    pass\n\n\n"
            "def best(stream: t.IO) -> str:\n    pass\n\n\n"
            "def is_binary(stream: t.IO, default: bool = False) -> bool:\n    pass\n\n\n"
            "def find(stream: t.IO) -> t.BinaryIO:\n    pass\n")
    for marker, old, new, expected in (
            ("show_default: bool", "bool", "bool | str", "show_default: bool = True"),
            ("stream: t.IO", "t.IO", "t.IO[t.Any]", "stream: t.IO, default")):
        history = EditHistory()
        history.open("a.py", code)
        at = code.index(marker) + len(marker) - len(old)
        history.change("a.py", at, at + len(old), new)
        text = history.text("a.py")
        found = predict(history, "a.py", at + len(new))
        place = text.index(expected) + len(expected.split(": ")[0]) + 2
        assert (found.start, found.end, found.text) == (place, place + len(old), new)


def test_a_type_parametrized_in_a_parameters_annotation_goes_on_in_that_function_first():
    # click: `input: t.IO` -> `t.IO[t.Any]` (typed), then the rest of that def's header and its body
    # where `t.IO` stands bare in code (`t.cast(t.IO, input)`, an annotated local), before the next
    # def's parameter; not in its docstring, not where it is parametrized already, not inside an
    # `isinstance(` (a run-time check takes no parametrized generic), not `t.IOError`.
    code = ("def reader(\n    input: t.IO, charset: str, echo: t.IO | None = None\n) -> t.BinaryIO:\n"
            '    """Wrap a t.IO stream."""\n'
            "    if isinstance(input, (t.IO, bytes)):\n        raise t.IOError(input)\n"
            "    rv = find(t.cast(t.IO, input))\n    data: t.IO[bytes] = rv\n"
            "    stream: t.Optional[t.IO] = None\n    return rv\n\n\n"
            "def writer(input: t.IO) -> None:\n    pass\n")
    at = code.index("t.IO,") + len("t.IO")
    history = typed_in(code, "a.py", at, "[t.Any]")
    assert accepted_lines(history, "a.py", at + len("[t.Any]"), limit=4) == [
        "input: t.IO[t.Any], charset: str, echo: t.IO[t.Any] | None = None",
        "rv = find(t.cast(t.IO[t.Any], input))", "stream: t.Optional[t.IO[t.Any]] = None",
        "def writer(input: t.IO[t.Any]) -> None:"]


def test_a_subscript_added_is_not_repeated_where_a_subscript_stands():
    # `a: List` -> `List[int]`: the next bare `List`, not `List[str]` (a subscript of a subscript).
    code = "a: List = []\nb: List[str] = {}\nc = cast(List, d)\n"
    at = code.index("List") + len("List")
    history = typed_in(code, "m.py", at, "[int]")
    found = predict(history, "m.py", at + len("[int]"))
    place = history.text("m.py").index("(List") + len("(List")
    assert (found.start, found.end, found.text) == (place, place, "[int]")


def test_a_type_renamed_in_a_parameters_annotation_goes_on_at_its_attribute_annotated_alike():
    # click: `default_map: t.Optional[t.Dict[str, t.Any]] = None` -> `t.MutableMapping`: the
    # attribute `self.default_map` annotated alike below, not the next `t.Dict` (`self.params`).
    code = ("class Context:\n    def __init__(\n        self,\n"
            "        default_map: t.Optional[t.Dict[str, t.Any]] = None,\n    ) -> None:\n"
            "        self.params: t.Dict[str, t.Any] = {}\n"
            "        self.default_map: t.Optional[t.Dict[str, t.Any]] = default_map\n")
    at = code.index("Dict")
    history = _rename_at(code, at, "Dict", "MutableMapping")
    text = history.text("r.py")
    found = predict(history, "r.py", at + len("MutableMapping"))
    place = text.index("self.default_map: ") + len("self.default_map: ")
    assert (found.start, text[found.start:found.end], found.text) == (
        place, "t.Optional[t.Dict[str, t.Any]]", "t.Optional[t.MutableMapping[str, t.Any]]")


def test_an_annotation_given_to_a_class_attribute_goes_on_at_the_next_one_of_that_value():
    # click: `name = None` -> `name: t.ClassVar[t.Optional[str]] = None`, then `source_template =
    # None` (not `extra = 1`, nor `self.prog_name = prog_name` in a method).
    code = ("class ShellComplete:\n    name = None\n    extra = 1\n    source_template = None\n\n"
            "    def __init__(self, prog_name):\n        self.prog_name = prog_name\n\n\n"
            "other = None\n")
    history = EditHistory()
    history.open("s.py", code)
    at = code.index("name = None") + len("name")
    history.change("s.py", at, at, ": t.ClassVar[t.Optional[str]]")
    text = history.text("s.py")
    found = predict(history, "s.py", at + len(": t.ClassVar[t.Optional[str]]"))
    place = text.index("source_template") + len("source_template")
    assert (found.start, found.end, found.text) == (place, place, ": t.ClassVar[t.Optional[str]]")


def test_a_return_annotation_of_a_value_or_outside_a_def_is_not_carried_to_other_defs():
    code = "def a():\n    return 1\n\n\ndef b():\n    pass\n\n\nx = (1)\ny = (2)\n"
    for at, added in ((code.index("():") + 2, " -> int"), (code.index("(1)") + 3, " -> None")):
        history = EditHistory()
        history.open("t.py", code)
        history.change("t.py", at, at, added)
        found = predict(history, "t.py", at + len(added))
        # `-> int` names what one function returns; `(1) -> None` is no def header
        assert found is None or history.text("t.py")[found.start - 3 : found.start] != "b()"


def test_an_argument_no_other_call_passes_goes_to_the_functions_def():
    # click: `self._parse_decls(param_decls or ())` + `, expose_value`; no other call of it: the
    # def below (an override; the nearest below the cursor) takes the parameter.
    code = ("class Parameter:\n    def __init__(self, decls, expose_value):\n"
            "        self._parse_decls(decls or ())\n\n    def _parse_decls(self, decls):\n        pass\n\n\n"
            "class Option(Parameter):\n    def _parse_decls(self, decls):\n        return decls\n")
    history = EditHistory()
    history.open("c.py", code)
    at = code.index("decls or ()") + len("decls or ()")
    history.change("c.py", at, at, ", expose_value")
    text = history.text("c.py")
    found = predict(history, "c.py", at + len(", expose_value"))
    place = text.index("_parse_decls(self, decls") + len("_parse_decls(self, decls")
    assert (found.start, found.end, found.text) == (place, place, ", expose_value")


def test_a_trailing_comma_removed_goes_on_at_another_trailing_comma_only():
    # click: `[("x", "y"),])` -> `[("x", "y")])`; the next comma before a closing bracket, not the
    # comma between two arguments (`("cat", [...` -> `("cat" [...` would still parse, and be wrong).
    code = ('@mark.parametrize(("a", "b"), [("x", "y"),])\ndef f():\n    pass\n\n\n'
            '@mark.parametrize("cat", ["cat", "cat "])\ndef g():\n    pass\n\n\n'
            '@mark.parametrize("p", [0o400, 0o444,])\ndef h():\n    pass\n')
    history = EditHistory()
    history.open("t.py", code)
    at = code.index(",])")
    history.change("t.py", at, at + 1, "")
    text = history.text("t.py")
    found = predict(history, "t.py", at)
    assert (found.start, found.end, found.text) == (text.index(",])"), text.index(",])") + 1, "")
    # A call's trailing comma removed: not a tuple of one's comma (`("--cache",)` is a tuple), nor a
    # comma in a string (the repr of a tuple): nothing left to offer here.
    code = 'run(cmd, ["--help"],)\nopt(("--cache",), flag=True)\nassert out == "((1, \'a\'),)"\n'
    history = EditHistory()
    history.open("t.py", code)
    at = code.index(",)")
    history.change("t.py", at, at + 1, "")
    assert predict(history, "t.py", at) is None


def test_an_argument_added_to_a_call_over_several_lines_goes_on_at_the_next_call():
    # click: `echo(ctx.get_help(), {` ... `})` + `, color=ctx.color` at its closing bracket, then
    # the one-line `echo(ctx.get_help())` below.
    code = ("def a(ctx):\n    echo(render({\n        'x': 1,\n    }))\n"
            "    echo(ctx.get_help(), {\n        'y': 2,\n    })\n\n\n"
            "def b(ctx):\n    echo(ctx.get_help())\n")
    history = EditHistory()
    history.open("d.py", code)
    at = code.index("    })\n\n") + len("    }")
    history.change("d.py", at, at, ", color=ctx.color")
    text = history.text("d.py")
    found = predict(history, "d.py", at + len(", color=ctx.color"))
    place = text.index("echo(ctx.get_help())") + len("echo(ctx.get_help()")
    assert (found.start, found.end, found.text) == (place, place, ", color=ctx.color")


def test_a_pause_starts_a_new_edit():
    clock = Clock()
    history = EditHistory(clock=clock, burst_s=1.0)
    history.open("c.py", "ab")
    history.change("c.py", 2, 2, "c")
    clock.now += 5
    history.change("c.py", 3, 3, "d")
    assert [(e.old, e.new) for e in history.edits("c.py")] == [("", "c"), ("", "d")]
    history.close("c.py")
    assert history.edits("c.py") == [] and predict(history, "c.py", 0) is None


def test_backspacing_is_part_of_the_burst():
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("d.py", "value = 1\n")
    history.change("d.py", 0, 5, "count")  # value -> count
    clock.now += 0.1
    history.change("d.py", 4, 5, "")  # backspace over the t
    (edit,) = history.edits("d.py")
    assert (edit.old, edit.new) == ("value", "coun")


def test_a_rename_the_user_undid_elsewhere_is_not_offered():
    code = "a = size\nb = size\nc = size\n"
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("e.py", code)
    # The user once turned `length` into `size` at the third line, then renames `size` to `length`.
    history.open("e.py", code.replace("c = size", "c = length"))
    history.change("e.py", len("a = size\nb = size\nc = "), len("a = size\nb = size\nc = length"), "size")
    clock.now += 5
    history.change("e.py", 4, 8, "length")
    assert predict(history, "e.py", 10) is None


def test_a_whole_document_replacement_is_diffed_into_one_edit():
    history = EditHistory()
    history.open("f.py", CODE)
    history.change("f.py", None, None, CODE.replace("total = 0", "subtotal = 0", 1))
    (edit,) = history.edits("f.py")
    assert edit.new == "sub" and edit.old == ""
    nxt = predict(history, "f.py", 0)
    assert nxt is not None and nxt.kind == "rename" and nxt.text == "subtotal"


def test_an_editors_minimal_diff_of_a_typed_rename_is_still_one_rename():
    """Neovim sends `items` -> `s` as "delete `item`" (the `s` stays), then the typed `tock`."""
    clock = Clock()
    history = EditHistory(clock=clock)
    code = "def in_stock(items):\n    return [item for item in items if item]\n"
    history.open("g.py", code)
    at = code.index("items")
    history.change("g.py", at, at + 4, "")
    for i, char in enumerate("tock", start=1):
        clock.now += 0.03
        history.change("g.py", at + i, at + i, char)
    text = history.text("g.py")
    nxt = predict(history, "g.py", at + 5)
    assert nxt is not None and nxt.kind == "rename" and nxt.text == "stock"
    assert text[nxt.start:nxt.end] == "items" and nxt.start == text.index("in items") + 3


def test_a_replacement_wider_than_the_change_is_recorded_as_the_change():
    """An inline completion item replaces from the changed name to the cursor: `total += item.price`
    by `subtotal += item.price` is the rename `total` -> `subtotal`, carried on."""
    history = EditHistory()
    history.open("h.py", CODE)
    at = CODE.index("total +=")
    history.change("h.py", at, at + len("total += item.price"), "subtotal += item.price")
    (edit,) = history.edits("h.py")
    assert (edit.start, edit.old, edit.new) == (at, "", "sub")
    text = history.text("h.py")
    nxt = predict(history, "h.py", at)
    assert nxt is not None and nxt.kind == "rename" and nxt.text == "subtotal"
    assert nxt.start == text.index("total)")


def _rename_at(code: str, at: int, old: str, new: str) -> EditHistory:
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", at, at + len(old), new)
    return history


INVENTORY = (
    "LIMIT = 3\n\n\n"
    "def total_value(items: list) -> float:\n"
    "    return sum(item.price for item in items)\n\n\n"
    "def in_stock(\n    items: list,\n) -> list:\n"
    '    """The items with units left."""\n'
    "    found = [item for item in items if item.quantity > 0]\n"
    "    return found[:LIMIT]\n\n\n"
    "def restock(items):\n    global LIMIT\n    LIMIT = len(items)\n    return in_stock(items)\n"
)


def _walk(history: EditHistory, uri: str, cursor: int) -> list[str]:
    """Accept every prediction in turn; the lines they changed, in order."""
    changed = []
    while (nxt := predict(history, uri, cursor)) is not None and len(changed) < 10:
        history.change(uri, nxt.start, nxt.end, nxt.text)
        text = history.text(uri)
        changed.append(text[text.rfind("\n", 0, nxt.start) + 1 : text.find("\n", nxt.start)])
        cursor = nxt.start + len(nxt.text)
    return changed


def test_a_functions_parameter_is_renamed_in_that_function_only():
    """`items` is in_stock's own parameter: once its uses there are renamed (code, then its
    docstring), nothing more is offered, not another function's `items`, another variable."""
    at = INVENTORY.index("items: list,")
    history = _rename_at(INVENTORY, at, "items", "stock")
    assert _walk(history, "r.py", at + len("stock")) == [
        "    found = [item for item in stock if item.quantity > 0]",
        '    """The stock with units left."""',
    ]
    assert history.text("r.py").count("items") == INVENTORY.count("items") - 3


def test_a_local_renamed_in_its_body_stays_in_its_function_and_a_global_does_not():
    at = INVENTORY.index("found =")
    history = _rename_at(INVENTORY, at, "found", "kept")
    assert _walk(history, "r.py", at) == ["    return kept[:LIMIT]"]
    # LIMIT is declared global in restock: renaming it there goes on to the module's other uses.
    at = INVENTORY.index("    LIMIT = len") + 4
    history = _rename_at(INVENTORY, at, "LIMIT", "CAP")
    assert _walk(history, "r.py", at) == ["CAP = 3", "    return found[:CAP]", "    global CAP"]


def test_a_parameter_goes_to_its_whole_uses_before_parts_of_other_names():
    """`text` -> `generator` in `pager(text)`: `_default_text_stdout()` is another function, renamed
    (if at all) after the parameter's own uses; a local function named after it (`add_text`) is not."""
    code = ("def pager(text, color=None):\n    stdout = _default_text_stdout()\n"
            "    return _nullpager(stdout, text, color)\n")
    history = _rename_at(code, code.index("text"), "text", "generator")
    assert _walk(history, "r.py", code.index("text") + len("generator"))[0] == \
        "    return _nullpager(stdout, generator, color)"
    code = ("def check(blacklist=None):\n    seen = other_blacklist_size()\n\n"
            "    def add_blacklist(x):\n        blacklist.add(x)\n")
    history = _rename_at(code, code.index("blacklist"), "blacklist", "denylist")
    assert _walk(history, "r.py", code.index("blacklist") + len("denylist"))[0] == "    def add_denylist(x):"


def test_an_assignment_renamed_keeps_the_old_name_in_its_own_value():
    """`prefix = f(prefix)` -> `usage_prefix = f(prefix)` makes a new variable from the old one: the
    old name in its value stays; its next use below is renamed."""
    code = ("def write_usage(prog, prefix):\n    prefix = '%s%s ' % (prefix, prog)\n"
            "    width = term_len(prefix)\n")
    at = code.index("    prefix =") + 4
    history = _rename_at(code, at, "prefix", "usage_prefix")
    assert _walk(history, "r.py", at + len("usage_prefix"))[0] == "    width = term_len(usage_prefix)"


def test_an_attribute_named_like_a_parameter_is_renamed_beyond_that_function():
    """`self.func = func` -> `self._func = func`: the attribute is used in the other methods; the
    parameter `func` (and the value it gives) is another name."""
    code = ("class FunctionAuth:\n    def __init__(self, func):\n        self.func = func\n\n"
            "    def auth_flow(self, request):\n        yield self.func(request)\n")
    at = code.index("self.func") + len("self.")
    history = _rename_at(code, at, "", "_")
    assert _walk(history, "r.py", at + 1)[0] == "        yield self._func(request)"


def test_a_place_below_the_cursor_comes_before_a_better_matched_one_above():
    """The same argument added to `parse(...)`: the call above has the edit's very neighbours, the
    one below only some; developers go down the file, so the one below is offered. With none below,
    the one above is."""
    code = ("x = parse(raw, strict)\n\ndef load(raw):\n    return parse(raw, strict)\n\n"
            "def read(data):\n    return parse(data, strict)\n")
    at = code.index("raw, strict)\n\ndef read") + len("raw, strict")
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", at, at, ", True")
    text = history.text("r.py")
    nxt = predict(history, "r.py", at + len(", True"))
    assert (text[nxt.start - 12:nxt.start], nxt.text) == ("parse(data, strict"[-12:], ", True")
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    nxt = predict(history, "r.py", nxt.start + len(nxt.text))
    assert text.count("\n", 0, nxt.start) == 0 and nxt.text == ", True"


def test_a_type_renamed_in_an_annotation_with_a_default_goes_to_the_next_signature():
    """`timeout: OptionalTimeout = None`: the annotation is a type, not a parameter of `read` (the
    parameter is `timeout`), so its rename goes on to `write`'s signature."""
    code = ("async def read(self, n: int, timeout: OptionalTimeout = None) -> bytes:\n    return b''\n\n"
            "async def write(self, data: bytes, timeout: OptionalTimeout = None) -> None:\n    pass\n")
    at = code.index("OptionalTimeout")
    history = _rename_at(code, at, "OptionalTimeout", "TimeoutConfig")
    assert _walk(history, "r.py", at + len("TimeoutConfig")) == [
        "async def write(self, data: bytes, timeout: TimeoutConfig = None) -> None:"]


def test_a_rename_with_no_use_left_goes_on_as_a_repeat():
    """`item_value` -> `_` in one loop: the local has no other use in its function, so the same
    change goes to the same loop in the next function."""
    code = ("def keys(self):\n    for idx, (item_key, item_value) in enumerate(self._list):\n"
            "        yield item_key\n\n"
            "def index(self, key):\n    for idx, (item_key, item_value) in enumerate(self._list):\n"
            "        if item_key == key:\n            return idx\n")
    at = code.index("item_value")
    history = _rename_at(code, at, "item_value", "_")
    assert _walk(history, "r.py", at + 1) == ["    for idx, (item_key, _) in enumerate(self._list):"]


def test_a_change_with_no_place_for_its_whole_word_goes_where_it_was_made():
    """`platforms: Any` -> `platform_rules: t.ClassVar[tuple]` is, as the editor's diff has it, `s: Any`
    -> `_rules: t.ClassVar[tuple]` after `platform`. The whole words' change (`platforms: Any`) has no
    other place; the change as made goes on to `browsers: Any`."""
    code = ("class Parser:\n    platforms: Any = (\n        1,\n    )\n"
            "    browsers: Any = (\n        2,\n    )\n")
    at = code.index("s: Any")
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", at, at + len("s: Any"), "_rules: t.ClassVar[tuple]")
    assert _walk(history, "r.py", at)[0] == "    browser_rules: t.ClassVar[tuple] = ("


def test_marks_a_repeat_adds_that_stand_there_already_are_not_doubled():
    """`"arg"` -> `"ARG".` (the editor's diff: `arg"` -> `ARG".`) where `"arg".` stands: `"ARG".`,
    not `"ARG"..`."""
    code = "first = 'Missing \"arg\"'\nsecond = 'Missing \"arg\".'\n"
    at = code.index("arg")
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", at, at + len('arg"'), 'ARG".')
    assert _walk(history, "r.py", at + len('ARG".'))[0] == "second = 'Missing \"ARG\".'"


def test_a_builtins_name_changed_in_prose_goes_on_in_prose_and_in_code_as_a_whole_name():
    """`list` -> `sequence` in a docstring is a change of the words: `list(history)` in code is the
    builtin. `dict` -> `Extensions` in code goes to whole uses: `as_dict` is another name."""
    code = ('def send(data):\n    """data: a dict or list of pairs."""\n    history = list(data)\n'
            '    """Returns a list of responses."""\n')
    at = code.index("list of pairs")
    history = _rename_at(code, at, "list", "sequence")
    assert _walk(history, "r.py", at + len("sequence"))[0] == '    """Returns a sequence of responses."""'
    code = "def send(extensions: dict):\n    timeout.as_dict()\n    other: dict = {}\n"
    at = code.index("dict")
    history = _rename_at(code, at, "dict", "Extensions")
    assert _walk(history, "r.py", at + len("Extensions"))[0] == "    other: Extensions = {}"


def test_a_functions_own_name_renamed_at_its_def_goes_to_its_callers():
    at = INVENTORY.index("in_stock(\n")
    history = _rename_at(INVENTORY, at, "in_stock", "available")
    assert _walk(history, "r.py", at) == ["    return available(items)"]


def test_a_name_is_renamed_in_code_before_the_words_about_it():
    code = ('def is_distinct(seq):\n    """ All values in seq are distinct\n\n    >>> is_distinct([seq])\n'
            '    """\n    return len(seq) == len(set(seq))  # seq hashable\n')
    history = _rename_at(code, code.index("seq"), "seq", "items")
    text = history.text("r.py")
    nxt = predict(history, "r.py", text.index("items") + 5)
    # The docstring's words are skipped; its doctest line is code.
    assert nxt is not None and nxt.start == text.index("[seq]") + 1 and nxt.text == "items"
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    text = history.text("r.py")
    nxt = predict(history, "r.py", nxt.end)
    # Every use on the line at once.
    assert text[nxt.start:nxt.end] == "seq) == len(set(seq" and nxt.text == "items) == len(set(items"
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    # The code done (the accepted line-wide rename is a rename too), the words come: the comment
    # after the cursor, then the docstring's, from the top.
    text = history.text("r.py")
    nxt = predict(history, "r.py", nxt.start + len(nxt.text))
    assert nxt is not None and nxt.start == text.index("seq hashable") and nxt.text == "items"
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    nxt = predict(history, "r.py", nxt.end)
    assert nxt is not None and nxt.start == text.index("seq are")


def test_a_call_written_in_prose_is_renamed_with_the_code():
    code = ('def merge_with(fn, *dicts):\n    """Each list goes to fn, such as fn([v1, v2])."""\n'
            '    return {k: fn(v) for k, v in dicts}\n')
    history = _rename_at(code, code.index("fn"), "fn", "func")
    text = history.text("r.py")
    nxt = predict(history, "r.py", text.index("func") + 4)
    assert nxt is not None and nxt.start == text.index("fn([") and nxt.text == "func"


def test_a_words_case_changed_in_prose_goes_on_in_prose_only():
    """`posix` -> `POSIX` in a docstring is an edit of the words: the next docstring line gets it,
    then nothing; the code's `force_posix` and `posixpath` are names, left as they are."""
    code = ('def app_dir(force_posix=False):\n    """Mac OS X (posix):\n      ~/.app\n    Unix (posix):\n'
            '      ~/.app\n    """\n    if force_posix:\n        return posixpath.join("~", ".app")\n')
    at = code.index("posix):")
    history = _rename_at(code, at, "posix", "POSIX")
    assert _walk(history, "r.py", at + 5) == ["    Unix (POSIX):"]
    # The same change of case typed in code is a rename of the name, code first.
    at = code.index("force_posix:") + len("force_")
    history = _rename_at(code, at, "posix", "POSIX")
    assert _walk(history, "r.py", at + 5)[0] == "def app_dir(force_POSIX=False):"


def test_a_name_renamed_to_one_that_holds_it_goes_to_its_whole_uses_first():
    """`encode` -> `encode_request`: `encode_response` is another name built on `encode`, not a use."""
    code = ("from streams import ByteStream, encode, encode_response\n\n\n"
            "def build(data):\n    return encode_response(data) or encode(data)\n")
    at = code.index("encode,")
    history = _rename_at(code, at, "encode", "encode_request")
    assert _walk(history, "r.py", at + len("encode_request")) == [
        "    return encode_response(data) or encode_request(data)"]
    # A word lengthened (`comp` -> `compose`): whole uses first, then the parts of longer names.
    code = "from toolz import comp\n\n\ndef test_comp():\n    assert comp(inc)(1) == 2\n"
    at = code.index("comp\n")
    history = _rename_at(code, at, "comp", "compose")
    assert _walk(history, "r.py", at + len("compose")) == ["    assert compose(inc)(1) == 2",
                                                          "def test_compose():"]
    # Names that hold nothing of each other keep the part rule: `blacklist` in `add_blacklist`.
    code = "blacklist = set()\n\n\ndef add_blacklist(name):\n    blacklist.add(name)\n"
    history = _rename_at(code, 0, "blacklist", "denylist")
    assert _walk(history, "r.py", len("denylist"))[0] == "def add_denylist(name):"


def test_a_calls_keyword_renamed_goes_to_the_next_calls_keyword_not_the_variable():
    code = ('def test_post(client, data):\n    first = client.post("/a", data=b"x")\n'
            '    data = make()\n    return client.post("/b", data=data, timeout=1)\n')
    at = code.index("data=b")
    history = _rename_at(code, at, "data", "content")
    text = history.text("r.py")
    nxt = predict(history, "r.py", at + len("content"))
    # Not the parameter `data` nor `data = make()`: the next call's keyword, its value left alone.
    assert nxt is not None and nxt.start == text.index("data=data") and nxt.text == "content"
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    assert 'client.post("/b", content=data, timeout=1)' in history.text("r.py")
    # A def's parameter with a default is no call's keyword: its uses in the body go on as before.
    code = "def get(url, data=None):\n    return send(url, data)\n"
    history = _rename_at(code, code.index("data="), "data", "body")
    assert _walk(history, "r.py", code.index("data=") + 4) == ["    return send(url, body)"]


def test_a_keyword_renamed_with_its_value_goes_on_with_the_next_calls_value():
    # httpcore: `content=content,` -> `data=data,` renamed the keyword and the variable it passes;
    # the next call's `content=content` becomes `data=data`, a keyword with another value keeps it.
    code = ("def send(content, other):\n    a = Request(\n        content=content,\n    )\n"
            "    c = Request(\n        content=content,\n    )\n    b = Request(content=other)\n")
    at = code.index("content=content")
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", at, at + len("content=content"), "data=data")
    text = history.text("r.py")
    nxt = predict(history, "r.py", at + len("data=data"))
    place = text.index("content=content")
    assert (nxt.start, text[nxt.start:nxt.end], nxt.text) == (place, "content=content", "data=data")
    history.change("r.py", nxt.start, nxt.end, nxt.text)
    text = history.text("r.py")
    nxt = predict(history, "r.py", nxt.start + len(nxt.text))
    assert (nxt.start, text[nxt.start:nxt.end], nxt.text) == (text.index("content=other"), "content", "data")


def test_a_word_of_the_documentation_goes_on_where_it_reads_the_same():
    # werkzeug: `see :meth:`is_json`` -> `see :attr:`is_json`` in a docstring: `meth` is a word of
    # the text, no name of the code: the next place that reads the same, not the next `meth`.
    code = ('def get_json(self):\n    """Parse (see :meth:`is_json`).\n\n'
            '    :meth:`parse` reads it.\n    """\n\n\n'
            'def json(self):\n    """The data (see :meth:`is_json`), this one."""\n')
    at = code.index("meth")
    history = _rename_at(code, at, "meth", "attr")
    text = history.text("r.py")
    nxt = predict(history, "r.py", at + len("attr"))
    assert (nxt.start, nxt.text) == (text.index("see :meth:`is_json`), this") + len("see :"), "attr")
    # A typo fixed in a docstring (`blow` -> `below`) goes on as the whole word only, in prose only:
    # not `by` -> `bey`, nor `warnings.warn` in code after `Settings` -> `Setting` in a comment.
    code = ('def f():\n    """Commands nested blow it.\n\n    Disabled by this.\n    """\n'
            '    # Settings of it\n    warnings.warn("x")\n')
    for old_word, new_word in (("blow", "below"), ("Settings", "Setting")):
        at = code.index(old_word)
        history = _rename_at(code, at, old_word, new_word)
        assert predict(history, "r.py", at + len(new_word)) is None
    # A word of a string that is a value (a test's input) is renamed as a name is: its next use.
    code = 'run(input="wau wau")\nother("wau")\nassert out == "Foo: wau wau"\n'
    at = code.index("wau")
    history = _rename_at(code, at, "wau", "bar")
    text = history.text("r.py")
    nxt = predict(history, "r.py", at + len("bar"))
    assert (nxt.start, nxt.text) == (text.index('bar wau') + 4, "bar")


def test_a_new_name_that_holds_the_old_one_is_not_offered_where_it_stands():
    code = "def get(seq, default=no_default):\n    if default is no_default:\n        return seq\n"
    history = _rename_at(code, code.index("no_default"), "", "_")
    text = history.text("r.py")
    nxt = predict(history, "r.py", text.index("_no_default") + 1)
    assert nxt is not None and nxt.start == text.index("is no_default") + 3 and nxt.text == "_no_default"


def test_a_name_replaced_by_a_keyword_is_a_repeat_not_a_rename():
    code = "try:\n    f()\nexcept TypeError as e:\n    return e\nexcept ValueError as e:\n    return e\n"
    history = _rename_at(code, code.index("return e") + 7, "e", "None")
    text = history.text("r.py")
    nxt = predict(history, "r.py", text.index("None") + 4)
    assert nxt is not None and nxt.kind == "repeat" and nxt.start == text.rindex("return e") + 7


def test_a_space_put_into_a_word_is_repeated_but_indentation_is_not():
    code = "x = 1  # pragma: nocover\ny = 2\nz = 3  # pragma: nocover\n"
    history = _rename_at(code, code.index("cover"), "", " ")
    found = predict(history, "r.py", code.index("cover") + 1)
    assert found is not None
    history.change("r.py", found.start, found.end, found.text)
    assert history.text("r.py") == code.replace("nocover", "no cover")
    # A line indented further is not a change to carry to the next line.
    code = "if a:\n    b = 1\n    c = 2\n"
    assert predict(_rename_at(code, code.index("b ="), "", "    "), "r.py", 0) is None


def test_a_change_inside_a_word_is_repeated_at_that_word_only():
    """`not show_pos` -> `not self.show_pos` reaches the editor as `elf.s` typed after `not s`: a
    change of the word `show_pos`, not of every `not s` (`not self.finished` is left alone)."""
    code = ("def render(self, show_pos):\n    percent = not show_pos\n"
            "    done = not self.finished\n    if show_pos:\n        return percent\n")
    at = code.index("show_pos\n") + 1
    history = _rename_at(code, at, "", "elf.s")
    assert "not self.show_pos" in history.text("r.py")
    assert _walk(history, "r.py", at + 5)[0] == "    if self.show_pos:"


def test_a_change_after_a_whole_word_goes_after_that_whole_word_only():
    """A comma put after `default` (`By default, it`) is not put into `defaults`."""
    code = ('"""Wrap text.\n\nBy default it wraps.\nThis defaults to the width.\n'
            'Left as the default the tabs stay.\n"""\n')
    history = _rename_at(code, code.index("default it") + 7, "", ",")
    assert _walk(history, "r.py", code.index("default it") + 8)[0] == "Left as the default, the tabs stay."


def test_text_added_at_the_end_of_a_line_goes_only_at_the_end_of_another():
    code = "a = run()\nb = run() + 1\nc = run()\n"
    history = EditHistory()
    history.open("s.py", code)
    at = code.index("\n")
    history.change("s.py", at, at, "  # noqa")
    text = history.text("s.py")
    nxt = predict(history, "s.py", at + 8)
    # Not after `b = run()` (inside its line): after `c = run()`, the line that ends the same way.
    assert nxt is not None and nxt.start == nxt.end == text.index("c = run()") + len("c = run()")
    history.change("s.py", nxt.start, nxt.end, nxt.text)
    assert predict(history, "s.py", nxt.end) is None


# -- a rename carried to other files (`carried_rename`, `next_use_elsewhere`) ------------------------


def _carried(code: str, uri: str, old: str, new: str, at: int | None = None):
    from context.next_edit import carried_rename

    history = EditHistory()
    history.open(uri, code)
    at = code.index(old) if at is None else at
    history.change(uri, at, at + len(old), new)
    return carried_rename(history, uri)


def _applied(text: str, found) -> str:
    return text[: found.start] + found.text + text[found.end :]


def test_a_module_function_renamed_goes_to_its_importers_import_first_then_their_module_attribute():
    from context.next_edit import CarriedRename, next_use_elsewhere

    rename = _carried(INVENTORY, "file:///w/shop/stock.py", "in_stock", "available")
    assert rename == CarriedRename("in_stock", "available", ("stock",))
    importer = ("import os\nfrom shop.stock import (\n    LIMIT,\n    in_stock,\n)\n\n"
                "# in_stock, said in a comment\nprint(in_stock([]), os.sep)\n")
    found = next_use_elsewhere(rename, importer)
    assert _applied(importer, found).splitlines()[3] == "    available,"  # the import, not the comment
    relative = "from .stock import in_stock as pick\nfrom . import stock\n\npick(stock.in_stock)\n"
    found = next_use_elsewhere(rename, relative)
    assert _applied(relative, found) == relative.replace("import in_stock as", "import available as")
    attribute = "from . import stock\n\nprint(stock.in_stock([]))\n"  # the module's attribute
    assert _applied(attribute, next_use_elsewhere(rename, attribute)).endswith("print(stock.available([]))\n")
    # A file that imports the new name already is not renamed into importing it twice.
    assert next_use_elsewhere(rename, "from shop.stock import in_stock, available\n") is None
    # Neither another module's `in_stock` nor a file's own function of that name takes part.
    assert next_use_elsewhere(rename, "from shop.other import in_stock\nin_stock([])\n") is None
    assert next_use_elsewhere(rename, "def in_stock(x):\n    return x\n\nin_stock(1)\n") is None
    assert next_use_elsewhere(rename, "import stock_tools\nstock_tools.in_stock(1)\n") is None


def test_a_method_renamed_goes_to_attribute_uses_in_files_that_name_its_class():
    from context.next_edit import CarriedRename, next_use_elsewhere

    code = "class Cart:\n    def add(self, item):\n        self.items.append(item)\n"
    rename = _carried(code, "file:///w/cart.py", "add", "put")
    assert rename == CarriedRename("add", "put", ("cart",), "Cart")
    user = "from cart import Cart\n\ncart = Cart()\ncart.add(1); cart.add(2)\n"
    assert _applied(user, next_use_elsewhere(rename, user)).endswith("cart.put(1); cart.put(2)\n")
    assert next_use_elsewhere(rename, "seen = set()\nseen.add(1)\n") is None  # no Cart: a set's add


def test_a_module_of_the_same_name_in_an_import_is_not_renamed():
    code = "from report import report\nimport report as r\n\n\nprint(report([]), r)\n"
    history = _rename_at(code, code.index("report\n"), "report", "summary")
    assert _walk(history, "r.py", 0) == ["print(summary([]), r)"]


def test_only_renames_other_modules_can_see_are_carried():
    from context.next_edit import carried_rename

    # A function's local, a nested function, a non-Python file: each stays in its file.
    assert _carried(INVENTORY, "file:///w/stock.py", "found", "kept") is None
    nested = "def outer():\n    def inner():\n        return 1\n    return inner()\n"
    assert _carried(nested, "file:///w/n.py", "inner", "helper") is None
    assert _carried("function total() {}\n", "file:///w/t.js", "total", "subtotal") is None
    # A module constant of a package's __init__ belongs to the package.
    assert _carried("LIMIT = 3\n", "file:///w/shop/__init__.py", "LIMIT", "CAP").modules == ("shop",)
    # A use renamed in an importer goes on from there, to the module the name comes from.
    importer = "from shop.report import total\n\nprint(total(1))\n"
    at = importer.index("total")
    assert _carried(importer, "file:///w/main.py", "total", "subtotal", at).modules == ("report", "main")
    attribute = "import shop.report as rep\n\nprint(rep.total(1))\n"
    assert _carried(attribute, "file:///w/main.py", "total", "subtotal").modules == ("report",)
    # A rename the user took back is not carried.
    history = EditHistory()
    history.open("file:///w/r.py", "def total():\n    pass\n")
    history.change("file:///w/r.py", 4, 9, "subtotal")
    history.clock = lambda: 100.0
    history.change("file:///w/r.py", 4, 12, "total")
    assert carried_rename(history, "file:///w/r.py") is None


def test_a_rename_of_one_part_of_a_longer_name_goes_on_with_that_part():
    """Renaming `distinct` inside `test_distinct` (or accepting that suggestion) renames `distinct`
    next, not only `test_distinct`."""
    code = "def test_distinct():\n    assert distinct([1])\n    assert not distinct([1, 1])\n"
    history = _rename_at(code, code.index("distinct"), "distinct", "isdistinct")
    assert _walk(history, "r.py", 0) == ["    assert isdistinct([1])", "    assert not isdistinct([1, 1])"]


def test_from_an_importer_the_rename_goes_back_to_its_definition_and_on_through_open_files():
    from context.next_edit import CarriedRename, next_use_elsewhere, widened

    # main.py renamed its import of report's `total`: report.py's definition is the next place.
    rename = _carried("from shop.report import total\n", "file:///w/main.py", "total", "subtotal")
    assert rename == CarriedRename("total", "subtotal", ("report", "main"), at_definition=False)
    report = "import os\n\n\ndef total(items):\n    return sum(items)\n"
    assert _applied(report, next_use_elsewhere(rename, report, "/w/shop/report.py")).startswith(
        "import os\n\n\ndef subtotal(items):")
    assert next_use_elsewhere(rename, report, "/w/shop/other.py") is None  # another module's `total`
    # A package passing on its module's name (a relative import) is on the way too; an absolute
    # import of another library's name is not.
    package = "from .report import total\nfrom itertools import chain\n"
    assert _applied(package, next_use_elsewhere(rename, package, "/w/shop/report/__init__.py")).startswith(
        "from .report import subtotal")
    shim = CarriedRename("imap", "map", ("compat",), at_definition=False)
    assert next_use_elsewhere(shim, "from itertools import imap\n", "/w/compat.py") is None
    # An open file that imports the new name says where it comes from and passes it on: api.py's
    # `from .core import subtotal` adds `core` and `api`, so `from shop.api import total` is next.
    api = [("/w/shop/api.py", "from .core import subtotal\n")]
    wide = widened(CarriedRename("total", "subtotal", ("report",)), api)
    assert wide.modules == ("report", "core", "api")
    assert next_use_elsewhere(wide, "from shop.api import total\n") is not None
    # A place found two ways (api.py's own relative import of `core`'s name) is renamed once.
    again = "from .core import total\n"
    found = next_use_elsewhere(wide, again, "/w/shop/api.py")
    assert _applied(again, found) == "from .core import subtotal\n"


def test_a_change_with_no_place_left_in_its_file_goes_to_the_same_text_between_the_same_neighbours():
    from context.next_edit import context_names, next_repeat_elsewhere, repeat_elsewhere

    code = "client = connect(host, timeout=5)\n"
    history = _rename_at(code, code.index("5"), "5", "10")
    edit = repeat_elsewhere(history, "r.py")
    assert edit is not None and context_names(edit)[:3] == ["timeout", "host", "connect"]
    other = "a = connect(other, retries=5)\nb = connect(host, timeout=5)\n"
    found = next_repeat_elsewhere(edit, other)
    assert _applied(other, found) == other.replace("timeout=5", "timeout=10")
    # Only between neighbours on both sides: `timeout=5` alone, on a line unlike it, is not enough.
    assert next_repeat_elsewhere(edit, "limit(timeout=5, x)\n") is None
    # Not while its own file has a place left for it, nor for a rename (which goes its own way).
    two = code + "backup = connect(host, timeout=5)\n"
    assert repeat_elsewhere(_rename_at(two, two.index("5"), "5", "10"), "r.py") is None
    assert repeat_elsewhere(_rename_at(code, code.index("host"), "host", "server"), "r.py") is None
    # A name added to an import is no change for other files: each imports what it needs.
    imports = "from shop.report import total\n\nprint(total)\n"
    assert repeat_elsewhere(_rename_at(imports, imports.index("\n"), "", ", subtotal"), "r.py") is None


# -- the model path (context/next_edit_model.py) ---------------------------------------------------

def _renamed():
    from context.next_edit import EditHistory

    code = ("def report(items):\n    total = 0\n    for item in items:\n        total += item.price\n"
            "    return total\n")
    history = EditHistory()
    history.open("f.py", code)
    history.change("f.py", code.index("total"), code.index("total") + 5, "subtotal")
    return history, history.text("f.py")


def test_the_model_prompt_shows_the_edits_and_the_region_with_the_cursor():
    from context.next_edit_model import CURSOR, model_prompt, region_bounds

    history, text = _renamed()
    cursor = text.index("subtotal") + 8
    messages, start, end = model_prompt(history.edits("f.py"), text, cursor)
    assert (start, end) == region_bounds(text, cursor) == (0, len(text))  # 4 lines each side: all of it
    user = messages[-1]["content"]
    assert "-    total = 0\n+    subtotal = 0" in user and f"    subtotal{CURSOR} = 0\n" in user
    assert region_bounds("a\nb\nc\nd\ne\n", 4, lines=1) == (2, 8)  # the lines b, c, d


def test_a_rewrite_becomes_one_replacement_unless_it_copies_wanders_or_undoes():
    from context.next_edit_model import suggestion_from_rewrite

    history, text = _renamed()
    edits = history.edits("f.py")
    rewrite = text.replace("        total +=", "        subtotal +=")
    found = suggestion_from_rewrite(edits, text, 0, len(text), rewrite)
    assert found is not None and found.kind == "model"
    assert text[: found.start] + found.text + text[found.end:] == rewrite
    assert suggestion_from_rewrite(edits, text, 0, len(text), text) is None  # copied back
    assert suggestion_from_rewrite(edits, text, 0, len(text), "import os\nprint(os.getcwd())\n") is None
    undo = text.replace("    subtotal = 0", "    total = 0")
    assert suggestion_from_rewrite(edits, text, 0, len(text), undo) is None  # puts back what was changed


def test_the_embedded_model_answers_inside_the_region_or_not_at_all(runtime):
    from context.next_edit_model import predict_with_model, region_bounds

    history, text = _renamed()
    cursor = text.index("subtotal") + 8
    found = predict_with_model(runtime, history.edits("f.py"), text, cursor)
    start, end = region_bounds(text, cursor)
    assert found is None or (start <= found.start <= found.end <= end and found.kind == "model")


class GenerateSpy:
    """The real runtime, with each `generate` call's prompt and past cache noted (an observer, not
    a double: every call goes through)."""

    def __init__(self, runtime):
        self.runtime, self.calls = runtime, []

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def generate(self, prompt, **kwargs):
        self.calls.append((prompt, kwargs.get("past")))
        return self.runtime.generate(prompt, **kwargs)


CALC_BLOCK_TEXT = "# shop/calc.py:1\ndef price_of(item):\n    return item.price * item.quantity\n"


def test_related_code_goes_before_the_edits_and_the_head_is_the_same_for_every_request(runtime):
    from context.next_edit_model import ANSWER_OPENING, model_prompt, prompt_parts, reference_block

    history, text = _renamed()
    edits, cursor = history.edits("f.py"), text.index("subtotal") + 8
    head, tail, start, end = prompt_parts(runtime.tokenizer, edits, text, cursor)
    documents = reference_block(CALC_BLOCK_TEXT)
    messages, *bounds = model_prompt(edits, text, cursor, documents)
    plain = runtime.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The composed prompt reads as the plain one with the documents written in: head, documents, tail.
    assert head + documents + tail == plain + ANSWER_OPENING and bounds == [start, end]
    assert "Related code:\n```\n# shop/calc.py:1\ndef price_of(item):" in documents
    assert "The developer just made" not in head and tail.startswith("The developer just made")
    # The documents' caches follow the head: it must not change with the edits or the cursor.
    history.change("f.py", 0, 0, "# a note\n")
    assert prompt_parts(runtime.tokenizer, history.edits("f.py"), history.text("f.py"), 5)[0] == head


def test_the_model_path_reads_related_code_from_composed_caches(runtime):
    from context.config import SquidCacheConfig
    from context.next_edit_model import model_prompt, predict_with_model, prompt_parts, reference_block
    from context.squid.service import ReferenceDocument, SquidService

    history, text = _renamed()
    edits, cursor = history.edits("f.py"), text.index("subtotal") + 8
    head, tail, _, _ = prompt_parts(runtime.tokenizer, edits, text, cursor)
    block = reference_block(CALC_BLOCK_TEXT)
    service = SquidService(runtime, SquidCacheConfig(), None, start_thread=False, prefix_text=head)
    asked, composed = [], []

    def references(prompt_head, before_cursor):
        asked.append((prompt_head, before_cursor))
        composed.append(service.context_for([ReferenceDocument(block, "shop/calc.py")], wait=True))
        return composed[-1], block

    spy = GenerateSpy(runtime)
    found = predict_with_model(spy, edits, text, cursor, references=references)
    assert asked == [(head, text[:cursor])]
    [(prompt, past)] = spy.calls
    # Only the edits and the region are prefilled, after the composed head and document.
    head_and_block = len(runtime.encode(head)) + len(runtime.encode(block))
    assert composed[0].offset >= head_and_block - 2 and prompt == tail
    assert past is not None and past.get_seq_length() >= composed[0].offset
    if found is not None:  # what is recorded for training reads as what the model read
        assert found.answer.prompt == head + block + tail

    # Related code that cannot be had (or Squid off): the plain prompt, no past.
    def broken(prompt_head, before_cursor):
        raise OSError("disk tier unreadable")

    spy.calls.clear()
    predict_with_model(spy, edits, text, cursor, references=broken)
    messages, *_ = model_prompt(edits, text, cursor)
    [(prompt, past)] = spy.calls
    assert past is None and "Related code" not in prompt and prompt.startswith(
        runtime.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_a_place_waved_off_gives_the_next_one_in_the_same_order():
    clock = Clock()
    history = EditHistory(clock=clock)
    history.open("a.py", CODE)
    first = CODE.index("total")
    type_over(history, "a.py", first, "total", "subtotal", clock)
    text = history.text("a.py")
    cursor = first + len("subtotal")
    offered = predict(history, "a.py", cursor)
    assert offered.start == text.index("total +=")
    # Waved off: the use after it; then the one after that; with all of them off, none.
    second = predict(history, "a.py", cursor, [(offered.start, offered.end)])
    assert (second.start, second.text) == (text.index("total)"), "subtotal")
    third = predict(history, "a.py", cursor, [(offered.start, offered.end), (second.start, second.end)])
    assert third.start == text.index("total\n", second.end)
    uses = [(p.start, p.end) for p in (offered, second, third)]
    assert predict(history, "a.py", cursor, uses) is None
    # Only the waved-off place is left out: one overlapping nothing changes nothing.
    assert predict(history, "a.py", cursor, [(0, 3)]) == offered


def test_a_repeat_waved_off_goes_on_to_the_next_place_it_fits():
    code = "a = f(x)\nb = f(x)\nc = f(x)\n"
    history = EditHistory()
    history.open("r.py", code)
    history.change("r.py", 6, 7, "x, y")  # f(x) -> f(x, y) on the first line
    text = history.text("r.py")
    cursor = text.index("\n")
    offered = predict(history, "r.py", cursor)
    assert offered.kind == "repeat" and text.rfind("\n", 0, offered.start) == text.index("\nb")
    after = predict(history, "r.py", cursor, [(offered.start, offered.end)])
    assert after.kind == "repeat" and text.rfind("\n", 0, after.start) == text.index("\nc")
    assert after.text == offered.text


def test_a_repeat_never_goes_where_it_would_break_the_code():
    code = ('def _start_of_option(value: str) -> bool:\n    return value[:1] == "-"\n\n\n'
            'def _is_incomplete_option(args: list, param) -> bool:\n'
            '    for arg in args:\n        if _start_of_option(arg):\n            return True\n'
            '    return False\n')
    history = EditHistory()
    history.open("c.py", code)
    at = code.index("value: str")
    history.change("c.py", at, at, "ctx: Context, ")  # a parameter added to the def
    text = history.text("c.py")
    found = predict(history, "c.py", at + len("ctx: Context, "))
    # Not into the call `_start_of_option(arg)` (an annotation there does not parse): the next def.
    assert (found.start, found.end, found.text) == (text.index("args: list"),) * 2 + ("ctx: Context, ",)
    # The same change in a file that is not Python is judged by its text alone: the call, nearer.
    history.open("c.txt", code)
    history.change("c.txt", at, at, "ctx: Context, ")
    assert predict(history, "c.txt", at + len("ctx: Context, ")).start == text.index("(arg)") + 1


def test_a_change_that_broke_its_own_code_goes_on_where_it_breaks_the_code_too():
    # `try:` -> `with pytest.raises(E):` leaves an `except` with no `try` (the developer removes it
    # next): the same change in the next test breaks that one the same way, and is offered. Text in
    # a string is words, not code: a change there is judged by the text alone.
    code = ("def test_a():\n    try:\n        f()\n    except E:\n        pass\n\n\n"
            "def test_b():\n    try:\n        g()\n    except E:\n        pass\n")
    history = EditHistory()
    history.open("t.py", code)
    at = code.index("try:")
    history.change("t.py", at, at + len("try:"), "with pytest.raises(E):")
    text = history.text("t.py")
    found = predict(history, "t.py", at + len("with pytest.raises(E):"))
    changed = text[:found.start] + found.text + text[found.end:]
    assert changed == text.replace("try:", "with pytest.raises(E):")
    data = 'boundary = b"--xyz"\ndata = """\n--xyz\nContent\n--xyz--\n"""\n'
    history.open("m.py", data)
    at = data.index('xyz"') + 3
    history.change("m.py", at, at, "$")
    text = history.text("m.py")
    assert predict(history, "m.py", at + 1).start == text.index("--xyz\n", text.index('"""')) + 5


def test_a_comma_taken_out_goes_on_where_it_keeps_the_code_parsing_inside_a_nested_def_too():
    code = ('@pytest.mark.parametrize("x", [1, 2,])\ndef test_a(m):\n    def f(_):\n        raise E()\n\n'
            '    m.set(f)\n    try:\n        click.prompt("Password", hide_input=True)\n    except E:\n'
            '        pass\n\n\ndef test_b():\n    assert sum([3, 4,]) == 7\n')
    history = EditHistory()
    history.open("t.py", code)
    at = code.index(",])")
    history.change("t.py", at, at + 1, "")  # `2,])` -> `2])`
    text = history.text("t.py")
    found = predict(history, "t.py", at)
    # Not the call's comma (the call would not parse; its block is test_a's, around the nested def).
    assert (found.start, found.end, found.text) == (text.index("4,])") + 1, text.index("4,])") + 2, "")


def test_a_word_split_in_a_string_goes_on_in_strings_only():
    code = 'HELP = "special_chars and more"\n\n\ndef run(self):\n    BaseCommand.__init__(self)\n'

    history = EditHistory()
    history.open("s.py", code)
    at = code.index("_chars")
    history.change("s.py", at, at + 1, "-")
    text = history.text("s.py")
    # Not `__init_-(self)`, an expression; no string holds the word: nothing.
    assert predict(history, "s.py", at + 1) is None
    # Where a comment holds it (on a line that starts with `...`, no doctest), there.
    history.open("s.py", code + "    ...  # special_chars\n")
    history.change("s.py", at, at + 1, "-")
    text = history.text("s.py")
    found = predict(history, "s.py", at + 1)
    changed = text[:found.start] + found.text + text[found.end:]
    assert changed == text.replace("# special_chars", "# special-chars")


def test_an_imported_name_renamed_goes_to_its_uses_not_to_attributes_of_that_spelling():
    code = ("from ._streams import encode\n\n\ndef f(url, data):\n    key = url.encode()\n"
            "    return encode(data)\n")
    history = EditHistory()
    history.open("m.py", code)
    at = code.index("encode")
    history.change("m.py", at + len("encode"), at + len("encode"), "_request")
    text = history.text("m.py")
    found = predict(history, "m.py", at + len("encode_request"))
    assert (found.start, found.text) == (text.index("encode(data)"), "encode_request")  # not `url.encode()`
    # A method is used as an attribute: renamed at its def, `self.close()` comes next.
    method = "class C:\n    def close(self):\n        pass\n\n    def stop(self):\n        self.close()\n"
    history.open("c.py", method)
    at = method.index("close")
    history.change("c.py", at, at + len("close"), "aclose")
    text = history.text("c.py")
    found = predict(history, "c.py", at + len("aclose"))
    assert (found.start, found.text) == (text.index("close()"), "aclose")
