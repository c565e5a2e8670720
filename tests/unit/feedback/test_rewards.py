"""Rewards: bounds, each verifiable part with the real tools (ast, tree-sitter, ruff, a sandboxed
Python), outcome parts through the kept and reverted reference texts."""

from __future__ import annotations

import itertools

import pytest

from feedback.rewards import (
    RewardContext,
    RewardWeights,
    extract_code,
    lint_errors,
    parses,
    run_tests_sandboxed,
    score_output,
    similarity,
)

GOOD = "def add(a, b):\n    return a + b\n"
TESTS = ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'")


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def test_extract_code_prefers_a_fence_and_accepts_bare_code():
    assert extract_code(fenced(GOOD)) == (GOOD.rstrip("\n"), True)
    assert extract_code(GOOD) == (GOOD.rstrip("\n"), False)
    assert extract_code("   \n") == (None, False)
    assert extract_code("```python\n\n```") == (None, True)


def test_parses_uses_the_real_grammars():
    assert parses(GOOD)
    assert not parses("def add(a, b)\n    return a + b")
    assert parses("function f(x) { return x + 1; }", "javascript")
    assert not parses("function f(x) { return x + ; ", "javascript")


def test_lint_counts_real_ruff_errors():
    assert lint_errors(GOOD) == 0
    assert lint_errors("import os\ndef f():\n    return undefined_name\n") == 2


def test_tests_run_in_a_sandbox_and_report_the_share_passing(tmp_path):
    context = RewardContext(test_asserts=TESTS)
    assert run_tests_sandboxed(GOOD, context) == 1.0
    numeric_only = "def add(a, b):\n    return int(a) + int(b)\n"
    assert run_tests_sandboxed(numeric_only, context) == pytest.approx(2 / 3)
    # The candidate's writes land in the temporary copy, never in the caller's directory.
    escape = "open('written.txt', 'w').write('x')\ndef add(a, b):\n    return a + b\n"
    assert run_tests_sandboxed(escape, context) == 1.0
    assert not (tmp_path / "written.txt").exists()
    hang = RewardContext(test_asserts=("assert 1",), timeout_s=1.0)
    assert run_tests_sandboxed("while True:\n    pass\n", hang) == 0.0


def test_pytest_files_run_against_copied_workspace_files():
    context = RewardContext(
        files={"pkg/__init__.py": ""}, target_path="pkg/calc.py",
        test_files={"test_calc.py": "from pkg.calc import add\n\ndef test_a():\n    assert add(1, 2) == 3\n"
                    "\ndef test_b():\n    assert add(2, 2) == 5\n"},
    )
    assert run_tests_sandboxed(GOOD, context) == 0.5


def test_doing_nothing_earns_nothing():
    context = RewardContext(original=GOOD, test_asserts=TESTS, kept_text=GOOD)
    assert score_output("", context).total == 0.0
    assert score_output("   ", context).total == 0.0
    # Returning the original unchanged: nothing done, so nothing earned, even though tests pass.
    assert score_output(fenced(GOOD), context).total == 0.0


def test_a_correct_fenced_answer_scores_highest_and_parts_grade():
    context = RewardContext(test_asserts=TESTS, kept_text=GOOD)
    best = score_output(fenced(GOOD), context)
    assert best.total == pytest.approx(1.0)
    bare = score_output(GOOD, context)
    partial = score_output(fenced("def add(a, b):\n    return int(a) + int(b)\n"), context)
    broken = score_output(fenced("def add(a, b)\n    return a +"), context)
    prose = score_output("I think you should add them.", context)
    assert best.total > bare.total > partial.total > broken.total > 0
    assert broken.parts["parses"] == 0 and broken.parts["tests"] == 0
    assert prose.total < partial.total


def test_reverted_text_is_a_penalty_and_kept_text_a_pull():
    reverted = "def add(a, b):\n    return a - b\n"
    context = RewardContext(kept_text=GOOD, reverted_text=reverted)
    toward_kept = score_output(fenced(GOOD), context)
    toward_reverted = score_output(fenced(reverted), context)
    assert toward_kept.total > toward_reverted.total
    assert toward_reverted.parts["reverted"] == pytest.approx(1.0)
    assert toward_reverted.parts["kept"] < 1.0


def test_rewards_stay_in_bounds_under_extreme_weights():
    heavy = RewardWeights(reverted=5.0)
    texts = ["", GOOD, "x = (", "def add(a, b):\n    return a - b\n", "```\n```", "zzz " * 400]
    contexts = [
        RewardContext(), RewardContext(test_asserts=TESTS),
        RewardContext(kept_text=GOOD, reverted_text="def add(a, b):\n    return a - b\n"),
        RewardContext(language="javascript", kept_text="function f() {}"),
    ]
    for text, context in itertools.product(texts, contexts):
        for weights in (RewardWeights(), heavy):
            total = score_output(text, context, weights).total
            assert -1.0 <= total <= 1.0


def test_similarity_ignores_blank_lines_and_trailing_space():
    assert similarity("a = 1\n\n\nb = 2  \n", "a = 1\nb = 2") == 1.0
    assert similarity("a = 1", "zzzzzz") < 0.2


def test_a_recorded_path_outside_the_workspace_is_not_written():
    context = RewardContext(files={"../escape.py": "x = 1"}, test_asserts=("assert True",))
    assert run_tests_sandboxed(GOOD, context) is None
    assert score_output(fenced(GOOD), context).parts.get("tests") == 0.0
