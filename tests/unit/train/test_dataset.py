"""Training examples from episodes (built here, against the EpisodeSource protocol), the bundled
verifiable task set, and the split by time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from feedback.rewards import score_output
from feedback.train.dataset import (
    example_from_episode,
    examples_from_source,
    load_task_set,
    prompt_messages,
    reward_context,
    split_by_time,
)
from feedback.train.service import BUNDLED_TASKS


@dataclass
class Episode:
    id: str
    created_at: float
    instruction: str
    original: str
    output: str
    outcome: str
    kept_text: str | None = None
    context_documents: list = field(default_factory=list)
    candidates: tuple = ()
    verification: dict = field(default_factory=dict)
    group: str = ""


class ListSource:
    """An EpisodeSource over a list (what the feedback store provides, held in memory)."""

    def __init__(self, episodes):
        self.episodes = episodes
        self.asked = []

    def episodes_with_outcomes(self, since, until):
        self.asked.append((since, until))
        return [
            e
            for e in self.episodes
            if (since is None or e.created_at >= since) and (until is None or e.created_at < until)
        ]


def test_kept_and_reverted_episodes_become_reference_texts():
    kept = example_from_episode(
        Episode(
            "a",
            10,
            "fix it",
            "x = 1",
            "x = 2",
            "kept",
            kept_text="x = 2",
            context_documents=[("m.py", "import os")],
            candidates=("x = 2", "x=3"),
        )
    )
    assert kept.kept_text == "x = 2" and not kept.reverted and kept.reverted_text is None
    assert kept.context_documents[0].path == "m.py" and kept.candidates == ("x = 2", "x=3")
    reverted = example_from_episode(
        Episode("b", 11, "fix it", "x = 1", "x = 9", "reverted", kept_text="x = 1")
    )
    assert reverted.reverted and reverted.reverted_text == "x = 9" and reverted.kept_text == "x = 1"
    # A mapping works as well as attributes; an episode with no reference text teaches nothing.
    assert (
        example_from_episode({"id": "c", "created_at": 1, "outcome": "kept", "kept_text": "y"}).kept_text
        == "y"
    )
    assert example_from_episode({"id": "d", "created_at": 1, "outcome": "kept"}) is None


def test_reverted_output_is_penalised_through_its_text():
    example = example_from_episode(Episode("b", 11, "fix", "x = 1", "x = 9", "reverted", kept_text="x = 1"))
    again = score_output("```python\nx = 9\n```", reward_context(example))
    other = score_output("```python\ny = x + 1\n```", reward_context(example))
    assert again.parts["reverted"] == 1.0 and again.total < other.total


def test_prompt_includes_context_documents_before_the_instruction():
    example = example_from_episode(
        Episode(
            "a",
            10,
            "fix it",
            "x = 1",
            "x = 2",
            "kept",
            kept_text="x = 2",
            context_documents=[{"path": "m.py", "text": "import os"}],
        )
    )
    user = prompt_messages(example)[-1]["content"]
    assert user.index("m.py") < user.index("import os") < user.index("fix it")


def test_source_window_and_time_order():
    episodes = [
        Episode(str(i), float(t), "q", "", "o", "kept", kept_text="k") for i, t in enumerate([5, 1, 3, 9])
    ]
    source = ListSource(episodes)
    got = examples_from_source(source, since=2, until=9)
    assert [e.created_at for e in got] == [3.0, 5.0] and source.asked == [(2, 9)]


def test_split_by_time_holds_out_the_newest():
    examples = examples_from_source(
        ListSource([Episode(str(i), float(100 - i), "q", "", "o", "kept", kept_text="k") for i in range(10)])
    )
    train, held = split_by_time(examples, 0.2)
    assert len(held) == 2 and min(e.created_at for e in held) > max(e.created_at for e in train)
    assert split_by_time(examples[:1], 0.2) == (examples[:1], [])
    with pytest.raises(ValueError):
        split_by_time(examples, 1.0)


def test_split_by_time_holds_out_whole_groups_so_no_held_out_code_was_trained_on():
    # A user comes back to functions f0..f4 in three sessions; the newest episodes touch f3 and f4.
    episodes = [
        Episode(f"{s}-{f}", 100.0 * s + f, "q", "", "o", "kept", kept_text="k", group=f"a.py#f{f}")
        for s in range(3) for f in range(5)
    ]
    train, held = split_by_time(examples_from_source(ListSource(episodes)), 0.2)
    held_groups, train_groups = {e.group for e in held}, {e.group for e in train}
    assert held_groups == {"a.py#f4"} and len(held) == 3  # f4 in all three sessions, none of it trained
    assert held_groups.isdisjoint(train_groups) and len(train) == 12
    # A bigger fraction takes the next newest group too, whole.
    train, held = split_by_time(examples_from_source(ListSource(episodes)), 0.3)
    assert {e.group for e in held} == {"a.py#f4", "a.py#f3"} and len(train) == 9
    # One group only: it trains; nothing can be held out without leaking.
    same = [Episode(str(i), float(i), "q", "", "o", "kept", kept_text="k", group="g") for i in range(5)]
    train, held = split_by_time(examples_from_source(ListSource(same)), 0.2)
    assert len(train) == 5 and held == []


def test_episode_group_is_the_file_and_the_function_being_written():
    from feedback.train.store_source import episode_group

    prefix = (
        "import os\n\n\nclass Store:\n    def load(self, path):\n        return 1\n\n"
        "    async def save(self):\n        "
    )
    assert episode_group("file:///p/a.py", prefix) == "file:///p/a.py#save"
    assert episode_group("file:///p/a.py", "x = 1\n") == "file:///p/a.py"
    assert episode_group("file:///p/a.py", None) == "file:///p/a.py"


def test_bundled_task_set_is_verifiable():
    tasks = load_task_set(BUNDLED_TASKS)
    assert len(tasks) >= 30 and len({t.id for t in tasks}) == len(tasks)
    for task in tasks[:6]:
        context = reward_context(task)
        assert score_output(f"```python\n{task.kept_text}```", context).total == pytest.approx(1.0)
        assert score_output(f"```python\n{task.original}```", context).total == 0.0  # the stub: nothing done


def test_unreadable_task_set_is_a_clear_error(tmp_path):
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps({"no": "tasks"}))
    with pytest.raises(ValueError, match="cannot read the task set"):
        load_task_set(bad)
