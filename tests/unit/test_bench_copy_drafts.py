"""The edit fallback's drafts benchmark (`bench/bench_copy_drafts.py`): the functions it asks about,
and one short run on the real model and a real package (click, installed with the project)."""

from __future__ import annotations

import argparse

from bench.bench_copy_drafts import functions, measure

TEXT = '''def short(x):
    return x


def body(values):
    total = 0
    for value in values:
        total += value
    return total


class Box:
    def method(self, a):
        if a:
            a += 1
        a *= 2
        return a
'''


def test_functions_of_four_lines_or_more_are_drawn_by_seed():
    found = functions({"m.py": TEXT, "broken.py": "def (:"}, 5, seed=0)
    assert sorted(name for _, name, _ in found) == ["body", "method"]
    lines = TEXT.split("\n")
    for path, name, (first, last) in found:
        assert path == "m.py" and lines[first - 1].lstrip().startswith(f"def {name}(")
        assert last - first >= 4
    assert functions({"m.py": TEXT}, 1, seed=0) == functions({"m.py": TEXT}, 1, seed=0)


def test_a_short_run_gives_the_same_answer_with_and_without_drafts(runtime):
    args = argparse.Namespace(package="click", functions=1, rounds=1, seed=0, threads=2, draft_tokens=10,
                              max_tokens=48)
    report = measure(args)
    (row,) = report["rows"]
    assert report["draft_tokens"] == 10 and row["identical"]
    assert 0 < row["accepted"] <= row["drafted"] and row["plain_tok_s"] > 0 and row["ratio"] > 0
