"""The learned preference (`feedback.preference`): fitted on real standard-library function bodies,
with outcomes as a user who keeps bodies that open with a docstring would leave them, it must
predict that user on functions it never saw, refuse to be used when the outcomes carry no signal, and
enter the reward only when it was fitted."""

from __future__ import annotations

import ast
import textwrap
import zlib
from pathlib import Path

import pytest

from feedback.preference import (
    MIN_BALANCED_ACCURACY,
    PreferenceModel,
    features,
    fit_preference,
    labelled_texts,
)
from feedback.rewards import RewardContext, RewardWeights, score_output
from feedback.train.dataset import TrainingExample
from feedback.train.service import episode_reward, task_reward


def stdlib_bodies(module: str, limit: int = 60) -> list[tuple[str, str, str]]:
    """(name, body with its docstring, body without it) for documented functions of a stdlib module."""
    source = (Path(ast.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is None or len(node.body) < 2:
            continue
        doc, rest = node.body[0], node.body[1]
        body = "".join(lines[doc.lineno - 1:node.end_lineno])
        without = "".join(lines[rest.lineno - 1:node.end_lineno])
        found.append((node.name, body, without))
    return found[:limit]


def example(i: int, name: str, kept: str | None, output: str, reverted: bool = False) -> TrainingExample:
    return TrainingExample(id=f"e{i}", created_at=float(i), instruction="", original="", output=output,
                           kept_text=kept, reverted=reverted, reverted_text=output if reverted else None,
                           prompt_text="def f():\n", group=f"mod.py#{name}")


def docstring_user_examples(bodies) -> list[TrainingExample]:
    """Half the answers opened with the docstring and were kept; the other half did not, and the
    user rewrote them with the docstring in front (or, one in three, undid them)."""
    out = []
    for i, (name, with_doc, without) in enumerate(bodies):
        if i % 2:
            out.append(example(i, name, with_doc, with_doc))
        elif i % 3:
            out.append(example(i, name, with_doc, without))
        else:
            out.append(example(i, name, None, without, reverted=True))
    return out


def test_features_are_deterministic_and_ignore_indentation():
    code = '    """Say hi."""\n    return "hi"\n'
    assert features(code) == features(textwrap.dedent(code))
    assert features(code) != features('    return "hi"\n')
    assert features("") == {}


def test_outcomes_become_labels():
    kept = example(0, "a", "x = 1\n", "x = 1\n")
    rewritten = example(1, "b", '"""Doc."""\nx = 2\n', "x = 2\n")
    undone = example(2, "c", None, "x = (\n", reverted=True)
    texts, labels, groups = labelled_texts([kept, rewritten, undone])
    assert texts == ["x = 1\n", '"""Doc."""\nx = 2\n', "x = 2\n", "x = (\n"]
    assert labels == [1, 1, 0, 0]
    assert groups == ["mod.py#a", "mod.py#b", "mod.py#b", "mod.py#c"]


def test_a_docstring_preference_is_learned_and_predicts_unseen_functions():
    train = docstring_user_examples(stdlib_bodies("statistics") + stdlib_bodies("shlex"))
    fit = fit_preference(train)
    assert fit.model is not None, fit.reason
    assert fit.balanced_accuracy >= MIN_BALANCED_ACCURACY
    assert fit.kept >= 6 and fit.not_kept >= 6
    unseen = stdlib_bodies("textwrap") + stdlib_bodies("calendar")
    assert len(unseen) >= 10
    right = sum(fit.model.score(with_doc) > fit.model.score(without) for _, with_doc, without in unseen)
    assert right / len(unseen) >= 0.9


def test_outcomes_without_a_signal_are_not_used():
    bodies = stdlib_bodies("statistics") + stdlib_bodies("shlex")
    # Keep or undo by a coin the text cannot show (a hash of the function's name).
    noise = [example(i, name, body, body) if zlib.crc32(name.encode()) % 2 else
             example(i, name, None, body, reverted=True) for i, (name, body, _) in enumerate(bodies)]
    fit = fit_preference(noise)
    assert fit.model is None
    assert fit.balanced_accuracy is not None and fit.balanced_accuracy < MIN_BALANCED_ACCURACY
    assert "does not predict" in fit.reason


def test_too_few_outcomes_fit_nothing():
    fit = fit_preference(docstring_user_examples(stdlib_bodies("statistics", limit=6)))
    assert fit.model is None and fit.balanced_accuracy is None
    assert "too few" in fit.reason


def test_one_kind_of_outcome_cannot_train_a_model():
    with pytest.raises(ValueError, match="both"):
        PreferenceModel.train(["x = 1", "y = 2"], [1, 1])


def test_the_preference_enters_the_reward_only_when_fitted():
    bodies = stdlib_bodies("statistics") + stdlib_bodies("shlex")
    fit = fit_preference(docstring_user_examples(bodies))
    _, with_doc, without = stdlib_bodies("textwrap")[0]
    context = RewardContext(kept_text="pass\n", bare=True)
    plain_a, plain_b = score_output(with_doc, context), score_output(without, context)
    assert "preference" not in plain_a.parts
    learned = RewardContext(kept_text="pass\n", bare=True, preference=fit.model.score)
    a, b = score_output(with_doc, learned), score_output(without, learned)
    assert a.parts["preference"] > 0.5 > b.parts["preference"]
    assert a.total - b.total > plain_a.total - plain_b.total
    assert "preference" not in score_output(with_doc, learned, RewardWeights(preference=0)).parts
    # A completion that does not parse still earns nothing, whatever the preference says.
    assert score_output('"""Doc.\n    x = (', learned).total == 0.0


def test_episode_reward_falls_back_to_the_task_reward():
    bodies = stdlib_bodies("statistics") + stdlib_bodies("shlex")
    assert episode_reward(None, 0.3) is task_reward
    assert episode_reward(fit_preference(docstring_user_examples(bodies[:6])), 0.3) is task_reward
    fit = fit_preference(docstring_user_examples(bodies))
    assert episode_reward(fit, 0.0) is task_reward
    reward = episode_reward(fit, 0.3)
    _, with_doc, without = stdlib_bodies("textwrap")[1]
    ex = example(99, "new", "pass\n", "pass\n")
    assert reward(with_doc, ex) - reward(without, ex) > task_reward(with_doc, ex) - task_reward(without, ex)
