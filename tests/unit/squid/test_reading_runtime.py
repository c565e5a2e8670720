"""A Squid reader in the completion path (`squid.reader`): a copy of the model with the reader merged
in continues every composition, the documents' caches still the base model's; a request without
references, or with an adapter applied, is the base model's; a folder that is not a reader is
refused once and the server completes without it."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import pytest
import torch

from agent.completion import CompletionRequest, complete
from context.adapters import apply_adapter, remove_adapter
from context.config import CompletionConfig, SquidCacheConfig, config_from_mapping
from context.errors import AdapterError
from context.squid.reader import READER_FILE, load_reader, reading_runtime
from context.squid.references import CompletionReferences
from context.squid.service import SquidService
from lsp_server.squid_context import completion_references, stop_squid
from tests.unit.squid.test_reader import reader_with_weights
from tests.unit.test_squid_context import _config, _server_state, workspace  # noqa: F401 - fixture

UNITS = "def to_metres(feet):\n    \"\"\"Feet in metres.\"\"\"\n    return feet * 0.3048\n"
CURRENT = "from units import to_metres\n\n\ndef stride(feet):\n    return "


def _logits(runtime, text: str) -> torch.Tensor:
    with torch.inference_mode():
        return runtime.model(input_ids=torch.tensor([runtime.encode(text)])).logits[0, -1].float()


def test_a_reading_runtime_computes_what_the_reader_computes_on_a_copy_of_the_weights(runtime, tmp_path):
    path = reader_with_weights(runtime, tmp_path / "reader", scale=0.05)
    base = _logits(runtime, "import os\n")
    reader = load_reader(runtime, path)
    try:
        with reader.reading():
            read = _logits(runtime, "import os\n")
    finally:
        reader.close()

    reading = reading_runtime(runtime, path)

    assert (read - base).abs().max() > 1e-3  # the reader changes the model's answer ...
    assert torch.allclose(_logits(reading, "import os\n"), read, atol=2e-3)  # ... and merged it still does
    assert torch.equal(_logits(runtime, "import os\n"), base)  # the runtime's own weights untouched
    assert reading.model is not runtime.model and reading._lock is runtime._lock
    # Only what the reader changes is copied: the embedding and the norms are the runtime's own.
    assert reading.model.model.embed_tokens.weight is runtime.model.model.embed_tokens.weight
    assert reading.model.model.norm.weight is runtime.model.model.norm.weight
    layer, base_layer = reading.model.model.layers[3], runtime.model.model.layers[3]
    assert layer.input_layernorm.weight is base_layer.input_layernorm.weight
    assert layer.self_attn.q_proj.weight is not base_layer.self_attn.q_proj.weight
    assert reading.reader_path == path and len(reading.reader_id) == 16 and runtime.reader_id is None
    # The lean engine runs the merged copy as any model.
    assert reading.generate("def main():\n", max_new_tokens=4).new_tokens > 0
    assert reading._current_engine() is not None


def test_a_reading_runtime_is_refused_for_another_model_or_over_an_adapter(runtime, tmp_path):
    with pytest.raises(AdapterError, match="no Squid reader"):
        reading_runtime(runtime, tmp_path)
    broken = reader_with_weights(runtime, tmp_path / "broken", scale=0.0)
    (broken / "adapter_config.json").write_text("{truncated")
    with pytest.raises(AdapterError, match="no readable adapter_config.json"):
        reading_runtime(runtime, broken)
    path = reader_with_weights(runtime, tmp_path / "reader", scale=0.0)
    apply_adapter(runtime, path, "some-adapter")  # any LoRA folder applies as an adapter
    try:
        with pytest.raises(AdapterError, match="needs the base model"):
            reading_runtime(runtime, path)
    finally:
        remove_adapter(runtime)


def _references(runtime, reader=None) -> tuple[CompletionReferences, SquidService]:
    service = SquidService(runtime, SquidCacheConfig(document_tokens=64, recompute_first=0), None,
                           start_thread=False)
    references = CompletionReferences(service, current_path="/w/cur.py",
                                      open_documents={"/w/units.py": UNITS, "/w/cur.py": CURRENT},
                                      search=None, symbols=lambda names, limit: [], reader=reader)
    references.compose(CURRENT, wait=True)  # every reference encoded: the next request reads them
    return references, service


def test_a_completion_after_references_is_generated_by_the_reader(runtime, tmp_path):
    config = CompletionConfig(max_tokens=12)
    request = CompletionRequest(CURRENT, len(CURRENT), "python", "/w/cur.py")
    plain, service = _references(runtime)
    try:
        without = complete(runtime, request, config, references=plain)
        # A reader that changes nothing (LoRA's B is zero): the same answer, now the reader's.
        zero = reading_runtime(runtime, reader_with_weights(runtime, tmp_path / "zero", scale=0.0))
        with_zero = complete(runtime, request, config, references=replace_reader(plain, zero))
        # Nothing to compose (no other file open, no index): the base model answers.
        alone = CompletionReferences(service, current_path="/w/cur.py", open_documents={"/w/cur.py": CURRENT},
                                     search=None, symbols=lambda names, limit: [], reader=zero)
        unread = complete(runtime, request, config, references=alone)
    finally:
        service.stop()
    assert without is not None and without.reference_tokens > 0 and without.prompt.reader == ""
    assert with_zero is not None and with_zero.reference_tokens == without.reference_tokens
    assert with_zero.text == without.text
    assert with_zero.prompt.reader == zero.reader_id  # recorded with the episode
    assert unread is not None and unread.reference_tokens == 0 and unread.prompt.reader == ""


def replace_reader(references: CompletionReferences, reader) -> CompletionReferences:
    return CompletionReferences(references.service, current_path=references.current_path,
                                open_documents=references.open_documents, search=references.search,
                                roots=references.roots, symbols=references.symbols, reader=reader)


def test_the_server_builds_the_reader_in_the_background_and_drops_a_broken_one(
        runtime, tmp_path, workspace, caplog):  # noqa: F811 - fixture
    root, index = workspace
    current = root / "app/main.py"
    path = reader_with_weights(runtime, tmp_path / "reader", scale=0.0)
    ls = _server_state(tmp_path, index, _config(tmp_path, reader=str(path)), {current: current.read_text()})
    try:
        completion_references(ls, current.as_uri(), runtime)  # starts the build
        ls.squid_reader.join(120)
        references = completion_references(ls, current.as_uri(), runtime)
        assert references.reader is not None and references.reader.reader_path == path
        built = references.reader
        assert completion_references(ls, current.as_uri(), runtime).reader is built  # built once
        # Distilled again into the same folder: the next request starts a new build.
        info = (path / READER_FILE).read_text()
        time.sleep(0.01)
        (path / READER_FILE).write_text(info + "\n")
        completion_references(ls, current.as_uri(), runtime)
        ls.squid_reader.join(120)
        again = completion_references(ls, current.as_uri(), runtime).reader
        assert again is not None and again is not built
        # With an adapter applied the compositions are not the base model's: no reader.
        apply_adapter(runtime, path, "some-adapter")
        try:
            assert completion_references(ls, current.as_uri(), runtime).reader is None
        finally:
            remove_adapter(runtime)
    finally:
        stop_squid(ls)
    assert ls.squid_reader is None

    # A folder that is not a reader: said once, and completions go on without one.
    ls.config = _config(tmp_path, reader=str(tmp_path / "not-a-reader"))
    with caplog.at_level(logging.WARNING, logger="lsp_server.squid_context"):
        try:
            completion_references(ls, current.as_uri(), runtime)
            ls.squid_reader.join(120)
            assert completion_references(ls, current.as_uri(), runtime).reader is None
            assert completion_references(ls, current.as_uri(), runtime).reader is None
        finally:
            stop_squid(ls)
    said = [r for r in caplog.records if "is not used" in r.getMessage()]
    assert len(said) == 1 and "not-a-reader" in said[0].getMessage()


def test_squid_reader_is_read_from_the_config_and_a_bad_one_is_a_problem():
    config, problems = config_from_mapping({"squid": {"reader": "~/readers/click"}})
    assert problems == [] and config.squid.reader == "~/readers/click"
    config, problems = config_from_mapping({"squid": {"reader": 3}})
    assert config.squid.reader is None and len(problems) == 1 and "squid.reader" in problems[0]


def test_doctor_says_which_reader_completions_read_through(runtime, tmp_path):
    from lsp_server.doctor import check_squid_reader

    none = check_squid_reader(_config(tmp_path))
    assert none.ok and "none (squid.reader)" in none.detail
    path = reader_with_weights(runtime, tmp_path / "reader", scale=0.0)
    info = json.loads((path / READER_FILE).read_text())
    (path / READER_FILE).write_text(json.dumps({**info, "recovery": "squid",
                                                "report": {"tasks": 280, "epoch_losses": [0.05, 0.0213]}}))
    found = check_squid_reader(_config(tmp_path, reader=str(path)))
    assert found.ok and found.detail == (f"{path}: for {info['model']}, on squid compositions, 280 tasks, "
                                         "last epoch's KL 0.0213")
    broken = check_squid_reader(_config(tmp_path, reader=str(tmp_path / "nowhere")))
    assert not broken.ok and not broken.required and "no Squid reader" in broken.detail
    assert "squidcode train reader" in broken.fix


def test_the_reader_the_background_trainer_kept_is_read_through_and_named_by_the_doctor(
        runtime, tmp_path, workspace):  # noqa: F811 - fixture
    from context.config import TrainConfig
    from lsp_server.doctor import check_squid_reader

    root, index = workspace
    current = root / "app/main.py"
    config = replace(_config(tmp_path), train=TrainConfig(dir=str(tmp_path / "train"), reader_sets=40))
    waiting = check_squid_reader(config)
    assert waiting.ok and "has not kept one yet" in waiting.detail
    ls = _server_state(tmp_path, index, config, {current: current.read_text()})
    try:
        assert completion_references(ls, current.as_uri(), runtime).reader is None  # none kept yet
        # The scheduler keeps one:
        path = reader_with_weights(runtime, tmp_path / "train" / "reader", scale=0.0)
        completion_references(ls, current.as_uri(), runtime)  # picked up at the next request
        ls.squid_reader.join(120)
        assert completion_references(ls, current.as_uri(), runtime).reader.reader_path == path
        assert check_squid_reader(config).detail.startswith(f"{path}: for ")
    finally:
        stop_squid(ls)
