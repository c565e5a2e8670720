"""The completion benchmark's pure parts (`bench/bench_completion.py`): where positions fall, what
the editor's buffer holds there, and how an answer is scored. No model, no server."""

from __future__ import annotations

import pytest

from bench.bench_completion import (
    Position,
    _parse,
    candidates,
    edit_similarity,
    editor_text,
    first_line,
    first_use_rows,
    identifier_f1,
    identifiers,
    paired,
    paired_latency,
    prefix_at,
    score,
    select_positions,
    server_settings,
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


def test_the_reader_configuration_sets_squid_reader_and_needs_a_folder(tmp_path):
    assert "reader" not in server_settings("product", tmp_path)["squid"]
    assert server_settings("refs_off", tmp_path)["squid"]["enabled"] is False
    assert server_settings("reader", tmp_path, tmp_path / "r")["squid"]["reader"] == str(tmp_path / "r")
    with pytest.raises(ValueError, match="--reader"):
        server_settings("reader", tmp_path)
    assert "reader" not in _parse([]).configs
    assert _parse(["--reader", str(tmp_path)]).configs == ["product", "reader", "refs_off", "raw", "llama"]
    assert _parse(["--kinds", "cross_file"]).kinds == ["cross_file"]
    with pytest.raises(SystemExit):
        _parse(["--kinds", "next_word"])
    with pytest.raises(SystemExit):
        _parse(["--configs", "product,reader"])


def test_paired_counts_what_one_configuration_gained_and_lost_against_another():
    positions = {k: Position("pkg", "a.py", 9 + i, 0, "cross_file", 0, "x = 1")
                 for i, k in enumerate(("p1", "p2", "p3"))}

    def row(key, exact, similarity):
        return {"position": key, "scores": {"exact": exact, "similarity": similarity}}

    results = {"product": [row("p1", False, 0.5), row("p2", True, 1.0), row("p3", False, 0.2)],
               "reader": [row("p1", True, 1.0), row("p2", True, 1.0), row("p3", False, 0.1)]}
    line = paired(results, positions, "reader", "product", lambda p: True)
    assert line == ("reader against product (3 positions): exact gained 1, lost 0; similarity up at 1, "
                    "down at 1, mean change +0.133")
    assert "no common positions" in paired(results, positions, "reader", "raw", lambda p: True)


def test_paired_latency_is_the_median_of_the_differences_at_the_same_positions():
    positions = {k: Position("pkg", "a.py", 9 + i, 0, "next_line", 0, "x = 1")
                 for i, k in enumerate(("p1", "p2", "p3", "p4"))}

    def row(key, latency, first):
        return {"position": key, "latency_s": latency, "first_latency_s": first}

    results = {"refs_off": [row("p1", 0.40, 0.70), row("p2", 0.50, 0.60), row("p3", 0.30, 0.90)],
               "product": [row("p1", 0.45, 0.70), row("p2", 0.40, 0.80), row("p3", 0.60, 0.95),
                           row("p4", 9.0, 9.0)]}  # p4 has no pair: left out
    line = paired_latency(results, positions, "product", "refs_off", lambda p: True)
    assert line == ("product minus refs_off (3 positions), median of paired differences: "
                    "repeated request +0.050 s, first request +0.050 s")
    assert "no common positions" in paired_latency(results, positions, "product", "raw", lambda p: True)
