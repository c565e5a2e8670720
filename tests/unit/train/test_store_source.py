"""The feedback store as the trainer's source: a kept and a reverted completion, recorded through
the real recorder into a real SQLite store, become training examples with the right references."""

from __future__ import annotations

from context.config import FeedbackConfig, TrainConfig
from feedback.recorder import FeedbackRecorder
from feedback.tracking import TextChange
from feedback.train.dataset import examples_from_source
from feedback.train.service import load_training_data
from feedback.train.store_source import COMPLETION_INSTRUCTION, FeedbackStoreSource

BEFORE = "def add(a, b):\n    \n"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(tmp_path):
    clock = Clock()
    recorder = FeedbackRecorder(FeedbackConfig(checkpoints_s=(30.0,), dismiss_after_s=10.0),
                                db_path=tmp_path / "f.db", monotonic=clock)
    kept = recorder.record_completion_episode(uri="file:///w/a.py", position=(1, 4), output="return a + b",
                                              prompt_text=BEFORE[:19], model_id="m", language="python")
    after = BEFORE.replace("    \n", "    return a + b\n")
    recorder.on_did_change("file:///w/a.py", [TextChange((1, 4), (1, 4), "return a + b")], after)
    recorder.accept_completion(kept, None, after)
    reverted = recorder.record_completion_episode(uri="file:///w/b.py", position=(1, 4), output="pass",
                                                  prompt_text=BEFORE[:19], model_id="m", language="python")
    after_b = BEFORE.replace("    \n", "    pass\n")
    recorder.on_did_change("file:///w/b.py", [TextChange((1, 4), (1, 4), "pass")], after_b)
    recorder.accept_completion(reverted, None, after_b)
    recorder.on_did_change("file:///w/b.py", [TextChange((1, 4), (1, 8), "")], BEFORE)  # undo
    shown_only = recorder.record_completion_episode(uri="file:///w/c.py", position=(1, 4), output="x = 1",
                                                    prompt_text=BEFORE[:19], model_id="m")
    clock.now += 31
    recorder.tick()
    assert recorder.flush()
    recorder.close()
    return tmp_path / "f.db", kept, reverted, shown_only


def test_kept_and_reverted_completions_become_examples(tmp_path):
    db, kept, reverted, shown_only = _record(tmp_path)
    examples = {ex.id: ex for ex in examples_from_source(FeedbackStoreSource(db))}
    assert set(examples) == {kept, reverted}  # shown and never accepted: nothing to learn from
    # Trained as the server completes: the raw text before the cursor, whose trailing indentation
    # moves into the answers (the completion path regenerates it).
    assert examples[kept].prompt_text == "def add(a, b):\n"
    assert examples[kept].kept_text == "    return a + b" and not examples[kept].reverted
    assert examples[reverted].reverted and examples[reverted].reverted_text == "    pass"
    assert examples[reverted].kept_text is None
    assert examples[kept].instruction.startswith(COMPLETION_INSTRUCTION)
    assert "def add(a, b):" in examples[kept].instruction


def test_a_missing_store_gives_no_episodes_and_training_falls_back_to_the_task_set(tmp_path):
    source = FeedbackStoreSource(tmp_path / "none.db")
    assert list(source.episodes_with_outcomes(None, None)) == []
    train, held_out, regression = load_training_data(TrainConfig(), source)
    assert train and held_out and regression
    assert not (tmp_path / "none.db").exists()


def test_a_completion_example_is_prompted_raw_and_its_samples_are_cut_as_shown(runtime):
    import torch

    from feedback.rewards import score_output
    from feedback.train.dataset import TrainingExample, reward_context
    from feedback.train.policy import example_prompt_ids, sample_example

    prompt = "def add(a, b):\n"
    example = TrainingExample(id="c", created_at=1.0, instruction="", original="", prompt_text=prompt,
                              kept_text="    return a + b", max_lines=2)
    ids = example_prompt_ids(runtime.tokenizer, example)
    assert runtime.tokenizer.decode(ids[0].tolist()) == prompt  # no chat template around it
    torch.manual_seed(0)
    group = sample_example(runtime.model, runtime.tokenizer, example, ids, 3, 40, 1.0)
    for row, text in enumerate(group.texts):
        assert sum(1 for line in text.splitlines() if line.strip()) <= 2  # cut as an editor shows it
        kept_tokens = int(group.mask[row].sum())
        covered = runtime.tokenizer.decode(group.completions[row, :kept_tokens].tolist(),
                                           skip_special_tokens=True)
        assert covered.startswith(text) and 1 <= kept_tokens <= 40
    # Bare code, indented as in the file: dedented before it is parsed and compared.
    same = score_output("    return a + b", reward_context(example))
    assert same.parts["parses"] == 1.0 and same.parts["format"] == 1.0 and same.parts["kept"] == 1.0
    fenced = score_output("```python\nreturn a - b\n```", reward_context(example))
    assert fenced.parts["format"] == 0.0 and fenced.total < same.total


def test_a_completion_that_does_not_parse_earns_nothing_however_close_to_the_kept_code():
    from feedback.rewards import score_output
    from feedback.train.dataset import TrainingExample, reward_context

    example = TrainingExample(id="c", created_at=1.0, instruction="", original="", prompt_text="def f(xs):\n",
                              kept_text="    return [x * 2 for x in xs]")
    assert score_output("    return [x * 2 for x in xs]", reward_context(example)).total == 1.0
    unfinished = score_output("    return [x * 2 for x in xs if x and", reward_context(example))
    assert unfinished.parts["kept"] > 0.8 and unfinished.total == 0.0
    reverted = TrainingExample(id="r", created_at=1.0, instruction="", original="",
                               prompt_text="def f(xs):\n", reverted=True,
                               reverted_text="    return [x * 2 for x in xs if x and")
    assert score_output("    return [x * 2 for x in xs if x and y", reward_context(reverted)).total < 0
