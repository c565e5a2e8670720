"""Squid in the loop: a completion served after reference documents, recorded through the real
recorder into a real feedback store and read back by the trainer's source, is trained after the same
composed documents (the same tokens, in the same order and positions, the same keys and values) and
then the same window ids; a secret in a reference document never reaches the store."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch

from agent.completion import CompletionRequest, complete
from context.config import CompletionConfig, SquidCacheConfig
from context.squid.compose import prefill
from context.squid.references import CompletionReferences, file_document
from context.squid.service import SquidService
from feedback.store import REFERENCE_TABLE, SERVED_PROMPT_KEY
from tests.unit.train.test_served_prompt import record_kept, trained_example

UTIL = ("def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\n"
        "def lerp(a, b, t):\n    return a + (b - a) * t\n")
NAMES = "GREETING = 'hello'\nFAREWELL = 'goodbye'\n"
SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
WITH_SECRET = f'STRIPE_KEY = "{SECRET}"\nTIMEOUT_S = 30\n'
TEXT = "from util import clamp\n\n\ndef scaled(value):\n    return clamp("
CURRENT = "/w/cur.py"
# Small documents keep the test quick; the recovery is the product's default (first 32 tokens).
SQUID = SquidCacheConfig(document_tokens=64)


def serve_with_references(runtime, tmp_path, open_documents: dict[str, str]):
    """A completion at the end of TEXT with `open_documents` as references (encoded beforehand, as
    the background encoder would have); (the completion, the composition it was served from)."""
    service = SquidService(runtime, SQUID, tmp_path / "squid", start_thread=False)
    documents = [file_document(path, text, SQUID.document_tokens) for path, text in open_documents.items()]
    served_context = service.context_for(documents, wait=True)
    references = CompletionReferences(service, current_path=CURRENT, open_documents=open_documents,
                                      search=None)
    runtime.forget_prefix()
    completion = complete(runtime, CompletionRequest(TEXT, len(TEXT), "python", CURRENT),
                          CompletionConfig(max_tokens=8, prefix_tokens=64), references=references)
    assert completion is not None, "the model offered nothing to record"
    assert len(completion.prompt.references) == len(open_documents)
    assert service.context_for(documents) is served_context  # the composition the completion read
    return completion, served_context


def test_the_trainer_composes_the_reference_documents_the_completion_was_served(runtime, tmp_path):
    from feedback.train.policy import example_prompt_ids, reference_prefix

    completion, served_context = serve_with_references(runtime, tmp_path, {"/w/util.py": UTIL,
                                                                           "/w/names.py": NAMES})
    served = completion.prompt
    assert [ref.path for ref in served.references] == ["/w/util.py", "/w/names.py"]
    assert served.reference_tokens == served_context.offset and served.reference_prefix
    assert dict(served.reference_recovery)["first_k"] == SQUID.recompute_first

    example = trained_example(record_kept(tmp_path, TEXT, len(TEXT), completion))
    trained = example.served
    # Reference for reference: the same identities, and their texts back from the store.
    assert [(r.hash, r.path, r.tokens) for r in trained.references] == [
        (r.hash, r.path, r.tokens) for r in served.references]
    assert [r.text for r in trained.references] == [r.text for r in served.references]
    assert "def clamp" in trained.references[0].text

    prefix = reference_prefix(runtime.model, runtime.tokenizer, example)
    assert prefix is not None and prefix.exact
    # Token for token: the shared prefix and the documents at the positions they were served at...
    assert prefix.token_ids == served_context.token_ids and prefix.length == served.reference_tokens
    assert prefix.composed.spans == served_context.spans
    assert [key.content for key in prefix.composed.document_keys] == [r.hash for r in served.references]
    # ... composed as the server composed them (the same weights here: the base model) ...
    torch.testing.assert_close(prefix.composed.keys, served_context.keys, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(prefix.composed.values, served_context.values, rtol=1e-4, atol=1e-4)
    assert prefix.composed.recomputed_fraction == pytest.approx(served_context.recomputed_fraction)
    # ... and then the window the completion was served.
    assert example_prompt_ids(runtime.tokenizer, example)[0].tolist() == list(served.ids)


def test_log_probs_after_the_composed_documents_are_those_of_the_served_cache(runtime, tmp_path):
    """The policy scores a completion after the composed documents, at the positions after them:
    as the composed cache continued token by token (`context.squid.compose.prefill`) predicts it."""
    from feedback.train.logprobs import token_logprobs
    from feedback.train.policy import SampledGroup, group_logprobs, reference_prefix

    completion, _ = serve_with_references(runtime, tmp_path, {"/w/util.py": UTIL})
    example = trained_example(record_kept(tmp_path, TEXT, len(TEXT), completion))
    prefix = reference_prefix(runtime.model, runtime.tokenizer, example)
    window = list(completion.prompt.ids)
    answer = runtime.encode("value, 0, 1)")
    mask = torch.ones(1, len(answer), dtype=torch.long)
    group = SampledGroup(torch.tensor([window]), torch.tensor([answer]), mask, [""], prefix)
    with torch.no_grad():
        scored = group_logprobs(runtime.model, group, 1.0)[0]
        expected, cache, start, feed = [], prefix.composed.new_cache(), prefix.length, window
        for token in answer:
            logits = prefill(runtime, cache, feed, start)
            expected.append(torch.log_softmax(logits[0].float(), -1)[token])
            start, feed = start + len(feed), [token]
        plain = token_logprobs(runtime.model, torch.tensor([window + answer]), mask)[0]
    torch.testing.assert_close(scored, torch.stack(expected), rtol=1e-4, atol=1e-4)
    assert (scored - plain).abs().max() > 1e-3  # the documents are read: without them it differs


def test_a_secret_in_a_reference_document_never_reaches_the_store(runtime, tmp_path):
    from feedback.train.policy import reference_prefix

    completion, _ = serve_with_references(runtime, tmp_path, {"/w/settings.py": WITH_SECRET})
    (served_ref,) = completion.prompt.references
    assert SECRET in served_ref.text  # served: the model read the document as it was
    db = record_kept(tmp_path, TEXT, len(TEXT), completion)

    stored = db.read_bytes() + (db.with_name(db.name + "-wal").read_bytes()
                                if db.with_name(db.name + "-wal").exists() else b"")
    assert SECRET.encode() not in stored
    connection = sqlite3.connect(db)
    try:
        rows = connection.execute(f"SELECT hash, text, redacted FROM {REFERENCE_TABLE}").fetchall()
        (extra,), = connection.execute("SELECT extra FROM episodes").fetchall()
    finally:
        connection.close()
    ((digest, text, redacted),) = rows
    assert digest == served_ref.hash and redacted == 1 and "[REDACTED" in text and SECRET not in text
    assert "text" not in json.loads(extra)[SERVED_PROMPT_KEY]["references"][0]

    # The trainer composes the redacted text, and says that this is not what was served.
    example = trained_example(db)
    prefix = reference_prefix(runtime.model, runtime.tokenizer, example)
    assert prefix is not None and not prefix.exact
    secret_ids = runtime.encode(SECRET)
    ids = list(prefix.token_ids)
    assert not any(ids[i : i + len(secret_ids)] == secret_ids for i in range(len(ids)))


def _served_with_two_references(tokenizer):
    """(served prompt, training example) of a tiny-model completion served after two documents."""
    from context.prompt_record import ReferenceIdentity, ServedPrompt
    from context.squid.keys import token_hash
    from feedback.train.dataset import TrainingExample

    texts = ["t3 t4 t5 t6 t7", "t8 t9 t7 t6"]
    references = tuple(ReferenceIdentity(token_hash(tokenizer.encode(t, add_special_tokens=False)), None, 5,
                                         t) for t in texts)
    served = ServedPrompt(ids=(12, 13, 14), text="t12 t13 t14", references=references)
    example = TrainingExample(id="e", created_at=0.0, instruction="", original="", kept_text="t5 t5",
                              prompt_text=served.text, served=served)
    return served, example


def _record_composing_weights(monkeypatch) -> list[str | None]:
    """The adapter id active at each `ReferenceComposer.compose`, in order (None: the base model)."""
    from feedback.train.references import ReferenceComposer

    composed_with: list[str | None] = []
    original = ReferenceComposer.compose

    def spy(self, record):
        composed_with.append(self.runtime.adapter_id)
        return original(self, record)

    monkeypatch.setattr(ReferenceComposer, "compose", spy)
    return composed_with


def test_each_training_step_composes_the_references_with_the_weights_it_reads_them_with(tmp_path,
                                                                                       monkeypatch):
    """On the tiny model, `train.reference_weights = "step"`: the samples and the policy's log-probs
    read the documents as the adapter being trained encodes them (again after each optimizer step),
    the KL reference as the base model does."""
    from context.config import TrainConfig
    from feedback.train.policy import attach_lora
    from feedback.train.references import composer_for
    from feedback.train.trainer import GrpoTrainer
    from tests.unit.train.conftest import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    served, example = _served_with_two_references(tokenizer)
    composed_with = _record_composing_weights(monkeypatch)
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)
    config = TrainConfig(group_size=4, prompts_per_step=1, max_new_tokens=4, temperature=1.0, lora_rank=4,
                         lora_alpha=8, beta=0.04, checkpoint_every=100, reference_weights="step")

    def reward(text: str, _example) -> float:
        return len(text) / 16  # samples of different lengths: every group teaches something

    trainer = GrpoTrainer(model, tokenizer, config, [example], reward, tmp_path / "run")
    held_at_loss: list[int] = []  # document caches in memory when a loss begins
    group_loss = GrpoTrainer._group_loss

    def loss_spy(self, *args):
        store = composer_for(model, tokenizer).service.store
        held_at_loss.append(len(store.device_tier.entries) + len(store.cpu_tier.entries))
        return group_loss(self, *args)

    monkeypatch.setattr(GrpoTrainer, "_group_loss", loss_spy)
    records = [trainer.train_step() for _ in range(3)]
    stepped = [r for r in records if r.skipped_groups == 0]
    assert stepped, "no informative group in three steps"
    # Each step samples (and scores its samples) after the documents as the adapter encodes them at
    # that step, and its KL reference after them as the base model encodes them; then the step
    # changes the adapter, and the next composes again.
    expected, version = [], 0
    for record in records:
        expected.append(f"default@{version}")
        if record.skipped_groups == 0:
            expected.append(None)
            version += 1
    assert composed_with == expected
    # Each set of weights encoded the two documents once: the base model's caches were read again
    # (from the run folder's disk tier), the adapter's dropped at each step.
    composer = composer_for(model, tokenizer)
    assert composer.disk_dir == tmp_path / "run" / "squid"
    assert composer.service.encoded == 2 * len(set(composed_with))
    assert composer.service.store.stats()["disk"]["entries"] == 2
    # Each loss began with the memory tier empty (its compositions made, their document caches let
    # go for the backward pass's room); the base model's stayed on disk, the adapter's went.
    assert held_at_loss == [0] * len(stepped)


def test_per_round_the_adapter_encodes_the_references_once_as_the_round_began(tmp_path, monkeypatch):
    """On the tiny model, by default: every step reads the documents as the adapter's weights at the
    round's start encode them (as the server held them), encoded once and read from the run folder
    after; the weights the optimizer moves are left as they are; outside the steps (the gate) the
    trained weights encode them; a resumed round starts again from the checkpoint's weights."""
    import copy

    from context.config import TrainConfig
    from feedback.train.policy import attach_lora
    from feedback.train.references import ReferenceComposer, composer_for
    from feedback.train.trainer import GrpoTrainer
    from tests.unit.train.conftest import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    served, example = _served_with_two_references(tokenizer)
    torch.manual_seed(0)
    model = attach_lora(tiny_model(), 4, 8)
    with torch.no_grad():  # an adapter that already changes the model, as a promoted one does
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    start = copy.deepcopy(model)
    config = TrainConfig(group_size=4, prompts_per_step=1, max_new_tokens=4, temperature=1.0, lora_rank=4,
                         lora_alpha=8, beta=0.04, checkpoint_every=1, learning_rate=0.05)
    assert config.reference_weights == "round"
    composed_with = _record_composing_weights(monkeypatch)
    trainer = GrpoTrainer(model, tokenizer, config, [example], lambda text, _e: len(text) / 16,
                          tmp_path / "run")
    records = [trainer.train_step() for _ in range(3)]
    assert any(r.skipped_groups == 0 for r in records), "no informative group in three steps"
    moved = dict(model.named_parameters())
    assert any(not torch.equal(p, moved[n]) for n, p in start.named_parameters() if p.requires_grad)
    started = {a for a in composed_with if a is not None}
    assert len(started) == 1 and started.pop().startswith("default@start-")  # one set of weights

    composer = composer_for(model, tokenizer)
    # The adapter's documents and the base model's, each pair encoded once in three steps.
    assert composer.service.encoded == 4
    assert composer.service.store.stats()["disk"]["entries"] == 4
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    composer.service.store.release_memory()
    with composer.round_start():
        in_round = composer.compose(served)  # read from disk: encoded no more
    assert composer.service.encoded == 4
    after_round = composer.compose(served)  # as the gate reads them: by the trained weights

    def composed_by(weights):
        return ReferenceComposer(weights, tokenizer, per_round=False).compose(served).composed

    as_started, as_now = composed_by(start), composed_by(copy.deepcopy(model))
    assert torch.equal(in_round.composed.keys, as_started.keys)
    assert torch.equal(in_round.composed.values, as_started.values)
    assert torch.equal(after_round.composed.keys, as_now.keys)
    assert not torch.equal(as_now.keys, as_started.keys)
    # Composing swapped the start's weights in and the trained ones back: they are where they were.
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())

    # A round resumed from its checkpoint: the checkpoint's weights are the new start.
    trainer.save_checkpoint()
    resumed = GrpoTrainer(copy.deepcopy(start), tokenizer, config, [example], lambda text, _e: 0.0,
                          tmp_path / "run")
    assert resumed.resume()
    with composer_for(resumed.model, tokenizer).round_start():
        again = composer_for(resumed.model, tokenizer).compose(served)
    assert torch.equal(again.composed.keys, as_now.keys)
    # The round's caches on disk are named by the weights that encoded them: a process starting from
    # the same weights finds them, one resumed from a checkpoint (other weights) never reads them.
    assert ReferenceComposer(copy.deepcopy(start), tokenizer)._start_label == composer._start_label
    assert composer_for(resumed.model, tokenizer)._start_label != composer._start_label
