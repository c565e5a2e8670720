"""The learning loop's simulated user: where its spots are, and its hidden preference applied to
what it was shown (keep, modify or revert), as `bench/learning_loop.py` uses them."""

from __future__ import annotations

import ast

from bench.learning_loop import pick, waves
from bench.simulated_user import copy_modules, decide, find_spots

MODULE = '''"""A module."""


def area(width, height):
    """Return the area of a rectangle."""
    if width < 0:
        raise ValueError(width)
    return width * height


def one_liner(x):
    """Too short to be a spot: the docstring is all it has."""


class Box:
    def volume(self):
        """Return the volume."""
        return self.w * self.h * self.d

    def nested(self):
        """Has an inner function, which is not a spot."""
        def inner():
            """Inner."""
            return 1
        return inner()
'''


def test_spots_are_functions_with_a_docstring_and_code_after_it():
    spots = {s.name: s for s in find_spots(MODULE, "m.py")}
    assert set(spots) == {"area", "volume", "nested"}
    area = spots["area"]
    assert area.summary == "Return the area of a rectangle."
    assert area.before.endswith("def area(width, height):\n    ") and area.indent == "    "
    assert area.after.startswith("\n\n\ndef one_liner")
    assert "width * height" not in area.text  # the body is what the user is about to write
    assert area.cursor == (4, 4)
    assert spots["volume"].indent == " " * 8


def test_the_hidden_preference():
    area = {s.name: s for s in find_spots(MODULE, "m.py")}["area"]
    assert decide(area, '"""Area."""\n    return width * height').action == "keep"
    modified = decide(area, "return width * height")
    assert modified.action == "modify" and modified.typed == '"""Return the area of a rectangle."""\n    '
    assert modified.result("return width * height") == modified.typed + "return width * height"
    assert ast.parse(area.before + modified.typed + "return width * height" + area.after)
    assert decide(area, '"""Return the area of\n    ').action == "revert"  # an unfinished docstring
    assert decide(area, "return (width *").action == "revert"


def test_the_oneline_users_hidden_preference():
    area = {s.name: s for s in find_spots(MODULE, "m.py")}["area"]
    kept = decide(area, "return width * height", "oneline")
    assert kept.action == "keep" and kept.result("return width * height") == "return width * height"
    two = "if width < 0:\n        raise ValueError(width)\n    return width * height"
    # Spanning lines: the first line stays only if the file parses with it alone; here it does not.
    assert decide(area, two, "oneline").action == "revert"
    lines = "area = width * height\n    return area"
    modified = decide(area, lines, "oneline")
    assert modified.action == "modify" and modified.result(lines) == "area = width * height"
    assert ast.parse(area.before + modified.result(lines) + area.after)
    assert decide(area, "return (width *", "oneline").action == "revert"
    # A docstring is no different from other code to this user.
    assert decide(area, '"""Area."""\n    return width * height', "oneline").action == "modify"
    # The two users disagree where their preferences differ.
    assert decide(area, "return width * height").action == "modify"


def test_waves_open_one_spot_per_file_and_pick_spreads_evenly():
    spots = find_spots(MODULE, "a.py") + find_spots(MODULE, "b.py")
    grouped = waves(spots)
    assert [len(w) for w in grouped] == [2, 2, 2]
    assert all(len({s.path for s in wave}) == len(wave) for wave in grouped)
    assert [s.name for s in pick(spots, 3)] == ["area", "nested", "volume"]
    assert pick(spots, 10) == spots


def test_the_workspace_is_a_copy_of_real_standard_library_modules(tmp_path):
    copied = copy_modules(tmp_path, ("textwrap.py", "no_such_module.py"))
    assert [p.name for p in copied] == ["textwrap.py"]
    spots = find_spots(copied[0].read_text(), "textwrap.py")
    assert len(spots) >= 5 and any(s.name == "dedent" for s in spots)


def test_retained_characters_follow_the_decision():
    area = {s.name: s for s in find_spots(MODULE, "m.py")}["area"]
    text = "area = width * height\n    return area"
    assert decide(area, text, "oneline").retained(text) == len("area = width * height")
    # The docstring user keeps the code under the docstring it types: all of it stays.
    assert decide(area, "return width * height").retained("return width * height") == 21
    assert decide(area, "return (width *").retained("return (width *") == 0


def test_a_seeds_matrix_reports_each_run_and_the_mean_with_its_spread():
    from bench.learning_loop import matrix_summary, retained_per_shown, run_outcome

    def report(user, seed, keeps, retained):
        held = [{"keep_rate": k, "retained_per_shown": r} for k, r in zip(keeps, retained, strict=True)]
        return {"plan": {"user": user, "seed": seed}, "held_out": held,
                "rounds": [{"train": {"peak_rss_mb": 3000 + seed}, "gate": {}}]}

    outcomes = [run_outcome(report("oneline", 0, [0.25, 0.5], [10.0, 20.0])),
                run_outcome(report("oneline", 1, [0.25, 0.3], [10.0, 12.0])),
                run_outcome(report("docstring", 0, [0.5, 0.4], [30.0, 25.0]))]
    assert [o["gain"] for o in outcomes] == [0.25, 0.04999999999999999, -0.09999999999999998]
    table = matrix_summary(outcomes)
    assert "| oneline | mean of 2 | | +15.0 [+5.0, +25.0] | +6.0 [+2.0, +10.0] | | |" in table
    assert "| docstring | mean of 1 | | -10.0 [-10.0, -10.0]" in table
    assert "| oneline | 1 | 25% -> 30% | +5.0 | 10.0 -> 12.0 | 1 | 3001 |" in table
    log = [{"text": "ab", "retained": 2}, {"text": "", "retained": 0}, {"text": "cdef", "retained": 1}]
    assert retained_per_shown(log) == 1.5  # per suggestion shown: the empty one was not


def test_a_matrix_is_completed_in_parts_from_earlier_runs_reports(tmp_path, capsys):
    import argparse
    import json

    import pytest

    from bench.learning_loop import main, seed_list

    assert seed_list("3") == [0, 1, 2] and seed_list("1,2") == [1, 2] and seed_list("2,") == [2]
    with pytest.raises(argparse.ArgumentTypeError):
        seed_list("two")
    earlier = []
    for user, seed, keeps in (("docstring", 0, [0.325, 0.725]), ("oneline", 0, [0.225, 0.325])):
        path = tmp_path / f"{user}-{seed}.json"
        held = [{"keep_rate": k, "retained_per_shown": 10.0} for k in keeps]
        path.write_text(json.dumps({"plan": {"user": user, "seed": seed}, "held_out": held,
                                    "rounds": [{"train": {"peak_rss_mb": 1760}, "gate": {}}]}))
        earlier.append(str(path))
    out = tmp_path / "matrix.json"
    # Earlier reports alone: no new run, their table and the matrix's JSON.
    assert main(["--full", "--with", *earlier, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| docstring | 0 | 32% -> 72% | +40.0 |" in table and "| oneline | mean of 1 | | +10.0" in table
    saved = json.loads(out.read_text())
    assert saved["reports"] == earlier and [r["user"] for r in saved["runs"]] == ["docstring", "oneline"]
    # A matrix's JSON stands for the runs it lists (each once); anything else is refused before a run.
    again = tmp_path / "again.json"
    assert main(["--full", "--with", str(out), earlier[0], "--out", str(again)]) == 0
    assert json.loads(again.read_text())["reports"] == earlier
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit, match="neither a run's report nor a matrix"):
        main(["--full", "--seeds", "1,", "--with", str(tmp_path / "other.json")])
