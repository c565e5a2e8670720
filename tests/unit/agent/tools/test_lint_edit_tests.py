"""lint (before vs after, real ruff), edit (search/replace on the overlay, gated) and run_tests (pytest
on a temporary copy)."""

from __future__ import annotations

import time

from agent.tools import default_registry
from agent.tools.edit import replace_definitions
from agent.tools.lint import lint_text, syntax_errors

FIX = {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + b"}]}


def test_lint_reports_only_what_the_edit_introduced(ctx, project):
    (project / "calc.py").write_text("import os\n\n\ndef f():\n    return 1\n")  # F401 already there
    path = ctx.workspace.resolve("calc.py")
    assert [d.code for d in lint_text(ctx, path, (project / "calc.py").read_text())] == ["F401"]
    registry = default_registry()
    assert (
        "no new lint errors (1 were already there)" in registry.call(ctx, "lint", {"path": "calc.py"}).output
    )
    ctx.overlay.write(path, "import os\n\n\ndef f():\n    return undefined_name\n")
    result = registry.call(ctx, "lint", {"path": "calc.py"})
    assert "1 new lint error(s)" in result.output and "F821" in result.output and "F401" not in result.output


def test_edit_applies_to_the_overlay_only(ctx, project):
    result = default_registry().call(ctx, "edit", FIX)
    assert result.ok, result.output
    assert "-    return a - b" in result.output and "+    return a + b" in result.output
    assert "return a - b" in (project / "calc.py").read_text()  # the workspace is untouched
    assert "return a + b" in ctx.overlay.read(ctx.workspace.resolve("calc.py"))
    assert "+    return a + b" in ctx.overlay.diff()


def test_an_edit_with_a_syntax_error_is_rejected_with_errors_proposed_and_original(ctx):
    bad = {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return (a + b"}]}
    result = default_registry().call(ctx, "edit", bad)
    assert not result.ok and result.data["rejected"]
    assert "SyntaxError" in result.output
    assert "--- your proposed code:" in result.output and "return (a + b" in result.output
    assert "--- the original:" in result.output and "return a - b" in result.output
    assert ctx.overlay.diff() == ""


def test_an_edit_with_a_new_lint_error_is_rejected(ctx):
    bad = {"path": "calc.py", "blocks": [{"search": "    return a - b", "replace": "    return a + c"}]}
    result = default_registry().call(ctx, "edit", bad)
    assert not result.ok and "F821" in result.output and "Undefined name `c`" in result.output
    assert ctx.overlay.diff() == ""


def test_search_text_must_match_once_with_whitespace_tolerance(ctx):
    registry = default_registry()
    missing = registry.call(ctx, "edit", {"path": "calc.py", "blocks": [{"search": "nope", "replace": "x"}]})
    assert not missing.ok and "not found" in missing.output
    twice = registry.call(ctx, "edit", {"path": "calc.py", "blocks": [{"search": "return", "replace": "x"}]})
    assert not twice.ok and "matches 2 places" in twice.output
    # Indented differently from the file: still matches, replacement re-indented.
    loose = {"path": "calc.py", "blocks": [{"search": "return a - b  ", "replace": "return a + b"}]}
    assert registry.call(ctx, "edit", loose).ok
    assert "    return a + b\n" in ctx.overlay.read(ctx.workspace.resolve("calc.py"))


def test_a_replacement_written_flush_left_is_indented_as_its_search_text(ctx):
    # Seen from the embedded model: the search text copied with its indentation, the replacement without.
    registry = default_registry()
    replace = "if not values:\n    return 0\nreturn sum(values) / len(values)"
    search = "    return sum(values) / len(values)"
    flush = {"path": "calc.py", "blocks": [{"search": search, "replace": replace}]}
    assert registry.call(ctx, "edit", flush).ok
    assert ("    if not values:\n        return 0\n    return sum(values) / len(values)\n"
            in ctx.overlay.read(ctx.workspace.resolve("calc.py")))
    # A replacement with indentation of its own is taken as written.
    from agent.tools.edit import Block, apply_block

    own = apply_block("x = 1\nif x:\n    y = 2\n", Block("    y = 2", "  y = 3"))
    assert own == "x = 1\nif x:\n  y = 3\n"
    assert apply_block("def f():\n    y = 2\n", Block("def f():\n    y = 2", "y = 3")) == "y = 3\n"


def test_edit_outside_the_workspace_is_refused(ctx):
    result = default_registry().call(
        ctx, "edit", {"path": "../x.py", "blocks": [{"search": "", "replace": "x"}]}
    )
    assert not result.ok and "outside the workspace" in result.output


def test_whole_definition_edits_replace_their_namesakes():
    before = "def add(a, b):\n    return a - b\n\n\ndef keep():\n    return 1\n"
    after = replace_definitions(before, "def add(a, b):\n    return a + b\n\ndef unrelated():\n    pass\n")
    assert after == "def add(a, b):\n    return a + b\n\n\ndef keep():\n    return 1\n"
    twice = replace_definitions(
        before, "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return add(a, b)\n"
    )
    assert twice == "def add(a, b):\n    return a + b\n\n\ndef keep():\n    return 1\n"
    # Cut off mid-way (a token limit): the complete prefix is used.
    cut = replace_definitions(before, "def add(a, b):\n    return a + b\n\ndef other(x):\n    return (")
    assert "return a + b" in cut


def test_syntax_errors_for_other_languages_use_tree_sitter(tmp_path):
    assert syntax_errors(tmp_path / "a.js", "function f() { return 1; }") == []
    assert syntax_errors(tmp_path / "a.js", "function f( { return 1; ")
    assert syntax_errors(tmp_path / "a.txt", "anything (") == []


def test_run_tests_reports_failures_and_sees_the_overlay(ctx, project):
    registry = default_registry()
    before = registry.call(ctx, "run_tests", {})
    assert before.ok and before.data["passed"] is False
    assert "test_add" in before.output and "assert -1 == 5" in before.output
    assert registry.call(ctx, "edit", FIX).ok
    after = registry.call(ctx, "run_tests", {})
    assert after.data["passed"] is True and "2 passed" in after.output
    assert "return a - b" in (project / "calc.py").read_text()  # ran on a copy


def test_run_tests_with_a_hanging_test_times_out(ctx, project):
    (project / "test_hang.py").write_text("import time\n\n\ndef test_hang():\n    time.sleep(120)\n")
    ctx.config = type(ctx.config)(test_timeout_s=3)
    result = default_registry().call(ctx, "run_tests", {"target": "test_hang.py"})
    assert (
        result.data["timed_out"] and result.data["passed"] is False and "timed out after 3 s" in result.output
    )


def test_run_tests_with_a_test_printing_gigabytes_is_bounded(ctx, project):
    (project / "test_loud.py").write_text(
        "import sys\n\n\ndef test_loud():\n    while True:\n        sys.stdout.write('y' * 65536)\n"
    )
    # The output reaches the cap as it is printed (pytest's tee-sys capture): the run is stopped
    # there, long before the timeout.
    ctx.config = type(ctx.config)(test_timeout_s=60, max_output_bytes=20_000)
    started = time.monotonic()
    result = default_registry().call(ctx, "run_tests", {"target": "test_loud.py"})
    assert time.monotonic() - started < 30
    assert result.data["passed"] is False and not result.data["timed_out"]
    assert "printed more than the output cap" in result.output and len(result.output) < 5000


def test_run_tests_without_tests_says_so(ctx, project):
    (project / "test_calc.py").unlink()
    assert default_registry().call(ctx, "run_tests", {}).data["passed"] is None


def test_run_tests_in_a_src_layout_import_the_workspace_package_not_the_installed_one(ctx, project):
    """`click` is installed in this environment; a workspace with `src/click` (click's own checkout)
    must test its own copy, or an edit is never what its tests see."""
    (project / "src" / "click").mkdir(parents=True)
    (project / "src" / "click" / "__init__.py").write_text('WHERE = "workspace"\n')
    (project / "test_where.py").write_text(
        "import click\n\n\ndef test_where():\n    assert click.WHERE == 'workspace'\n")
    result = default_registry().call(ctx, "run_tests", {"target": "test_where.py"})
    assert result.data["passed"] is True, result.output


def test_whole_lines_match_where_a_line_starts_not_inside_a_more_indented_line(ctx, project):
    """`    if k in d:` is also the end of `        if k in d:`; quoted whole, it is one place (the
    agent's copy of the file offers it as unique), and only that line changes."""
    text = ("def f(d, k):\n    for x in d:\n        if k in d:\n            pass\n"
            "    if k in d:\n        return 1\n")
    (project / "calc.py").write_text(text)
    block = {"search": "    if k in d:", "replace": "    if k not in d:"}
    assert default_registry().call(ctx, "edit", {"path": "calc.py", "blocks": [block]}).ok
    assert ctx.overlay.read(ctx.workspace.resolve("calc.py")) == text.replace(
        "    if k in d:\n        return", "    if k not in d:\n        return")
    # A piece of a line is still ambiguous where it occurs more than once.
    piece = {"search": "in d:", "replace": "in e:"}
    thrice = default_registry().call(ctx, "edit", {"path": "calc.py", "blocks": [piece]})
    assert not thrice.ok and "matches 3 places" in thrice.output


def test_tests_failing_before_any_edit_do_not_reject_a_fix_but_a_broken_test_does(ctx, project):
    # `test_env` fails whatever the edit does (a variable the runner does not have); `test_add`
    # fails on the bug. Run to the end before the edit, the fix is judged against that run.
    from agent.best_of_k import choose, verify_candidate
    from agent.protocol import ToolCall
    from agent.tools.tests import run_project_tests

    env_test = "import os\n\n\ndef test_env():\n    assert os.environ['SERVICE_URL']\n"
    (project / "test_env.py").write_text(env_test, encoding="utf-8")
    before = run_project_tests(ctx, stop_first=False)
    assert before.passed is False
    assert set(before.failing) == {"test_calc.py::test_add", "test_env.py::test_env"}
    assert len(run_project_tests(ctx).failing) == 1  # stopped at the first failure

    def candidate(search, replace):
        edit = ToolCall("edit", {"path": "calc.py", "blocks": [{"search": search, "replace": replace}]})
        return verify_candidate(ctx, edit, "", 0.0, tests_before=before)

    fix = candidate("    return a - b", "    return a + b")
    assert fix.verified and fix.checks["tests"] is True and fix.failing == 1
    assert "1 of the 2 tests failing before the edit pass" in fix.detail
    breaks = candidate("    return sum(values) / len(values)", "    return sum(values)")  # breaks test_mean
    assert not breaks.verified and breaks.checks["tests"] is False
    same = candidate("    return a - b", "    return a - b - 0")  # changes nothing the tests see
    assert not same.verified and same.checks["tests"] is False
    # Without the run before, the test that fails anyway rejects the fix, as it did.
    edit = ToolCall("edit", FIX)
    assert verify_candidate(ctx, edit, "", 0.0).checks["tests"] is False
    # Of two verified candidates, the one that leaves fewer tests failing is chosen.
    fix.logprob, worse = -2.0, candidate("    return a - b", "    return b + a")
    worse.failing, worse.logprob = 2, -0.1
    assert choose([worse, fix]) == 1


def test_the_agents_first_run_shows_the_first_failure_and_judges_against_all(project):
    # The model is shown the run that stops at the first failure (as it was trained to read it);
    # candidates are judged against a second run to the end.
    from agent.backends import LocalBackend
    from agent.loop import AgentLoop, AgentRequest
    from agent.sandbox import Workspace
    from context.config import AgentConfig

    class Runtime:  # a stand-in: the conversation is built before anything is generated
        pass

    env_test = "import os\n\n\ndef test_env():\n    assert os.environ['SERVICE_URL']\n"
    (project / "test_env.py").write_text(env_test, encoding="utf-8")
    loop = AgentLoop(LocalBackend(Runtime()), Workspace([project]), AgentConfig(test_timeout_s=30))
    conversation = loop.first_conversation(AgentRequest("fix add", project / "calc.py"))
    shown = conversation.messages[-1]["content"]
    assert "stopping after 1 failures" in shown and shown.count("FAILED ") == 1
    assert set(loop._tests_before.failing) == {"test_calc.py::test_add", "test_env.py::test_env"}


def test_a_test_module_that_cannot_be_imported_does_not_reject_every_fix(ctx, project):
    # pytest stops every test at a collection error unless told otherwise: the run to the end goes
    # on past it, counts the module among the failing, and a fix elsewhere is judged on the rest.
    from agent.best_of_k import verify_candidate
    from agent.protocol import ToolCall
    from agent.tools.tests import run_project_tests

    (project / "test_broken.py").write_text("import module_nobody_installed\n\n\ndef test_it():\n    pass\n",
                                            encoding="utf-8")
    stopped = run_project_tests(ctx)
    assert stopped.passed is False and stopped.failing == ("test_broken.py",)
    before = run_project_tests(ctx, stop_first=False)
    assert set(before.failing) == {"test_broken.py", "test_calc.py::test_add"}
    fix = verify_candidate(ctx, ToolCall("edit", FIX), "", 0.0, tests_before=before)
    assert fix.verified and fix.failing == 1
    assert "1 of the 2 tests failing before the edit pass" in fix.detail


def test_a_partial_fix_is_not_verified_when_a_test_still_fails_through_the_code_it_changed(ctx, project):
    # `ratio` fails for both tests; `test_env` fails whatever the edit does. An edit that fixes one
    # of ratio's tests and still fails the other inside ratio is a partial fix, not verified; the
    # whole fix is verified with only test_env still failing (its traceback never enters ratio).
    from agent.best_of_k import changed_spans, verify_candidate
    from agent.protocol import ToolCall
    from agent.tools.tests import run_project_tests

    (project / "ratios.py").write_text('"""Ratios."""\n\n\ndef ratio(a, b):\n    return a / b.total\n',
                                       encoding="utf-8")
    (project / "test_ratios.py").write_text(
        "from ratios import ratio\n\n\ndef test_ratio():\n    assert ratio(6, 3) == 2\n\n\n"
        "def test_ratio_float():\n    assert ratio(1.0, 4.0) == 0.25\n", encoding="utf-8")
    env_test = "import os\n\n\ndef test_env():\n    assert os.environ['SERVICE_URL']\n"
    (project / "test_env.py").write_text(env_test, encoding="utf-8")
    (project / "calc.py").write_text((project / "calc.py").read_text().replace("a - b", "a + b"))
    before = run_project_tests(ctx, stop_first=False)
    assert set(before.failing) == {"test_ratios.py::test_ratio", "test_ratios.py::test_ratio_float",
                                   "test_env.py::test_env"}
    assert ("ratios.py", 5) in before.frames

    def candidate(replace):
        blocks = [{"search": "    return a / b.total", "replace": replace}]
        return verify_candidate(ctx, ToolCall("edit", {"path": "ratios.py", "blocks": blocks}), "", 0.0,
                                tests_before=before)

    partial = candidate("    return a // b if isinstance(b, int) else a / b.total")
    assert not partial.verified and partial.checks["tests"] is False and partial.failing == 2
    assert "still fail through the code it changed" in partial.detail
    whole = candidate("    return a / b")
    assert whole.verified and whole.failing == 1
    # The span widened to the function around the change; module-level lines stay as they are.
    text = "X = 1\n\n\ndef f():\n    a = 1\n    return a\n"
    assert changed_spans(text, text.replace("return a", "return a + 1")) == [(4, 6)]
    assert changed_spans(text, text.replace("X = 1", "X = 2")) == [(1, 1)]
