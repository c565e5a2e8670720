"""One prompt, served and trained: a completion served through the real completion path, recorded
through the real recorder into a real feedback store and read back by the trainer's source, is trained
on the prompt ids the user was served, token for token; a secret in the prompt leaves no token ids."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agent.completion import Completion, CompletionRequest, complete
from context.config import CompletionConfig, FeedbackConfig
from feedback.recorder import SERVED_PROMPT_KEY, FeedbackRecorder
from feedback.tracking import TextChange
from feedback.train.dataset import TrainingExample, examples_from_source
from feedback.train.store_source import FeedbackStoreSource

REPO = Path(__file__).resolve().parents[3]
# Far more than 64 tokens of code before the cursor: the window is cut at its start.
BODY = (REPO / "context" / "boundary.py").read_text()[:2500]
URI = "file:///w/served.py"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def serve(runtime, text: str, offset: int, config: CompletionConfig) -> Completion:
    runtime.forget_prefix()  # no cached window from another test: the plain path
    completion = complete(runtime, CompletionRequest(text, offset, "python"), config)
    assert completion is not None, "the model offered nothing to record"
    return completion


def record_kept(tmp_path, text: str, offset: int, completion: Completion) -> Path:
    """Record `completion` as shown at `offset`, accepted and kept to its checkpoint; the store."""
    clock = Clock()
    db = tmp_path / "feedback.db"
    recorder = FeedbackRecorder(FeedbackConfig(checkpoints_s=(30.0,)), db_path=db, monotonic=clock)
    line = text.count("\n", 0, offset)
    position = (line, offset - (text.rfind("\n", 0, offset) + 1))
    episode = recorder.record_completion_episode(uri=URI, position=position, output=completion.text,
                                                 served=completion.prompt, model_id="m", language="python")
    after = text[:offset] + completion.text + text[offset:]
    recorder.on_did_change(URI, [TextChange(position, position, completion.text)], after)
    recorder.accept_completion(episode, None, after)
    clock.now += 31
    recorder.tick()
    assert recorder.flush()
    recorder.close()
    return db


def trained_example(db: Path) -> TrainingExample:
    (example,) = examples_from_source(FeedbackStoreSource(db))
    return example


@pytest.mark.parametrize("ending, heals", [
    ("\n\ndef total(values):\n    ", True),  # the cursor after indentation: healing cuts "\n    "
    ("\n\ndef total(values):\n    return sum(", False),
])
def test_the_trainer_prompts_with_the_ids_the_completion_was_served(runtime, tmp_path, ending, heals):
    from feedback.train.policy import completion_prompt, example_prompt_ids

    text = BODY + ending
    completion = serve(runtime, text, len(text), CompletionConfig(prefix_tokens=64, max_tokens=8))
    served = completion.prompt
    assert served.start > 0 and len(served.text) < len(text)  # the window is cut at its start
    assert bool(served.heal) == heals and not served.heal.strip()
    assert runtime.decode(list(served.ids)) + served.heal == served.text == text[served.start:]

    example = trained_example(record_kept(tmp_path, text, len(text), completion))
    assert example.served is not None and example.served.ids == served.ids
    assert example.prompt_text + example.prompt_lead == served.text
    assert example_prompt_ids(runtime.tokenizer, example)[0].tolist() == list(served.ids)
    assert completion_prompt(runtime.tokenizer, example)[1] == served.heal
    assert (example.served.prefix_tokens, example.served.max_tokens) == (64, 8)


def test_a_shorter_window_that_answered_is_the_one_trained_on(runtime, tmp_path):
    from feedback.train.policy import example_prompt_ids

    text = BODY + "\n\ndef total(values):\n    "
    config = CompletionConfig(prefix_tokens=256, keystroke_prefill_tokens=64, max_tokens=8)
    completion = serve(runtime, text, len(text), config)
    assert completion.dropped_tokens > 0 and completion.prompt_tokens == 64
    example = trained_example(record_kept(tmp_path, text, len(text), completion))
    trained = example_prompt_ids(runtime.tokenizer, example)[0].tolist()
    assert trained == list(completion.prompt.ids)[completion.dropped_tokens:] and len(trained) == 64


SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
AFTER_SECRET = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
WITH_SECRETS = (f'STRIPE_KEY = "{SECRET}"\n\n\ndef charge(amount):\n    \n'
                f'    token = "{AFTER_SECRET}"\n')


def _int_lists(value):
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _int_lists(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _int_lists(item)


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_a_secret_in_the_prompt_leaves_no_token_ids_in_the_store(runtime, tmp_path):
    from feedback.train.policy import example_prompt_ids

    offset = WITH_SECRETS.index("    \n") + 4
    completion = serve(runtime, WITH_SECRETS, offset, CompletionConfig(max_tokens=8))
    assert SECRET in completion.prompt.text and AFTER_SECRET in completion.prompt.following_lines[0]
    db = record_kept(tmp_path, WITH_SECRETS, offset, completion)

    connection = sqlite3.connect(db)
    try:
        (prompt_text, extra), = connection.execute("SELECT prompt_text, extra FROM episodes").fetchall()
    finally:
        connection.close()
    assert SECRET.encode() not in db.read_bytes() and AFTER_SECRET.encode() not in db.read_bytes()
    stored = json.loads(extra)[SERVED_PROMPT_KEY]
    assert stored["ids"] is None and "[REDACTED" in prompt_text
    assert "[REDACTED" in stored["following_lines"][0]
    secret_ids = runtime.encode(SECRET)
    assert not any(_contains(ids, secret_ids) for ids in _int_lists(json.loads(extra)))

    # The trainer tokenizes the stored, redacted window again (by the serving rule).
    example = trained_example(db)
    trained = example_prompt_ids(runtime.tokenizer, example)[0].tolist()
    assert not _contains(trained, secret_ids)
    assert runtime.decode(trained) + completion.prompt.heal == prompt_text


def test_without_a_secret_the_stored_episode_keeps_the_ids_and_the_window_once(runtime, tmp_path):
    text = "def area(width, height):\n    "
    completion = serve(runtime, text, len(text), CompletionConfig(max_tokens=8))
    db = record_kept(tmp_path, text, len(text), completion)
    connection = sqlite3.connect(db)
    try:
        (prompt_text, extra), = connection.execute("SELECT prompt_text, extra FROM episodes").fetchall()
    finally:
        connection.close()
    stored = json.loads(extra)[SERVED_PROMPT_KEY]
    # The window's text is the episode's prompt_text; the record beside it does not repeat it.
    assert prompt_text == text and "text" not in stored
    assert stored["ids"] == list(completion.prompt.ids) and stored["heal"] == completion.prompt.heal
