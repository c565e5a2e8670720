"""The completion benchmark's pure parts (`bench/bench_completion.py`): where positions fall, what
the editor's buffer holds there, and how an answer is scored. No model, no server."""

from __future__ import annotations

from bench.bench_completion import (
    Position,
    candidates,
    edit_similarity,
    editor_text,
    first_line,
    first_use_rows,
    identifier_f1,
    identifiers,
    prefix_at,
    score,
    select_positions,
    sibling_import_names,
    usable,
    usable_not_offered,
)

HEADER = "\n".join(f"# line {n}" for n in range(8)) + "\n"

MODULE = HEADER + '''from .helpers import make_thing, other
from pkg.util import Tool as T
import os


def build(name, size=3):
    """Build a thing.

    it spans lines
    """
    value = os.path.join(name, "x")
    thing = make_thing(value, size)
    again = make_thing(value, 1)
    result = call(
        thing,
    )
    return T(result)
'''


def _row(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n")) if needle in line)


def test_sibling_imports_are_relative_or_from_the_package_itself():
    assert sibling_import_names(MODULE, "pkg") == {"make_thing", "other", "T"}


def test_cross_file_rows_are_first_uses_of_sibling_names():
    rows = first_use_rows(MODULE, sibling_import_names(MODULE, "pkg"))
    assert rows == {_row(MODULE, "thing = make_thing"), _row(MODULE, "return T(result)")}


def test_candidates_skip_docstrings_comments_imports_and_multi_row_statements():
    next_rows = {row for row, _ in candidates(MODULE, "pkg", "next_line")}
    assert _row(MODULE, "value = os.path") in next_rows
    assert _row(MODULE, "again = make_thing") in next_rows  # a second use is not cross-file
    assert _row(MODULE, "def build") in next_rows
    for skipped in ("from .helpers", "import os", '"""Build', "it spans", "result = call(", "# line 7"):
        assert _row(MODULE, skipped) not in next_rows
    cross = candidates(MODULE, "pkg", "cross_file")
    assert (_row(MODULE, "thing = make_thing"), 4) in cross
    assert not next_rows & {row for row, _ in cross}  # the kinds never share a line


def test_mid_line_cuts_follow_an_opening_token_and_leave_something_to_type():
    row = _row(MODULE, "value = os.path")
    line = MODULE.split("\n")[row]
    columns = sorted(col for r, col in candidates(MODULE, "pkg", "mid_line") if r == row)
    assert [line[:col][-1] for col in columns] == ["=", ".", ".", "("]
    assert all(line[col:].strip() for col in columns)


def test_selection_is_deterministic_per_seed_and_one_position_per_line():
    files = {"pkg/a.py": MODULE, "pkg/b.py": MODULE.replace("build", "make")}
    first = select_positions(files, "pkg", "mid_line", 4, seed=0)
    assert first == select_positions(files, "pkg", "mid_line", 4, seed=0)
    assert len(first) == 4 and len({(p.path, p.line) for p in first}) == 4
    assert {tuple(select_positions(files, "pkg", "mid_line", 4, seed=s)) for s in range(6)} != {tuple(first)}
    for position in first:
        line = files[position.path].split("\n")[position.line]
        assert line[: position.column] + position.reference == line


def test_editor_buffer_drops_the_rest_of_the_line_and_keeps_what_follows():
    text = "a = 1\nb = call(x)\nc = 3\n"
    position = Position("pkg", "m.py", 1, 9, "mid_line", 0, "x)")
    assert editor_text(text, position) == "a = 1\nb = call(\nc = 3\n"
    assert prefix_at(text, position) == "a = 1\nb = call("


def test_first_line_mid_line_is_the_cursor_line_otherwise_the_first_non_blank():
    assert first_line(" foo(x)\n    bar", "mid_line") == "foo(x)"
    assert first_line("\n    foo(x)\n", "mid_line") == ""
    assert first_line("\n\n    foo(x)\n", "next_line") == "foo(x)"
    assert first_line(None, "cross_file") == ""


def test_edit_similarity_is_levenshtein_over_the_longer_string():
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("kitten", "sitting") == 1 - 3 / 7
    assert edit_similarity("", "abc") == 0.0


def test_identifiers_leave_out_keywords_strings_and_comments():
    assert identifiers('if x is not None: return foo.bar("baz qux")  # note') == ["x", "foo", "bar"]
    assert identifiers("for i in range(n):") == ["i", "range", "n"]
    assert identifier_f1(["a", "b"], ["a", "c"]) == 0.5
    assert identifier_f1([], []) == 1.0


def test_score_and_the_usable_rule():
    position = Position("pkg", "m.py", 3, 4, "next_line", 0, "return foo(x)")
    exact = score("return foo(x)\n", position)
    assert exact["offered"] and exact["exact"] and exact["id_exact"] and usable(exact)
    near = score("return foo(y)", position)
    assert not near["exact"] and near["similarity"] > 0.9 and not near["id_exact"] and usable(near)
    nothing = score(None, position)
    assert not nothing["offered"] and nothing["similarity"] == 0.0 and not usable(nothing)


def test_usable_not_offered_lists_positions_the_server_dropped():
    position = Position("pkg", "m.py", 3, 4, "next_line", 0, "return foo(x)")
    positions = {position.key: position}
    raw = [{"position": position.key, "scores": score("return foo(x)", position)}]
    server = [{"position": position.key, "scores": score(None, position),
               "first_scores": score(None, position), "first_answer": None}]
    found = usable_not_offered({"raw": raw, "product": server, "refs_off": []}, positions)
    assert [(f["config"], f["raw_first_line"]) for f in found] == [("product", "return foo(x)")]
    offered = [{**server[0], "scores": score("x", position)}]
    assert usable_not_offered({"raw": raw, "product": offered}, positions) == []
