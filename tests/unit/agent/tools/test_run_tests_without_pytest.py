"""run_tests where the interpreter has no pytest (squidcode's own install has none): the standard
library's unittest runs the tests, failures are reported as failures and say which runner ran, and
pytest-style tests that unittest cannot see come back as "no tests collected", never as passing.

pytest is installed where these tests run, so `pytest_installed` is made to answer False: the one
thing this machine cannot show. The runs themselves are real unittest subprocesses."""

from __future__ import annotations

import pytest

from agent.tools import default_registry
from agent.tools import tests as tests_tool
from agent.tools.tests import run_project_tests

TEST_CASE = """import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_add_zero(self):
        self.assertEqual(add(0, 0), 0)
"""
FIX = {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + b"}]}


@pytest.fixture
def without_pytest(monkeypatch):
    monkeypatch.setattr(tests_tool, "pytest_installed", lambda: False)


def test_unittest_runs_the_tests_and_reports_a_failure(ctx, project, without_pytest):
    (project / "test_calc.py").write_text(TEST_CASE)
    run = run_project_tests(ctx)
    assert run.passed is False
    assert run.summary == "1 failed (unittest: pytest is not installed)"  # -f: stops there, as pytest -x
    assert run.report.startswith("=" * 70 + "\nFAIL: test_add ")
    assert "AssertionError: -1 != 5" in run.report
    registry = default_registry()
    assert registry.call(ctx, "edit", FIX).ok
    after = registry.call(ctx, "run_tests", {})
    assert after.data["passed"] is True
    assert after.output == "tests pass: 2 passed (unittest: pytest is not installed)"


def test_a_target_file_or_node_id_is_run_by_unittest(ctx, project, without_pytest):
    (project / "test_calc.py").write_text(TEST_CASE)
    assert run_project_tests(ctx, "test_calc.py").summary.startswith("1 failed (")
    only = run_project_tests(ctx, "test_calc.py::AddTest::test_add_zero")
    assert only.passed is True and only.summary.startswith("1 passed")


def test_pytest_style_tests_are_not_collected_and_not_passed(ctx, project, without_pytest):
    result = default_registry().call(ctx, "run_tests", {})  # the fixture's plain test functions
    assert result.data["passed"] is None
    assert result.output == "no tests were found: no tests collected (unittest: pytest is not installed)"


def test_a_test_module_that_does_not_import_is_a_failure(ctx, project, without_pytest):
    (project / "test_calc.py").write_text("import unittest\nfrom calc import missing\n")
    run = run_project_tests(ctx)
    assert run.passed is False and "ImportError" in run.report and "unittest" in run.summary
