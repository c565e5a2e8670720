"""Training examples: recorded episodes (or verifiable tasks) turned into prompts with references.

An episode is one model answer the editor recorded, with its outcome at the checkpoints. The
trainer needs, per example, the prompt the model saw (rebuilt from its instruction and context
documents), the answer, the K candidates, and the outcome texts that the reward compares new samples
with (`feedback.rewards`). The feedback store provides episodes through `EpisodeSource`; a vendored
set of verifiable tasks (`load_task_set`) stands in for episodes on a new machine and in the bench.

Examples are split by time, never at random: the held-out set is the newest episodes, so an
evaluation never scores the model on episodes older than some it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from context.prompt_record import ServedPrompt
from feedback.rewards import RewardContext

__all__ = [
    "ContextDocument",
    "EpisodeSource",
    "TrainingExample",
    "example_from_episode",
    "examples_from_source",
    "load_task_set",
    "prompt_messages",
    "reward_context",
    "split_by_time",
]

SYSTEM_PROMPT = "You are squidcode, a careful Python coding assistant."
TASK_INSTRUCTION = "Complete this function. Reply with the whole function in one ```python code block."


@dataclass(frozen=True)
class ContextDocument:
    """A document the prompt included (a file or chunk), as it was when the episode ran."""

    path: str
    text: str


@dataclass(frozen=True)
class TrainingExample:
    """One prompt with everything a reward needs to judge fresh samples for it."""

    id: str
    created_at: float  # unix seconds: the split is by this
    instruction: str  # what was asked, including the code the answer replaces
    original: str  # the code before the answer; returning it unchanged is doing nothing
    context_documents: tuple[ContextDocument, ...] = ()
    output: str | None = None  # the model's recorded answer
    candidates: tuple[str, ...] = ()  # the K candidates sampled when the episode ran
    kept_text: str | None = None  # the code the user had at the last checkpoint
    reverted: bool = False
    reverted_text: str | None = None  # the answer the user reverted
    verification: dict[str, Any] = field(default_factory=dict)  # parse/lint/test results then
    test_asserts: tuple[str, ...] = ()
    language: str = "python"
    # A completion episode: the raw text before the cursor, continued as the server continues it
    # (no chat template), and its answers cut where an inline completion is cut.
    # None: a chat prompt (`prompt_messages`), as agent episodes and the task set use.
    prompt_text: str | None = None
    # The whitespace the cursor's line held before the completion (cut off `prompt_text`; the
    # answers and `kept_text` start with it). The server's prompt ended with it and regenerated it
    # (token healing), and so do the trainer's.
    prompt_lead: str = ""
    # The prompt the completion was served with (`prompt_text + prompt_lead` is its window): the
    # trainer prompts with its ids and cuts samples by its settings. None: a completion example
    # built by hand, prompted from `prompt_text` by the serving rule with the default settings.
    served: ServedPrompt | None = None
    # What the example is about (a file's function, a file): the held-out split keeps a group whole,
    # so the gate never scores the model on code it was trained on. "" = a group of its own.
    group: str = ""
    # An agent step: its whole prompt as the agent renders it for the local model (chat template,
    # tools, documents, the task; `agent.backends.build_local_prompt`), ending where the answer
    # starts. Samples continue it and are cut where the agent stops a step. None: not an agent step.
    chat_prompt: str | None = None


class EpisodeSource(Protocol):
    """Where episodes with outcomes come from (the feedback store implements it)."""

    def episodes_with_outcomes(self, since: float | None, until: float | None) -> Iterable[Any]:
        """Episodes recorded in [since, until) whose last checkpoint has an outcome."""
        ...


def example_from_episode(episode: Any) -> TrainingExample | None:
    """A training example from one stored episode; None when it cannot teach anything.

    Reads attributes (or mapping keys) named as the fields of TrainingExample, plus `outcome`
    ("kept" | "modified" | "reverted") and `context_documents` as (path, text) pairs or mappings;
    `served` may be a `ServedPrompt` or its JSON.
    An episode whose outcome left no reference text (kept nothing, reverted nothing) is skipped.
    """
    get = episode.get if isinstance(episode, dict) else lambda name, default=None: getattr(
        episode, name, default
    )
    outcome = get("outcome")
    reverted = bool(get("reverted", False)) or outcome == "reverted"
    kept_text = get("kept_text")
    reverted_text = get("reverted_text") or (get("output") if reverted else None)
    if kept_text is None and reverted_text is None:
        return None
    docs = tuple(
        ContextDocument(d["path"], d["text"]) if isinstance(d, dict) else ContextDocument(*d)
        for d in get("context_documents", ()) or ()
    )
    verification = dict(get("verification", {}) or {})
    served = get("served")
    if isinstance(served, dict):
        served = ServedPrompt.from_json(served)
    return TrainingExample(
        id=str(get("id")), created_at=float(get("created_at")), instruction=get("instruction") or "",
        original=get("original") or "", context_documents=docs, output=get("output"),
        candidates=tuple(get("candidates", ()) or ()), kept_text=kept_text, reverted=reverted,
        reverted_text=reverted_text, verification=verification,
        test_asserts=tuple(verification.get("test_asserts", ())), language=get("language") or "python",
        prompt_text=get("prompt_text"), prompt_lead=get("prompt_lead") or "", served=served,
        group=str(get("group", "") or ""), chat_prompt=get("chat_prompt"),
    )


def examples_from_source(
    source: EpisodeSource, since: float | None = None, until: float | None = None
) -> list[TrainingExample]:
    """Every usable example the source holds in [since, until), oldest first."""
    examples = [ex for ep in source.episodes_with_outcomes(since, until) if (ex := example_from_episode(ep))]
    return sorted(examples, key=lambda ex: (ex.created_at, ex.id))


def load_task_set(path: Path) -> list[TrainingExample]:
    """Verifiable tasks (complete a function so that its tests pass) as examples, oldest first.

    The real solution stands for the code a user kept, so the outcome part of the reward is
    exercised the same way as with recorded episodes.
    """
    try:
        tasks = json.loads(Path(path).read_text(encoding="utf-8"))["tasks"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot read the task set {path}: {exc}") from exc
    examples = [
        TrainingExample(
            id=task["id"], created_at=float(task["created_at"]),
            instruction=f"{TASK_INSTRUCTION}\n\n```python\n{task['original']}```",
            original=task["original"], kept_text=task["solution"], test_asserts=tuple(task["tests"]),
            language=task.get("language", "python"),
        )
        for task in tasks
    ]
    return sorted(examples, key=lambda ex: (ex.created_at, ex.id))


def split_by_time(
    examples: Sequence[TrainingExample], holdout_fraction: float
) -> tuple[list[TrainingExample], list[TrainingExample]]:
    """(train, held_out): about the newest `holdout_fraction` of the examples are held out, a whole
    group at a time.

    Groups (`TrainingExample.group`: the function or file an episode was about) are ordered by their
    newest example and held out from the newest on, with all their examples, until the fraction is
    reached; so no held-out example shares its code with a training one. A user who keeps coming back
    to the same functions would otherwise have the gate score memorised answers, and promote them.
    Training keeps at least one group.
    """
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    ordered = sorted(examples, key=lambda ex: (ex.created_at, ex.id))
    want = round(len(ordered) * holdout_fraction)
    if holdout_fraction > 0 and len(ordered) > 1:
        want = max(want, 1)
    groups: dict[str, list[TrainingExample]] = {}
    for ex in ordered:
        groups.setdefault(ex.group or f"\x00{ex.id}", []).append(ex)
    newest_first = sorted(groups.values(), key=lambda g: (g[-1].created_at, g[-1].id), reverse=True)
    held_groups: list[list[TrainingExample]] = []
    held = 0
    for group in newest_first[:-1]:  # the oldest group always trains
        if held >= want:
            break
        held_groups.append(group)
        held += len(group)
    held_ids = {ex.id for g in held_groups for ex in g}
    return [ex for ex in ordered if ex.id not in held_ids], [ex for ex in ordered if ex.id in held_ids]


def prompt_messages(example: TrainingExample) -> list[dict[str, str]]:
    """The chat the model sees: the context documents, then the instruction."""
    parts = [f"File {doc.path}:\n```\n{doc.text}\n```" for doc in example.context_documents]
    parts.append(example.instruction)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def reward_context(
    example: TrainingExample, preference: Callable[[str], float] | None = None
) -> RewardContext:
    """What `feedback.rewards.score_output` compares a fresh sample for this example with."""
    return RewardContext(
        language=example.language, original=example.original, kept_text=example.kept_text,
        reverted_text=example.reverted_text, test_asserts=example.test_asserts,
        files={doc.path: doc.text for doc in example.context_documents},
        bare=example.prompt_text is not None, preference=preference,
    )
