"""The loop's mechanics with a scripted model double: tool parsing, rejection, budgets, best-of-K,
cancellation, and the episode hand-off."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from agent.backends import Sample
from agent.episode import register_episode_sink, unregister_episode_sink
from agent.errors import AgentCancelled
from agent.loop import AgentLoop, AgentRequest
from agent.protocol import ToolCall
from agent.sandbox import Workspace
from context.config import AgentConfig
from tests.unit.agent.doubles import ScriptedBackend

GOOD = "```edit calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```"
SYNTAX = "```edit calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return (a + b\n>>>>>>> REPLACE\n```"
WRONG = "```edit calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a * b\n>>>>>>> REPLACE\n```"
READ = '```tool\n{"tool": "read_file", "args": {"path": "calc.py"}}\n```'


def run(project, answers, config=None, k=None, **kwargs):
    backend = ScriptedBackend(
        answers, **{k_: v for k_, v in kwargs.items() if k_ in ("native_tools", "logprobs")}
    )
    loop = AgentLoop(
        backend,
        Workspace([project]),
        config or AgentConfig(test_timeout_s=30, pretest=False),
        **{k_: v for k_, v in kwargs.items() if k_ in ("on_step", "should_stop")},
    )
    result = loop.run(AgentRequest("add() subtracts; fix it", project / "calc.py", k=k))
    return result, backend


def test_read_then_edit_is_verified_and_chosen(project):
    result, backend = run(project, [READ, GOOD], AgentConfig(test_timeout_s=30))
    assert [s.tool for s in result.steps] == ["run_tests", "read_file", "edit"]
    assert all(s.ok for s in result.steps)
    assert result.stop_reason == "verified" and result.chosen == 0
    assert result.candidates[0].checks == {
        "format": True,
        "applies": True,
        "parse": True,
        "lint": True,
        "tests": True,
    }
    assert "+    return a + b" in result.diff
    assert "return a - b" in (project / "calc.py").read_text()  # never written
    # The model saw the pretest failure, the target file, and then the tool output.
    first = backend.seen[0]
    assert "assert -1 == 5" in first.messages[0]["content"]
    assert first.documents[0].rel == "calc.py" and "return a - b" in first.documents[0].text
    assert "Result of read_file:\ncalc.py: 9 lines" in backend.seen[1].messages[-1]["content"]


def test_a_rejected_edit_is_shown_to_the_model_which_then_fixes_it(project):
    result, backend = run(project, [SYNTAX, GOOD])
    assert [c.verified for c in result.candidates] == [False, True]
    assert result.candidates[0].checks["parse"] is False and result.chosen == 1
    feedback = backend.seen[1].messages[-1]["content"]
    assert "rejected" in feedback and "SyntaxError" in feedback and "--- the original:" in feedback


def test_an_edit_that_fails_the_tests_is_not_chosen(project):
    result, backend = run(project, [WRONG, "```done\n```"])
    assert result.candidates[0].checks["tests"] is False and not result.candidates[0].verified
    assert result.chosen is None and result.diff == "" and result.stop_reason == "done"
    assert "tests fail" in backend.seen[1].messages[-1]["content"]


def test_unparsable_answers_are_reprompted_a_bounded_number_of_times(project):
    config = AgentConfig(reprompts=2, test_timeout_s=30, pretest=False)
    result, backend = run(project, ["no idea", "still prose", "more prose", GOOD], config)
    assert result.stop_reason == "unparsable" and len(backend.seen) == 3
    assert "could not be used: no fenced" in backend.seen[1].messages[-1]["content"]
    assert [s.tool for s in result.steps] == ["invalid", "invalid", "invalid"]
    # The --json answer keeps what the model said for each step it could not parse, and why.
    steps = result.to_json()["steps"]
    assert [s["answer"] for s in steps] == ["no idea", "still prose", "more prose"]
    assert steps[0]["error"].startswith("no fenced ```edit")
    assert result.to_json()["stop_reason"] == "unparsable"


def test_unknown_tools_and_bad_paths_are_reported_and_the_loop_goes_on(project):
    answers = [
        '```tool\n{"tool": "shell", "args": {"cmd": "rm -rf /"}}\n```',
        '```tool\n{"tool": "read_file", "args": {"path": "../../etc/passwd"}}\n```',
        GOOD,
    ]
    result, backend = run(project, answers)
    assert [(s.tool, s.ok) for s in result.steps[:2]] == [("shell", False), ("read_file", False)]
    assert "unknown tool 'shell'" in backend.seen[1].messages[-1]["content"]
    assert "outside the workspace" in backend.seen[2].messages[-1]["content"]
    assert result.chosen == 0


@pytest.mark.parametrize("path", ["/tests/test_calc.py", "../outside.py"])
def test_an_edit_of_a_path_outside_the_workspace_is_a_failed_candidate_not_a_crash(project, path):
    # Seen in training: a sample named an absolute path; the check raised out of the episode.
    outside = GOOD.replace("```edit calc.py", f"```edit {path}")
    result, backend = run(project, [outside, GOOD])
    assert result.candidates[0].checks["format"] is True
    assert result.candidates[0].checks["applies"] is False and not result.candidates[0].verified
    assert "outside the workspace" in result.candidates[0].detail
    assert result.chosen == 1 and not (project.parent / "outside.py").exists()


def test_an_edit_that_rewrites_the_tests_is_not_verified_by_them(project):
    # Asked to fix calc.py, a candidate that makes the test expect the bug passes the tests it changed.
    hack = ("```edit test_calc.py\n<<<<<<< SEARCH\n    assert add(2, 3) == 5\n=======\n"
            "    assert add(2, 3) == -1\n>>>>>>> REPLACE\n```")
    result, backend = run(project, [hack, GOOD])
    first = result.candidates[0]
    assert first.checks["lint"] is True and first.checks["tests"] is False and not first.verified
    assert "changes the tests (test_calc.py)" in first.detail
    assert "changes the tests" in backend.seen[1].messages[-1]["content"]
    assert result.chosen == 1 and "+    return a + b" in result.diff


def test_a_request_about_a_test_file_may_edit_it(project):
    fix_test = ("```edit test_calc.py\n<<<<<<< SEARCH\n    assert mean([1, 2, 3]) == 2\n=======\n"
                "    assert mean([1, 2, 3]) == 2.0\n>>>>>>> REPLACE\n```")
    (project / "calc.py").write_text((project / "calc.py").read_text().replace("a - b", "a + b"))
    config = AgentConfig(test_timeout_s=30, pretest=False)
    loop = AgentLoop(ScriptedBackend([fix_test]), Workspace([project]), config)
    result = loop.run(AgentRequest("compare the mean with a float", project / "test_calc.py"))
    assert result.candidates[0].checks["tests"] is True and result.chosen == 0


def test_the_step_budget_ends_the_episode(project):
    result, backend = run(project, [READ] * 10, AgentConfig(max_steps=3, pretest=False))
    assert result.stop_reason == "step_budget" and len(backend.seen) == 3 and result.chosen is None


def test_the_token_budget_ends_the_episode(project):
    big = Sample(READ, [], 400)
    result, backend = run(
        project, [big] * 10, AgentConfig(token_budget=1000, max_step_tokens=500, pretest=False)
    )
    assert result.stop_reason == "token_budget" and len(backend.seen) == 3
    assert backend.calls[-1][2] == 200  # the last step may only use what is left


def test_best_of_k_samples_k_verifies_all_and_ranks_by_logprob(project):
    other_good = GOOD.replace("return a + b", "return b + a")
    answers = [GOOD, WRONG, other_good, SYNTAX]
    result, backend = run(project, list(answers), k=4, logprobs={GOOD: -0.9, other_good: -0.2})
    assert backend.calls[1][0] == 3 and backend.calls[1][1] == AgentConfig().temperature
    assert [c.verified for c in result.candidates] == [True, False, True, False]
    assert [c.logprob for c in result.candidates][::2] == [-0.9, -0.2]
    assert result.chosen == 2 and "return b + a" in result.diff
    assert result.to_json()["candidates"][1] == {
        "diff": result.candidates[1].diff,
        "verified": False,
        "checks": result.candidates[1].checks,
    }


def test_cancellation_stops_the_episode(project):
    stop = threading.Event()
    backend = ScriptedBackend([READ] * 50, delay_s=0.05)
    loop = AgentLoop(
        backend,
        Workspace([project]),
        AgentConfig(pretest=False, max_steps=50),
        on_step=lambda step, n: stop.set() if n == 2 else None,
        should_stop=stop.is_set,
    )
    with pytest.raises(AgentCancelled):
        loop.run(AgentRequest("x", project / "calc.py"))
    assert len(backend.seen) == 2


def test_native_tool_calls_round_trip(project):
    read = Sample("", [ToolCall("read_file", {"path": "calc.py"}, "call_1")], 5)
    edit = Sample(
        "",
        [
            ToolCall(
                "edit",
                {
                    "path": "calc.py",
                    "blocks": [{"search": "    return a - b", "replace": "    return a + b"}],
                },
                "call_2",
            )
        ],
        5,
    )
    result, backend = run(project, [read, edit], native_tools=True)
    assert result.chosen == 0
    messages = backend.seen[1].messages
    assert messages[-2]["tool_calls"][0]["id"] == "call_1" and messages[-1]["role"] == "tool"
    assert messages[-1]["tool_call_id"] == "call_1" and "calc.py: 9 lines" in messages[-1]["content"]
    assert backend.seen[0].tools and backend.seen[0].tools[0]["type"] == "function"


def test_episodes_go_to_registered_sinks_and_a_broken_sink_is_skipped(project):
    got = []

    class Sink:
        def record_agent_episode(self, episode, context):
            got.append((episode.episode_id, context["path"], len(episode.candidates)))

    class Broken:
        def record_agent_episode(self, episode, context):
            raise RuntimeError("disk full")

    sink, broken = Sink(), Broken()
    register_episode_sink(broken)
    register_episode_sink(sink)
    try:
        result, _ = run(project, [GOOD])
    finally:
        unregister_episode_sink(sink)
        unregister_episode_sink(broken)
    assert got == [(result.episode_id, str(project / "calc.py"), 1)]


def test_garbage_from_the_backend_is_an_unparsable_answer_not_a_crash(project):
    result, _ = run(
        project,
        ["\x00\x01\xff" * 100, "}}}{{{", "```tool\nnull\n```"],
        AgentConfig(reprompts=2, pretest=False),
    )
    assert result.stop_reason == "unparsable" and result.chosen is None


def test_a_backend_that_fails_ends_the_episode_with_its_error(project):
    from agent.errors import BackendTimeoutError

    class TimingOut(ScriptedBackend):
        def sample(self, *args, **kwargs):
            raise BackendTimeoutError("the model server at http://x did not answer in time")

    loop = AgentLoop(TimingOut([]), Workspace([project]), AgentConfig(pretest=False))
    result = loop.run(AgentRequest("x", project / "calc.py"))
    assert result.stop_reason == "backend_error" and "did not answer in time" in result.error
    assert result.chosen is None and result.to_json()["diff"] == ""


def test_a_served_model_without_function_calls_uses_the_text_protocol(project):
    """`agent.tool_protocol = "text"`: no tool schemas in the request, the fenced-block protocol in
    the instructions, and the answer's edit block parsed and verified (loopback server double)."""
    from agent.backends import OpenAIBackend
    from tests.unit.agent.doubles import FakeOpenAIServer, chat_completion

    config = AgentConfig(test_timeout_s=30, pretest=False, backend="openai", tool_protocol="text", model="m")
    with FakeOpenAIServer([chat_completion(GOOD)]) as server:
        backend = OpenAIBackend.from_config(replace(config, base_url=server.base_url))
        assert backend.native_tools is False
        result = AgentLoop(backend, Workspace([project]), config).run(
            AgentRequest("add() subtracts; fix it", project / "calc.py")
        )
        request = server.requests[0]
    assert "tools" not in request
    assert "```edit PATH" in request["messages"][0]["content"]
    assert result.stop_reason == "verified" and "+    return a + b" in result.diff


def test_an_unparsable_local_answer_is_answered_again_as_an_edit_of_the_file(project):
    from agent.backends import LocalBackend
    from tests.unit.agent.doubles import ScriptedRuntime

    runtime = ScriptedRuntime(["\n\nThe code is:\n```\n",
                               "    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```\n"])
    config = AgentConfig(test_timeout_s=30, pretest=False)
    result = AgentLoop(LocalBackend(runtime), Workspace([project]), config).run(
        AgentRequest("add() subtracts; fix it", project / "calc.py"))
    assert [s.tool for s in result.steps] == ["invalid", "edit"]
    assert result.stop_reason == "verified" and result.chosen == 0
    # The same turn again (no message about the format), its answer opened as an edit of calc.py.
    assert runtime.prompts[1] == runtime.prompts[0] + "edit calc.py\n<<<<<<< SEARCH\n"
    # ... its search text decoded as a copy of calc.py: only the file's own text may follow.
    copy = runtime.constraints[1]
    assert copy.source == (project / "calc.py").read_text()
    # The first answer was free (`agent.copy_search` copies only inside an edit block of calc.py it opens).
    assert runtime.constraints[0]("\n\nThe code is:\n") is None
    assert copy("    return a - ") == {ord("b")}
    assert result.candidates[0].text.startswith("```edit calc.py\n<<<<<<< SEARCH\n    return a - b\n")


def test_without_the_edit_fallback_an_unparsable_answer_gets_a_message_about_the_format(project):
    from agent.backends import LocalBackend
    from tests.unit.agent.doubles import ScriptedRuntime

    runtime = ScriptedRuntime(["\n\nThe code is:\n```\n"] * 3)
    config = AgentConfig(test_timeout_s=30, pretest=False, edit_fallback=False)
    result = AgentLoop(LocalBackend(runtime), Workspace([project]), config).run(
        AgentRequest("add() subtracts; fix it", project / "calc.py"))
    assert result.stop_reason == "unparsable"
    assert "could not be used" in runtime.prompts[1] and not runtime.prompts[1].endswith("SEARCH\n")
    # Without a file named by the request there is nothing to open an edit of: the message again.
    runtime = ScriptedRuntime(["\n\nThe code is:\n```\n"] * 3)
    config = AgentConfig(test_timeout_s=30, pretest=False)
    result = AgentLoop(LocalBackend(runtime), Workspace([project]), config).run(
        AgentRequest("add() subtracts; fix it"))
    assert result.stop_reason == "unparsable" and "could not be used" in runtime.prompts[1]


def test_the_configured_seed_draws_each_steps_samples(project):
    """agent.seed: an episode is repeatable, and another seed asks the model for other samples."""
    for seed in (0, 7):
        config = AgentConfig(test_timeout_s=30, pretest=False, seed=seed)
        _, backend = run(project, [READ, GOOD], config)
        assert backend.seeds == [seed, seed + 1000], backend.seeds
