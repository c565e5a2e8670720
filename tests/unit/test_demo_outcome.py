"""What the demos say about the agent's episode (`lsp_server.demo.agent_outcome`/`describe_agent`,
used by `squidcode demo` and `bench/learning_loop.py`): "verified", "unverified" or "no edit", why
(the episode's stop_reason), and a diff only when there is one. The answers are real episodes
(`agent.episode.AgentResult`) as the server's `squidcode.agent.run` returns them."""

from __future__ import annotations

from lsprotocol.converters import get_converter

from agent.episode import AgentResult, Candidate, StepRecord
from bench.learning_loop import applied_wording
from lsp_server.demo import agent_outcome, describe_agent
from lsp_server.features.agent_command import to_lsp_result

DIFF = """--- a/names.py
+++ b/names.py
@@ -1,2 +1,2 @@
 def full_name(first, last):
-    return f"{first} {first}"
+    return f"{first} {last}"
"""
PASSED = {"format": True, "applies": True, "parse": True, "lint": True, "tests": True}
TESTS_FAIL = {**PASSED, "tests": False}
NO_CHANGE = {"format": True, "applies": False, "parse": None, "lint": None, "tests": None}


def answer(stop_reason: str, candidates: list[Candidate], chosen: int | None = None, steps=(), error=None):
    """`squidcode.agent.run`'s answer for an episode that ended so."""
    episode = AgentResult("agent-1", "fix it", [StepRecord("run_tests", {}, True), *steps], candidates,
                          chosen, stop_reason, error=error)
    return to_lsp_result(episode, None, get_converter())


def bench_line(result: dict, seconds: float, applied: bool, tracked: bool) -> str:
    outcome = agent_outcome(result, seconds)
    return describe_agent(outcome, applied_wording({**outcome, "applied": applied, "tracked": tracked}))


def test_a_verified_edit_is_shown_with_its_diff_and_what_became_of_it():
    result = answer("verified", [Candidate(DIFF, True, PASSED), Candidate("", False, NO_CHANGE)], chosen=0)
    outcome = agent_outcome(result, 11.62)
    assert outcome["outcome"] == "verified" and outcome["stop_reason"] == "verified"
    assert outcome["diff"] == DIFF and outcome["verified"] == 1 and outcome["candidates"] == 2
    assert bench_line(result, 11.62, applied=True, tracked=True) == (
        "verified edit in 11.6 s, applied and recorded\n" + DIFF.rstrip()
    )
    assert bench_line(result, 11.62, applied=True, tracked=False).startswith(
        "verified edit in 11.6 s, applied, not recorded (recording is off)\n--- a/names.py"
    )


def test_unverified_edits_are_never_applied_and_say_which_checks_failed():
    wrong = DIFF.replace("{last}", "{first} {last}")
    result = answer("unverified", [Candidate(wrong, False, TESTS_FAIL), Candidate("", False, NO_CHANGE)])
    outcome = agent_outcome(result, 52.04)
    assert outcome["outcome"] == "unverified" and outcome["diff"] == ""
    assert outcome["failed_checks"] == ["applies", "tests"]
    line = bench_line(result, 52.04, applied=False, tracked=False)
    assert line == (
        "unverified edit in 52.0 s, not applied: none of 2 candidates passed its checks (failed: applies, "
        "tests); stopped: unverified, the step budget (agent.max_steps) ran out"
    )
    assert "\n" not in line and "applied and recorded" not in line


def test_no_edit_says_why_and_keeps_the_answers_that_could_not_be_parsed():
    invalid = [StepRecord("invalid", {}, False, "no fenced ```edit, ```tool or ```done block found",
                          answer=f"```\nI think {n}") for n in range(3)]
    result = answer("unparsable", [], steps=invalid)
    outcome = agent_outcome(result, 30.0)
    assert outcome["outcome"] == "no edit" and outcome["diff"] == ""
    assert outcome["unparsed"] == ["```\nI think 0", "```\nI think 1", "```\nI think 2"]
    assert outcome["steps"] == ["run_tests", "invalid (failed)", "invalid (failed)", "invalid (failed)"]
    assert describe_agent(outcome, "not applied") == (
        "no edit in 30.0 s; stopped: unparsable, the model's answers could not be parsed, too many times "
        "in a row (agent.reprompts)"
    )


def test_no_edit_after_the_model_said_done_or_the_backend_failed():
    done = agent_outcome(answer("done", []), 4.0)
    assert describe_agent(done, "not applied") == (
        "no edit in 4.0 s; stopped: done, the model said it was done"
    )
    failed = agent_outcome(answer("backend_error", [], error="the model did not answer in time"), 120.0)
    assert describe_agent(failed, "not applied") == (
        "no edit in 120.0 s; stopped: backend_error, the model backend failed: "
        "the model did not answer in time"
    )


def test_a_failed_request_is_no_edit_with_the_servers_message():
    outcome = agent_outcome(None, 0.21, "squidcode: the agent is turned off (agent.enabled = false)")
    assert outcome["outcome"] == "error" and outcome["diff"] == ""
    assert describe_agent(outcome, "not applied") == (
        "no edit in 0.2 s: the request failed: squidcode: the agent is turned off (agent.enabled = false)"
    )
