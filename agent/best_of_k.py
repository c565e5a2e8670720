"""Best-of-K: verify each sampled edit (format, applies, parses, lint, tests) and rank the verified.

Every candidate is applied to its own copy of the overlay, so candidates never see each other. The
verified ones (format followed, applied, no new syntax, lint or language-server error, tests not
failing) are ranked by the model's mean log-probability per token; all are kept with their checks for
the feedback store.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib

from context.index.retrieval import is_test_path

from .episode import Candidate
from .errors import SandboxError, ToolError
from .protocol import ParseFailure, ToolCall
from .tools.edit import check_edit, new_text_for, rejection_message
from .tools.registry import ToolContext
from .tools.tests import TestRun, run_project_tests

__all__ = ["verify_candidate", "choose", "CHECKS"]

CHECKS = ("format", "applies", "parse", "lint", "tests")


def _failed(checks: dict, name: str, detail: str, text: str, temperature: float) -> Candidate:
    checks[name] = False
    return Candidate("", False, checks, text, None, temperature, detail)


def changed_spans(before: str, after: str) -> list[tuple[int, int]]:
    """The lines of `after` (1-based, inclusive) an edit changed, each widened to the function or
    method around it (the innermost `def` holding it; the changed lines alone at module level)."""
    old, new = before.splitlines(), after.splitlines()
    changed = [(j1 + 1, max(j1 + 1, j2)) for tag, _, _, j1, j2 in
               difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if tag != "equal"]
    try:
        defs = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(ast.parse(after))
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    except (SyntaxError, ValueError):
        defs = []
    spans = []
    for a, b in changed:
        around = [d for d in defs if d[0] <= a and b <= d[1]]
        spans.append(max(around, key=lambda d: d[0]) if around else (a, b))
    return spans


def _partial_fix(run: TestRun, rel: str, before: str, after: str) -> TestRun:
    """A run judged against the tests failing before the edit (`TestRun.judged_against`) passes
    with some of them still failing; when one of those fails through the function the edit changed,
    the edit is a partial fix of that function, not a fix that leaves unrelated failures alone."""
    if not run.passed or not run.failing or not run.failing_through(rel, changed_spans(before, after)):
        return run
    summary = (f"{run.summary}; tests that failed before the edit still fail through the code it "
               "changed (a partial fix)")
    return dataclasses.replace(run, passed=False, summary=summary)


def verify_candidate(
    ctx: ToolContext, action, text: str, temperature: float, run_tests: bool = True,
    protect_tests: bool = False, tests_before: TestRun | None = None,
) -> Candidate:
    """Apply an edit action to a copy of the overlay and check it; never raises for the model's mistakes.

    `protect_tests` (a request about code, not about its tests): an edit that changes a test file
    fails the tests check, since tests it rewrote passing says nothing about the fix. `tests_before`:
    the tests as they ran before any edit (the agent's first run, run to the end): when some failed there,
    the candidate's tests run to the end too and are judged against it (`TestRun.judged_against`)."""
    checks: dict[str, bool | None] = dict.fromkeys(CHECKS)
    if isinstance(action, ParseFailure) or not (isinstance(action, ToolCall) and action.name == "edit"):
        why = action.message if isinstance(action, ParseFailure) else "the answer is not an edit"
        return _failed(checks, "format", why, text, temperature)
    checks["format"] = True
    overlay = ctx.overlay.copy()
    try:
        path = ctx.workspace.resolve(action.args.get("path", ""))
        before = overlay.read(path)
        after = new_text_for(before, action.args)
    except (ToolError, SandboxError) as exc:  # a path outside the workspace fails here
        return _failed(checks, "applies", str(exc), text, temperature)
    if after == before:
        return _failed(checks, "applies", "the edit changes nothing", text, temperature)
    checks["applies"] = True
    trial = dataclasses.replace(ctx, overlay=overlay)  # the same services (lint cache, language servers)
    try:
        check = check_edit(trial, path, before, after)
    except ToolError as exc:
        checks["parse"] = True
        return _failed(checks, "lint", f"lint could not run: {exc}", text, temperature)
    checks["parse"] = not check.syntax
    checks["lint"] = not check.syntax and not check.lint and not check.types
    overlay.write(path, after)
    candidate = Candidate(overlay.diff(), False, checks, text, None, temperature, changes=overlay.changes())
    if not check.ok:
        candidate.detail = rejection_message(ctx.workspace.rel(path), check)
        return candidate
    if protect_tests and (edited := [c.rel for c in candidate.changes if is_test_path(c.rel)]):
        checks["tests"] = False
        candidate.detail = (f"the edit changes the tests ({', '.join(edited)}); fix the code they test, "
                            "not the tests")
        return candidate
    if run_tests:
        try:
            known = tests_before is not None and tests_before.passed is False and bool(tests_before.failing)
            run = run_project_tests(trial, stop_first=not known).judged_against(tests_before)
            run = _partial_fix(run, ctx.workspace.rel(path), before, after)
        except ToolError as exc:
            run = None
            candidate.detail = f"tests could not run: {exc}"
        if run is not None:
            checks["tests"] = run.passed
            candidate.failing = len(run.failing)
            if run.passed is False:
                candidate.detail = f"the edit applies, but the tests fail: {run.summary}\n{run.report}"
            elif run.failing:
                candidate.detail = f"tests: {run.summary}"
    candidate.verified = checks["tests"] is not False and bool(checks["lint"])
    return candidate


def choose(candidates: list[Candidate]) -> int | None:
    """The index of the verified candidate with the fewest tests failing (those that failed before
    any edit), then the highest log-probability (earliest on ties)."""
    best, best_score = None, None
    for index, candidate in enumerate(candidates):
        if not candidate.verified:
            continue
        score = (-candidate.failing, candidate.logprob if candidate.logprob is not None else float("-inf"))
        if best is None or score > best_score:
            best, best_score = index, score
    return best
