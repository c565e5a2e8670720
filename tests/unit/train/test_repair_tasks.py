"""Repair tasks made from the workspace's own code (`feedback.train.repair_tasks`): one-line bugs in
functions its tests cover, kept only when the tests catch them, and the reward of an agent's answer
by the same checks best-of-K runs plus the real tests (real pytest, real ruff)."""

from __future__ import annotations

import ast
import dataclasses
import textwrap

import pytest

from feedback.train.repair_tasks import (
    CHECK_WEIGHT,
    RepairTask,
    RepairWorkspace,
    mutations,
    repair_reward,
    repair_tasks,
    run_tests,
)

PAGES = textwrap.dedent('''\
    """Paging."""


    def page_count(items, per_page):
        """How many pages `items` fill."""
        if per_page <= 0:
            raise ValueError("per_page must be positive")
        return -(-len(items) // per_page)


    def page(items, number, per_page):
        """The items on page `number` (1-based)."""
        start = (number - 1) * per_page
        return items[start : start + per_page]


    def untested(x):
        return x + 1
    ''')
TEST_PAGES = textwrap.dedent('''\
    from pages import page, page_count


    def test_partial_last_page():
        assert page_count([1, 2, 3], 2) == 2


    def test_page_two():
        assert page([1, 2, 3, 4, 5], 2, 2) == [3, 4]


    def test_empty():
        assert page_count([], 3) == 0
    ''')
FIX = "```edit pages.py\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```"


def make_workspace(root):
    (root / "tests").mkdir(parents=True)
    (root / "pages.py").write_text(PAGES)
    (root / "tests" / "test_pages.py").write_text(TEST_PAGES)
    return root


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("repair") / "ws")


@pytest.fixture(scope="module")
def tasks(workspace):
    return repair_tasks(workspace, per_file=6, max_tasks=6, seed=1)


def test_mutations_are_one_line_bugs_that_parse():
    found = mutations(PAGES)
    kinds = {m.kind for m in found}
    assert {"compare", "arithmetic", "constant"} <= kinds
    lines = PAGES.splitlines()
    for m in found:
        assert lines[m.line] == m.before and m.after != m.before
        broken = "\n".join([*lines[: m.line], m.after, *lines[m.line + 1 :]])
        ast.parse(broken)
        assert m.function in ("page_count", "page", "untested")
        assert m.span[0] <= m.line + 1 <= m.span[1]
    flips = {(m.before.strip(), m.after.strip()) for m in found}
    assert ("if per_page <= 0:", "if per_page < 0:") in flips
    assert ("start = (number - 1) * per_page", "start = (number + 1) * per_page") in flips
    assert ("return x + 1", "return x - 1") in flips
    # Docstrings and the module's own lines are never touched.
    assert all('"""' not in m.before for m in found)


def test_a_task_is_a_bug_its_tests_catch(workspace, tasks):
    assert tasks, "the workspace's tests catch some of the bugs"
    for task in tasks:
        assert task.path == "pages.py" and task.test_files == ("tests/test_pages.py",)
        assert task.function in ("page_count", "page")  # `untested` has no test that fails for it
        assert task.failing and all(t.startswith("tests/test_pages.py::") for t in task.failing)
        assert task.failing[0] in task.instruction and f"`{task.function}`" in task.instruction
        broken = task.broken_text(PAGES)
        assert broken.count(task.search) == 1 and task.replace in PAGES
        assert RepairTask.from_json(task.to_json()) == task
    # The same seed makes the same tasks; the workspace itself was never changed.
    assert repair_tasks(workspace, per_file=2, max_tasks=2, seed=1) == tasks[:2]
    assert (workspace / "pages.py").read_text() == PAGES


def test_no_task_where_the_tests_already_fail(tmp_path):
    workspace = make_workspace(tmp_path / "ws")
    failing = TEST_PAGES + "\n\ndef test_broken():\n    assert False\n"
    (workspace / "tests" / "test_pages.py").write_text(failing)
    assert repair_tasks(workspace) == []


def test_the_reward_pays_for_each_check_and_for_the_tests_the_fix_repairs(workspace, tasks):
    (task, *_) = [t for t in tasks if t.function == "page_count"]
    with RepairWorkspace(workspace) as scratch:
        right = repair_reward(task, FIX.format(search=task.search, replace=task.replace), scratch, PAGES)
        assert right.checks == {"format": True, "applies": True, "parse": True, "lint": True, "tests": True}
        assert right.fixed == 1.0 and right.reward == pytest.approx(1.0)
        # Valid edits that do not fix it: the checks count, the tests do not.
        wrong = repair_reward(task, FIX.format(search=task.search, replace=task.search + "  # fixed"),
                              scratch, PAGES)
        assert wrong.checks["lint"] and wrong.checks["tests"] is False and wrong.fixed == 0.0
        assert wrong.reward == pytest.approx(4 * CHECK_WEIGHT)
        # An edit whose search text is not in the file does not apply.
        missing = repair_reward(task, FIX.format(search="not in the file", replace="x = 1"), scratch, PAGES)
        assert missing.checks["format"] and missing.checks["applies"] is False
        assert missing.reward == pytest.approx(CHECK_WEIGHT)
        # An edit of a path outside the workspace (a sample wrote "/tests/..."): the format only.
        outside = FIX.format(search=task.search, replace=task.replace).replace(task.path, "/" + task.path)
        assert outside != FIX.format(search=task.search, replace=task.replace)
        stray = repair_reward(task, outside, scratch, PAGES)
        assert stray.checks["format"] and stray.checks["applies"] is False
        assert stray.reward == pytest.approx(CHECK_WEIGHT)
        # Rewriting the tests until they pass is not a fix: the tests earn nothing.
        asserts = [line for line in TEST_PAGES.splitlines() if line.strip().startswith("assert")]
        blocks = [f"<<<<<<< SEARCH\n{line}\n=======\n    assert page and page_count\n>>>>>>> REPLACE\n"
                  for line in asserts]
        hack = "```edit tests/test_pages.py\n" + "".join(blocks) + "```"
        rewritten = repair_reward(task, hack, scratch, PAGES)
        assert rewritten.checks["lint"] and rewritten.checks["tests"] is False
        assert rewritten.reward == pytest.approx(4 * CHECK_WEIGHT) and "edits the tests" in rewritten.detail
        # Prose is not the format: nothing.
        assert repair_reward(task, "I would change the comparison.", scratch, PAGES).reward == 0.0
        # A fix that breaks another test earns nothing for the tests.
        breaks = FIX.format(search=task.search, replace=task.replace).removesuffix("\n```") + (
            "\n<<<<<<< SEARCH\n    start = (number - 1) * per_page\n=======\n"
            "    start = number * per_page\n>>>>>>> REPLACE\n```")
        other = repair_reward(task, breaks, scratch, PAGES)
        assert other.checks["lint"] and other.checks["tests"] is False
        assert other.fixed == 1.0 and other.reward == pytest.approx(4 * CHECK_WEIGHT)
    assert (workspace / "pages.py").read_text() == PAGES


def test_a_repair_example_is_prompted_as_the_agent_and_sampled_as_its_backend_cuts(workspace, tasks, runtime):
    import torch

    from agent.backends import LOCAL_PREFILL
    from feedback.train.policy import example_prompt_ids, sample_example
    from feedback.train.repair_tasks import repair_examples
    from feedback.train.service import is_repository_task, task_reward

    task = next(t for t in tasks if t.function == "page_count")
    (example,) = repair_examples([task], workspace, runtime)
    assert example.verification["max_tokens"] > 8  # an edit block gets more than a line of code
    prompt = example.chat_prompt
    # The agent's first step: its tools, the file's window with the bug in it, the task, and the
    # pre-test run's report naming the failing test; the answer starts after the opening fence.
    assert "```edit" in prompt and task.search in prompt and task.instruction in prompt
    assert task.failing[0].split("::")[-1] in prompt and prompt.endswith(LOCAL_PREFILL)
    assert is_repository_task(example) and example.group == "pages.py"
    assert (workspace / "pages.py").read_text() == PAGES  # the bug went into a copy only
    gold = FIX.format(search=task.search, replace=task.replace)
    assert task_reward(gold, example) == pytest.approx(1.0)
    assert task_reward("The bug is in the comparison.", example) == 0.0
    ids = example_prompt_ids(runtime.tokenizer, example)
    assert ids.shape[0] == 1 and runtime.tokenizer.decode(ids[0].tolist()) == prompt
    # The step's own budget bounds the samples, not the smaller one asked for (12 here, not the
    # product's: each of its tokens is a decode step of two rows after a long prompt).
    short = dataclasses.replace(example, verification={**example.verification, "max_tokens": 12})
    group = sample_example(runtime.model, runtime.tokenizer, short, ids, 2, 4, temperature=1.0)
    assert group.completions.shape[1] <= 12 and all(text.startswith(LOCAL_PREFILL) for text in group.texts)
    assert torch.all(group.mask.sum(dim=1) > 0)


def test_an_agent_step_is_cut_where_the_local_backend_stops_it():
    from agent.backends import cut_at_step_stop

    answer = "edit a.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n```\nand then some chatter"
    shown, used = cut_at_step_stop(answer)
    assert shown == answer[: answer.index("\n```\n")] + "\n```" and used == answer.index("and then")
    assert cut_at_step_stop("tool\n{}<|im_end|>more") == ("tool\n{}\n```", len("tool\n{}<|im_end|>"))
    assert cut_at_step_stop("no stop yet") == ("no stop yet", None)


def test_a_flat_group_gets_the_tasks_fix_as_its_last_sample(workspace, tasks, runtime):
    import copy

    import torch

    from context.config import TrainConfig
    from feedback.train.policy import SampledGroup, attach_lora, guided_group
    from feedback.train.repair_tasks import fix_answer, repair_examples
    from feedback.train.trainer import GrpoTrainer

    task = next(t for t in tasks if t.function == "page_count")
    (example,) = repair_examples([task], workspace, runtime)
    fix = fix_answer(task)
    assert example.verification["guide"] == fix
    # Samples of 4 tokens (the step's budget of an edit block is many decode steps of a long prompt).
    example = dataclasses.replace(example, verification={**example.verification, "max_tokens": 4})
    tokenizer = runtime.tokenizer
    sampled, mask = torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    group = SampledGroup(torch.tensor([[1, 2]]), sampled, mask, ["a", "b"], None)
    guided = guided_group(tokenizer, example, group, fix)
    ids = tokenizer.encode(fix.removeprefix("```") + "\n", add_special_tokens=False)
    assert guided.texts == ["a", fix] and guided.completions.shape == (2, max(3, len(ids)))
    assert guided.completions[1, : len(ids)].tolist() == ids and int(guided.mask[1].sum()) == len(ids)
    assert guided.completions[0, :3].tolist() == [5, 6, 7] and int(guided.mask[0].sum()) == 3
    assert tokenizer.decode(ids).endswith("REPLACE\n```\n")  # through the stop, as the backend stops

    # In the trainer (on a copy of the session's model): a group whose samples all earn 0 gets the
    # fix, which earns 1; with guide_flat_groups off it stays flat.
    model = attach_lora(copy.deepcopy(runtime.model), 4, 8)

    def reward(text, ex):
        return 1.0 if text == fix else 0.0

    config = TrainConfig(group_size=2, max_new_tokens=4, temperature=1.0)
    trainer = GrpoTrainer(model, tokenizer, config, [example], reward, workspace.parent / "run")
    scored = trainer._sample_and_score(example, 0)
    assert scored.group.texts[-1] == fix and scored.rewards.tolist() == [0.0, 1.0]
    flat = TrainConfig(group_size=2, max_new_tokens=4, guide_flat_groups=False)
    off = GrpoTrainer(model, tokenizer, flat, [example], reward, workspace.parent / "run-off")
    assert off._sample_and_score(example, 0).rewards.tolist() == [0.0, 0.0]


def test_a_round_makes_repair_tasks_only_when_asked(workspace, runtime):
    from context.config import SquidConfig, TrainConfig
    from feedback.train.service import repair_training_tasks

    assert repair_training_tasks(SquidConfig(), runtime, [workspace]) == []  # train.repair_tasks = 0
    examples = repair_training_tasks(SquidConfig(train=TrainConfig(repair_tasks=2)), runtime, [workspace])
    assert len(examples) == 2
    assert all(ex.verification["source"] == "repair" and ex.chat_prompt for ex in examples)


def test_tasks_are_kept_while_the_workspaces_code_stays_the_same(tmp_path):
    from feedback.train.repair_tasks import cached_repair_tasks

    workspace = make_workspace(tmp_path / "ws")
    cache = tmp_path / "train" / "repair_tasks.json"
    first = cached_repair_tasks(workspace, cache, per_file=1, max_tasks=1, seed=3)
    assert first and cache.exists()
    saved = cache.read_text()
    assert cached_repair_tasks(workspace, cache, per_file=1, max_tasks=1, seed=3) == first
    assert cache.read_text() == saved  # read back, not made again
    (workspace / "notes.txt").write_text("not code")
    assert cached_repair_tasks(workspace, cache, per_file=1, max_tasks=1, seed=3) == first
    assert cache.read_text() == saved
    (workspace / "pages.py").write_text(PAGES + "\n\ndef extra(x):\n    return x * 2\n")
    again = cached_repair_tasks(workspace, cache, per_file=1, max_tasks=1, seed=3)
    assert cache.read_text() != saved and all(t.path == "pages.py" for t in again)
    cache.write_text("{broken")
    assert cached_repair_tasks(workspace, cache, per_file=1, max_tasks=1, seed=3) == again


def test_a_run_that_dies_before_pytest_reports_is_a_failure_not_a_pass(tmp_path):
    from feedback.train.repair_tasks import run_tests

    root = make_workspace(tmp_path / "ws")
    (root / "tests" / "test_dies.py").write_text("import os\n\nos._exit(1)\n")
    outcome = run_tests(root, ["tests/test_dies.py"], 60)
    assert outcome.passed == 0 and outcome.failed >= 1, outcome
    assert run_tests(root, ["tests/test_pages.py"], 60).failed == 0  # the same workspace's tests pass


def test_run_tests_in_a_src_layout_import_the_workspace_package(tmp_path):
    root = tmp_path / "proj"
    (root / "src" / "click").mkdir(parents=True)
    (root / "src" / "click" / "__init__.py").write_text('WHERE = "workspace"\n')
    (root / "tests").mkdir()
    (root / "tests" / "test_where.py").write_text(
        "import click\n\n\ndef test_where():\n    assert click.WHERE == 'workspace'\n")
    outcome = run_tests(root, ["tests/test_where.py"], timeout_s=60)
    assert (outcome.passed, outcome.failed) == (1, 0), outcome


def test_a_repair_step_is_sampled_with_its_search_text_copied_from_the_function(workspace, tasks, runtime):
    # As the agent's local backend decodes it (`agent.copy_search`): an edit block of the task's file
    # quotes lines of the file with the bug in, starting among the function's lines.
    from agent.copy_search import copy_vocabulary
    from feedback.train.policy import sample_group, token_texts
    from feedback.train.repair_tasks import repair_examples, repair_step_constraint

    task = next(t for t in tasks if t.function == "page")
    (example,) = repair_examples([task], workspace, runtime)
    assert example.verification["copy_search"] is True
    texts = token_texts(runtime.tokenizer)
    constrain = repair_step_constraint(example, lambda: copy_vocabulary(texts))
    broken = task.broken_text(PAGES).splitlines(keepends=True)
    function = broken[task.span[0] - 1 : task.span[1]]
    opened = "edit pages.py\n<<<<<<< SEARCH\n"
    first = {texts[i] for i in constrain(opened)}
    assert first and all(any(line.startswith(t) for line in function) for t in first)
    assert not any(t.startswith("def page_count") for t in first)
    assert constrain("tool\n{") is None  # outside an edit block: free
    made = []
    off = dataclasses.replace(example, verification={**example.verification, "copy_search": False})
    assert repair_step_constraint(off, lambda: made.append(1)) is None and not made

    # The sampler holds every row to what the constraint allows after that row's text.
    import torch

    allowed = runtime.tokenizer.encode(" one two", add_special_tokens=False)
    prompt = torch.tensor([runtime.tokenizer.encode("Count:", add_special_tokens=False)])
    group = sample_group(runtime.model, runtime.tokenizer, prompt, 3, 5, temperature=1.0,
                         constrain=lambda text: set(allowed))
    assert set(group.completions.flatten().tolist()) <= set(allowed)
    # With token healing, each row first regenerates the healed text, then the constraint holds.
    healed = sample_group(runtime.model, runtime.tokenizer, prompt, 3, 8, temperature=1.0, heal="\n    ",
                          constrain=lambda text: set(allowed))
    for row in healed.completions.tolist():
        assert runtime.tokenizer.decode(row).startswith("\n    ")
        healing = next(n for n in range(1, len(row) + 1) if len(runtime.tokenizer.decode(row[:n])) >= 5)
        assert healing < len(row) and set(row[healing:]) <= set(allowed)
