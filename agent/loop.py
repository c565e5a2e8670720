"""The agent loop: the model reads, calls tools, and proposes an edit; best-of-K picks the edit.

One episode:

1. the conversation starts with instructions, the tool protocol, notes from memory, the repo map,
   the documents (the target window, retrieved chunks) and the task, plus what the tests report now
   (`agent.pretest`);
2. each step samples one answer (greedy) and parses it into an action: native tool calls for
   backends that have them, the fenced-block protocol otherwise. An unparsable answer is re-prompted
   with what was wrong, at most `agent.reprompts` times in a row;
3. a reading tool runs and its output is appended; an edit starts the candidate round: K - 1 more
   answers are sampled at `agent.temperature` from the same conversation, every candidate is
   verified on its own overlay copy (format, applies, parse, lint, tests), and the verified ones are
   ranked by log-probability. No verified candidate: the model is shown why the first one failed
   and the loop goes on;
4. the episode ends with a chosen candidate, when the model says done, or when the step or token
   budget is spent. Cancellation (`should_stop`) is checked before every step and during decoding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from context.index.retrieval import is_test_path

from .backends import Backend, Conversation, LocalBackend, Sample
from .best_of_k import choose, verify_candidate
from .episode import AgentResult, Candidate, StepRecord, new_episode_id, record_episode
from .errors import AgentCancelled, BackendError, ToolError
from .overlay import Overlay
from .prompt import first_message, repo_map_for, select_documents, system_prompt, tool_call_message
from .protocol import Action, Done, ParseFailure, ToolCall, parse_action, render_tool_call
from .sandbox import Workspace, trim_middle
from .tools import ToolContext, ToolRegistry, default_registry
from .tools.tests import TestRun, run_project_tests

__all__ = ["AgentRequest", "AgentLoop", "run_agent"]

log = logging.getLogger(__name__)

OBSERVATION_CHARS = 2500
StepCallback = Callable[[StepRecord, int], None]


@dataclass(frozen=True)
class AgentRequest:
    """What the user asked: an instruction, optionally about a file and a 1-based line range."""

    instruction: str
    path: Path | None = None
    line_range: tuple[int, int] | None = None
    k: int | None = None


class AgentLoop:
    """Runs episodes for one workspace with one backend."""

    def __init__(
        self,
        backend: Backend,
        workspace: Workspace,
        config,
        *,
        registry: ToolRegistry | None = None,
        store=None,
        searcher=None,
        memory=None,
        buffers: Mapping[Path, str] | None = None,
        on_step: StepCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ):
        self.backend = backend
        self.workspace = workspace
        self.config = config
        self.registry = registry or default_registry(config.language_servers)
        self.store = store
        self.searcher = searcher
        self.memory = memory
        self.buffers = buffers or {}
        self.on_step = on_step
        self.should_stop = should_stop or (lambda: False)
        self._protect_tests = False
        self._tests_before: TestRun | None = None  # the first run's tests, to the end

    # -- the episode ---------------------------------------------------------------------------

    def run(self, request: AgentRequest) -> AgentResult:
        started = time.monotonic()
        ctx = self._context()
        target = self.workspace.resolve(request.path) if request.path is not None else None
        result = AgentResult(
            new_episode_id(), request.instruction, [], [], None, "step_budget", backend=self.backend.name
        )
        # Asked about code (not its tests): a candidate that rewrites the tests is not verified by them.
        self._protect_tests = target is not None and not is_test_path(self.workspace.rel(target))
        self._tests_before = None
        conversation = self._start(ctx, request, target, result)
        try:
            self._steps(ctx, conversation, request, target, result)
        except BackendError as exc:
            result.stop_reason, result.error = "backend_error", str(exc)
        result.seconds = time.monotonic() - started
        record_episode(
            result,
            {
                "workspace": str(self.workspace.root),
                "path": str(target) if target else None,
                "range": request.line_range,
            },
        )
        return result

    def first_conversation(self, request: AgentRequest) -> Conversation:
        """What the episode's first step answers, as `run` builds it (the pre-test run included):
        the trainer prompts agent tasks with it."""
        ctx = self._context()
        target = self.workspace.resolve(request.path) if request.path is not None else None
        result = AgentResult(
            new_episode_id(), request.instruction, [], [], None, "step_budget", backend=self.backend.name
        )
        return self._start(ctx, request, target, result)

    def _context(self) -> ToolContext:
        return ToolContext(
            self.workspace, Overlay(self.workspace, self.buffers), self.config, self.store, self.memory,
            searcher=self.searcher,
        )

    def _start(
        self, ctx: ToolContext, request: AgentRequest, target: Path | None, result: AgentResult
    ) -> Conversation:
        notes = [n.body for n in self.memory.recall(request.instruction)] if self.memory else []
        budget = self.config.context_tokens
        conversation = Conversation(
            system_prompt(self.registry, self.backend.native_tools, notes),
            repo_map_for(self.store, target, budget // 3),
            select_documents(
                ctx.overlay,
                self.workspace,
                self.store,
                request.instruction,
                target,
                request.line_range,
                budget - budget // 3,
            ),
            tools=self.registry.schemas() if self.backend.native_tools else [],
        )
        pretest = self._pretest(ctx, result) if self.config.pretest else None
        rel = self.workspace.rel(target) if target else None
        conversation.copy_lines = request.line_range
        if self.config.copy_search and rel is not None and isinstance(self.backend, LocalBackend):
            text = _text_of(ctx, target)
            conversation.edit_source = (rel, text) if text is not None else None
        conversation.messages.append(
            {"role": "user", "content": first_message(request.instruction, rel, request.line_range, pretest)}
        )
        return conversation

    def _pretest(self, ctx: ToolContext, result: AgentResult) -> str | None:
        began = time.monotonic()
        run = self._tests_before = run_project_tests(ctx)
        if run.passed is False and run.failing and not run.timed_out and not self.should_stop():
            # What the model is shown stops at the first failure; the candidates are judged against
            # every test failing now, which a second run to the end finds (a run that names no
            # failing test, unittest's or one that crashed, has nothing to judge against).
            self._tests_before = run_project_tests(ctx, stop_first=False)
        if run.passed is None:
            return None
        text = f"{run.summary}\n{run.report}".strip() if not run.passed else f"all pass ({run.summary})"
        self._record(result, StepRecord("run_tests", {}, True, text, time.monotonic() - began))
        return trim_middle(text, OBSERVATION_CHARS)

    def _steps(
        self,
        ctx: ToolContext,
        conversation: Conversation,
        request: AgentRequest,
        target: Path | None,
        result: AgentResult,
    ) -> None:
        k = max(1, request.k or self.config.k)
        default_path = self.workspace.rel(target) if target else None
        reprompts = 0
        for step in range(self.config.max_steps):
            self._check_cancel()
            if result.tokens >= self.config.token_budget:
                result.stop_reason = "token_budget"
                return
            sample = self._sample(conversation, 1, 0.0, step, result)[0]
            action = self._action(sample, default_path)
            if isinstance(action, ParseFailure):
                reprompts += 1
                self._record(result, StepRecord("invalid", {}, False, action.message, answer=sample.text))
                if reprompts > self.config.reprompts:
                    result.stop_reason = "unparsable"
                    return
                if self._open_edit(conversation, default_path, _text_of(ctx, target)):
                    continue  # the same turn again, its answer started as an edit of the file
                self._reprompt(conversation, sample, action)
                continue
            reprompts = 0
            if isinstance(action, Done):
                result.stop_reason = "done"
                return
            if action.name == "edit":
                if self._candidate_round(ctx, conversation, sample, action, k, step, result):
                    return
                continue
            self._tool_step(ctx, conversation, action, result)
        result.stop_reason = "unverified" if result.candidates else "step_budget"

    # -- pieces ----------------------------------------------------------------------------------

    def _check_cancel(self) -> None:
        if self.should_stop():
            raise AgentCancelled("the agent run was cancelled")

    def _sample(
        self, conversation: Conversation, k: int, temperature: float, step: int, result: AgentResult
    ) -> list[Sample]:
        remaining = self.config.token_budget - result.tokens
        max_tokens = max(1, min(self.config.max_step_tokens, remaining // max(k, 1)))
        samples = self.backend.sample(
            conversation,
            k,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=self.config.seed + 1000 * step,
            should_stop=self.should_stop,
        )
        if not samples:
            raise BackendError("the backend returned no answer")
        result.tokens += sum(s.tokens for s in samples)
        return samples

    def _action(self, sample: Sample, default_path: str | None) -> Action:
        if sample.tool_calls:
            return sample.tool_calls[0]
        if self.backend.native_tools:
            # A native-tool model that answers in words is done (or used the text protocol anyway).
            parsed = parse_action(sample.text, default_path)
            return parsed if isinstance(parsed, ToolCall) else Done(sample.text)
        return parse_action(sample.text, default_path)

    def _open_edit(self, conversation: Conversation, path: str | None, text: str | None) -> bool:
        """After an answer of the local model that did not parse, when the request names a file
        (`agent.edit_fallback`): the next answer to the same turn starts as an edit block of that
        file, opened up to its search text, which is decoded as a copy of the file's `text`
        (`agent.copy_search`), instead of a message about the format (which a small model rarely
        follows). True when it did; once per turn."""
        if (not self.config.edit_fallback or path is None or conversation.prefill
                or not isinstance(self.backend, LocalBackend)):
            return False
        conversation.prefill = f"edit {path}\n<<<<<<< SEARCH\n"
        conversation.copy_from = text
        return True

    def _reprompt(self, conversation: Conversation, sample: Sample, failure: ParseFailure) -> None:
        conversation.messages.append({"role": "assistant", "content": trim_middle(sample.text, 800)})
        conversation.messages.append(
            {
                "role": "user",
                "content": (
                    f"That answer could not be used: {failure.message}. Answer with one ```edit, ```tool or "
                    "```done block as described."
                ),
            }
        )

    def _observe(self, conversation: Conversation, call: ToolCall, output: str, ok: bool) -> None:
        output = trim_middle(output, OBSERVATION_CHARS)
        if self.backend.native_tools:
            call_id = call.call_id or f"call_{len(conversation.messages)}"
            conversation.messages.append(tool_call_message(call_id, call.name, call.args))
            conversation.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            return
        conversation.messages.append({"role": "assistant", "content": render_tool_call(call)})
        status = "" if ok else " (failed)"
        conversation.messages.append({"role": "user", "content": f"Result of {call.name}{status}:\n{output}"})

    def _tool_step(
        self, ctx: ToolContext, conversation: Conversation, call: ToolCall, result: AgentResult
    ) -> None:
        conversation.prefill, conversation.copy_from = "", None
        began = time.monotonic()
        outcome = self.registry.call(ctx, call.name, call.args)
        self._record(
            result,
            StepRecord(str(call.name), dict(call.args), outcome.ok, outcome.output, time.monotonic() - began),
        )
        self._observe(conversation, call, outcome.output, outcome.ok)

    def _candidate_round(
        self,
        ctx: ToolContext,
        conversation: Conversation,
        first: Sample,
        action: ToolCall,
        k: int,
        step: int,
        result: AgentResult,
    ) -> bool:
        """Sample and verify K candidates; True when one is chosen (the episode ends)."""
        began = time.monotonic()
        samples = [first]
        if k > 1:
            samples += self._sample(conversation, k - 1, self.config.temperature, step + 1, result)
        round_start = len(result.candidates)
        default_path = action.args.get("path")
        for index, sample in enumerate(samples):
            self._check_cancel()
            parsed = action if index == 0 else self._action(sample, default_path)
            temperature = 0.0 if index == 0 else self.config.temperature
            result.candidates.append(verify_candidate(ctx, parsed, sample.text, temperature,
                                                      protect_tests=self._protect_tests,
                                                      tests_before=self._tests_before))
        fresh = result.candidates[round_start:]
        self._rank(conversation, samples, fresh)
        first_candidate = fresh[0]
        self._record(
            result,
            StepRecord(
                "edit",
                dict(action.args),
                first_candidate.verified,
                first_candidate.detail or "verified",
                time.monotonic() - began,
            ),
        )
        if isinstance(self.backend, LocalBackend):
            result.prompt = self.backend.prompt(conversation)
        chosen = choose(result.candidates)
        if chosen is not None:
            result.chosen, result.stop_reason = chosen, "verified"
            return True
        conversation.prefill, conversation.copy_from = "", None  # the next turn answers freely again
        self._observe(conversation, action, first_candidate.detail or "the edit was not verified", False)
        return False

    def _rank(self, conversation: Conversation, samples: list[Sample], candidates: list[Candidate]) -> None:
        """Log-probabilities for the verified candidates, computed only when there is a choice to make."""
        verified = [i for i, c in enumerate(candidates) if c.verified]
        for i, candidate in enumerate(candidates):
            candidate.logprob = samples[i].logprob
        if len(verified) < 2:
            return
        for i in verified:
            self._check_cancel()
            if candidates[i].logprob is None:
                candidates[i].logprob = self.backend.logprob(conversation, samples[i])

    def _record(self, result: AgentResult, step: StepRecord) -> None:
        result.steps.append(step)
        if self.on_step is not None:
            try:
                self.on_step(step, len(result.steps))
            except Exception:  # noqa: BLE001 - a progress reporter must not end the episode
                log.exception("step callback failed")


def run_agent(backend: Backend, workspace: Workspace, config, request: AgentRequest, **kwargs) -> AgentResult:
    """One episode (see `AgentLoop`)."""
    return AgentLoop(backend, workspace, config, **kwargs).run(request)


def _text_of(ctx: ToolContext, target: Path | None) -> str | None:
    """The overlay's text of the file asked about, or None (none asked about, or unreadable)."""
    if target is None:
        return None
    try:
        return ctx.overlay.read(target)
    except ToolError:
        return None
