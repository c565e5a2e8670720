"""Next edits the model path suggested, as the trainer learns from them: recorded through the real
recorder into a real SQLite store (the region and the rewrite redacted like every code text), read
back as examples prompted as the server prompted the model, sampled and cut as the server cuts a
rewrite, and rewarded by how far a rewrite moves the region towards what the developer kept."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from context.config import FeedbackConfig, SquidConfig
from context.next_edit import EditHistory, ModelAnswer, Prediction
from context.next_edit_model import ANSWER_OPENING, model_prompt, rewrite_reward, suggestion_from_rewrite
from feedback.recorder import FeedbackRecorder
from feedback.store import FeedbackStore
from feedback.tracking import TextChange
from feedback.train.dataset import example_from_episode, examples_from_source
from feedback.train.service import episode_reward, task_reward
from feedback.train.store_source import NEXT_EDIT_SOURCE, FeedbackStoreSource, episode_as_example_fields
from lsp_server.features.next_edit import record_offer

URI = "file:///w/report.py"
SECRET = "AKIAZ7QW3EXAMPLEKEY9"  # an AWS access key id's shape: redaction must catch it
CODE = f"""def report(items):
    total = 0
    key = "{SECRET}"
    for item in items:
        total += item.price
    return total
"""


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _renamed() -> tuple[EditHistory, str, int]:
    """The edit history after `total` is renamed `subtotal` on its first line, the document, and
    the cursor after the new name."""
    history = EditHistory()
    history.open(URI, CODE)
    at = CODE.index("total")
    history.change(URI, at, at + 5, "subtotal")
    text = history.text(URI)
    return history, text, text.index("subtotal") + 8


def _model_suggestion() -> tuple[str, Prediction, str]:
    """(the document after the rename, the model path's suggestion there as `predict_with_model`
    returns it, the rewrite it came from): a rewrite that carries the rename to the next line that
    uses the old name."""
    history, text, cursor = _renamed()
    messages, start, end = model_prompt(history.edits(URI), text, cursor)
    prompt = f"<chat>{messages[-1]['content']}</chat>" + ANSWER_OPENING  # as the chat template renders it
    rewrite = text[start:end].replace("        total +=", "        subtotal +=")
    found = suggestion_from_rewrite(history.edits(URI), text, start, end, rewrite)
    assert found is not None and found.text == "subtotal"
    return text, Prediction(found.start, found.end, found.text, "model",
                            ModelAnswer(prompt, start, end, rewrite)), rewrite


def _server(recorder: FeedbackRecorder, text: str) -> SimpleNamespace:
    """The parts of the language server `record_offer` reads (a stand-in: no LSP connection)."""
    return SimpleNamespace(feedback=recorder, open_document_text=lambda uri: (text, "python"),
                           runtime=SimpleNamespace(adapter_id="adapter-7"), config=SquidConfig())


def _record(tmp_path, outcome: str) -> tuple[str, str, Prediction, str]:
    """Record the model's suggestion, accept it, then keep it, change it further or undo it."""
    clock = Clock()
    recorder = FeedbackRecorder(FeedbackConfig(checkpoints_s=(30.0,), dismiss_after_s=10.0),
                                db_path=tmp_path / "f.db", monotonic=clock)
    text, found, rewrite = _model_suggestion()
    episode_id = record_offer(_server(recorder, text), URI, text, found)
    line = text[: found.start].count("\n")
    column = found.start - text.rfind("\n", 0, found.start) - 1
    after = text[: found.start] + "subtotal" + text[found.end:]
    recorder.on_did_change(URI, [TextChange((line, column), (line, column + 5), "subtotal")], after)
    assert recorder.accept_completion(episode_id, None, after)
    if outcome == "modified":  # the developer made it `sub_total`
        final = after.replace("        subtotal +=", "        sub_total +=")
        recorder.on_did_change(URI, [TextChange((line, column + 3), (line, column + 3), "_")], final)
    elif outcome == "reverted":
        recorder.on_did_change(URI, [TextChange((line, column), (line, column + 8), "total")], text)
    clock.now += 31
    recorder.tick()
    assert recorder.flush()
    recorder.close()
    return episode_id, text, found, rewrite


def _stored(tmp_path, episode_id: str):
    store = FeedbackStore(tmp_path / "f.db")
    try:
        return next(r for r in store.episodes_with_outcomes() if r.episode["id"] == episode_id)
    finally:
        store.close()


def test_a_kept_model_next_edit_becomes_an_example_prompted_as_the_model_was(tmp_path):
    episode_id, text, found, rewrite = _record(tmp_path, "kept")
    answer = found.answer
    record = _stored(tmp_path, episode_id)
    extra = record.episode["extra"]
    assert extra["next_edit_kind"] == "model" and record.episode["adapter_id"] == "adapter-7"
    # The region and the rewrite are code: stored redacted, as the prompt is.
    assert SECRET not in extra["region_before"] + extra["region_after"] and SECRET not in extra["rewrite"]
    assert SECRET in text and answer.start < text.index(SECRET) < found.start
    assert SECRET not in record.episode["prompt_text"]
    assert "subtotal +=" in extra["rewrite"]
    fields = episode_as_example_fields(record)
    example = example_from_episode(fields)
    region = extra["region_before"] + "total" + extra["region_after"]
    assert example.chat_prompt == record.episode["prompt_text"]
    assert example.chat_prompt.endswith(ANSWER_OPENING)
    assert example.original == region and example.prompt_text is None
    assert example.verification["source"] == NEXT_EDIT_SOURCE and not example.reverted
    # What to write: the region as the developer kept it, their text in place of the suggestion.
    assert example.kept_text == region.replace("        total +=", "        subtotal +=")
    assert examples_from_source(FeedbackStoreSource(tmp_path / "f.db"))[0].id == episode_id


def test_a_modified_or_reverted_next_edit_teaches_what_was_kept_or_what_not_to_write(tmp_path):
    episode_id, _, _, _ = _record(tmp_path / "m", "modified")
    modified = example_from_episode(episode_as_example_fields(_stored(tmp_path / "m", episode_id)))
    assert "        sub_total +=" in modified.kept_text and modified.reverted_text is None
    episode_id, _, _, rewrite = _record(tmp_path / "r", "reverted")
    reverted = example_from_episode(episode_as_example_fields(_stored(tmp_path / "r", episode_id)))
    assert reverted.reverted and reverted.kept_text is None
    assert "        subtotal +=" in reverted.reverted_text and SECRET not in reverted.reverted_text
    assert reverted.reverted_text == reverted.original.replace("        total +=", "        subtotal +=")


def test_a_deterministic_next_edit_or_one_stored_without_code_teaches_nothing(tmp_path):
    clock = Clock()
    recorder = FeedbackRecorder(FeedbackConfig(checkpoints_s=(30.0,), dismiss_after_s=10.0, storage="hashed"),
                                db_path=tmp_path / "f.db", monotonic=clock)
    text, found, _ = _model_suggestion()
    ids = [record_offer(_server(recorder, text), URI, text, found),
           record_offer(_server(recorder, text), "file:///w/other.py", text,
                        Prediction(found.start, found.end, found.text, "rename"))]
    after = text[: found.start] + "subtotal" + text[found.end:]
    line = text[: found.start].count("\n")
    column = found.start - text.rfind("\n", 0, found.start) - 1
    for uri, episode_id in zip((URI, "file:///w/other.py"), ids, strict=True):
        recorder.on_did_change(uri, [TextChange((line, column), (line, column + 5), "subtotal")], after)
        assert recorder.accept_completion(episode_id, None, after)
    clock.now += 31
    recorder.tick()
    assert recorder.flush()
    recorder.close()
    for episode_id in ids:
        record = _stored(tmp_path, episode_id)
        assert record.final_outcomes()  # followed to its checkpoint all the same
        assert episode_as_example_fields(record) is None
    assert _stored(tmp_path, ids[0]).episode["extra"]["region_before"] is None  # hashed: no code kept


def test_a_rewrite_earns_by_how_far_it_moves_the_region_towards_what_was_kept():
    region = "    subtotal = 0\n    for item in items:\n        total += item.price\n"
    kept = region.replace("        total +=", "        subtotal +=")
    assert rewrite_reward(kept, region, kept, None) == 1.0
    assert rewrite_reward(region, region, kept, None) == 0.0  # nothing changed: no suggestion
    wrong = region.replace("for item", "for thing")
    assert rewrite_reward(wrong, region, kept, None) < 0  # a change the developer did not make
    halfway = region.replace("        total +=", "        subtot +=")
    assert 0 < rewrite_reward(halfway, region, kept, None) < 1
    assert rewrite_reward(kept, region, None, kept) == -1.0  # what they reverted, written again
    assert rewrite_reward(region, region, None, kept) == 0.0
    assert rewrite_reward(kept.rstrip("\n"), region, kept, None) == 1.0  # the last line break is the region's
    # The trainer's reward for such an example, with or without a fitted preference, is this one.
    example = example_from_episode({"id": "n", "created_at": 1.0, "chat_prompt": "p", "original": region,
                                    "kept_text": kept, "outcome": "kept",
                                    "verification": {"source": NEXT_EDIT_SOURCE}})
    assert task_reward(kept, example) == 1.0 and task_reward(wrong, example) < 0
    assert episode_reward(None, 0.0)(halfway, example) == rewrite_reward(halfway, region, kept, None)


def test_the_trainer_samples_a_rewrite_and_cuts_it_where_the_server_does(runtime, tmp_path):
    from feedback.train.policy import example_prompt_ids, sample_example

    history, text, cursor = _renamed()
    messages, start, end = model_prompt(history.edits(URI), text, cursor)
    prompt = runtime.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    region = text[start:end]
    example = example_from_episode({
        "id": "s", "created_at": 1.0, "chat_prompt": prompt + ANSWER_OPENING, "original": region,
        "kept_text": region.replace("        total +=", "        subtotal +="), "outcome": "kept",
        "verification": {"source": NEXT_EDIT_SOURCE, "max_tokens": 120}})
    ids = example_prompt_ids(runtime.tokenizer, example)
    assert runtime.tokenizer.decode(ids[0].tolist()).endswith(ANSWER_OPENING)
    torch.manual_seed(0)
    group = sample_example(runtime.model, runtime.tokenizer, example, ids, 3, 16, temperature=0.8)
    assert group.completions.shape[1] > 16  # the region's budget, not the completion budget
    for row, rewrite in enumerate(group.texts):
        assert "```" not in rewrite
        kept_tokens = int(group.mask[row].sum())
        covered = runtime.tokenizer.decode(group.completions[row, :kept_tokens].tolist(),
                                           skip_special_tokens=True)
        assert covered.startswith(rewrite)
        if "```" in covered:  # closed: nothing after the closing fence is trained on
            assert covered.rstrip().endswith("```") or covered.index("```") == len(rewrite)
        assert -1.0 <= task_reward(rewrite, example) <= 1.0
