"""The Squid reader: distilled from full prefill with the real model, injected switched off, read
only where asked, measured by `squidcode bench squid --reader`."""

from __future__ import annotations

import json
import shutil
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from context.errors import AdapterError
from context.squid.bench import BenchSettings, ReaderVariant, _Bench, run_bench
from context.squid.compose import Recovery
from context.squid.reader import READER_FILE, load_reader, reader_info
from feedback.train.policy import attach_lora
from feedback.train.squid_reader import ReaderSettings, distil_reader, source_documents

TINY = ReaderSettings(docs=3, doc_tokens=32, query_tokens=12, continuation=6, queries_per_set=2, sets=3,
                      epochs=4, learning_rate=2e-3, rank=4, alpha=8)
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture
def sources(tmp_path) -> Path:
    """Real Python files (the standard library's) in a folder of their own."""
    folder = tmp_path / "src"
    folder.mkdir()
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "colorsys.py", "glob.py"):
        shutil.copy(STDLIB / name, folder / name)
    return folder


def _logits(runtime, text: str) -> torch.Tensor:
    with torch.inference_mode():
        return runtime.model(input_ids=torch.tensor([runtime.encode(text)])).logits[0, -1].float()


def test_a_distilled_reader_lowers_its_kl_and_leaves_the_runtime_on_the_base_model(
        runtime, sources, tmp_path, one_torch_thread):
    before = _logits(runtime, "def main(argv):\n    ")
    documents = source_documents(runtime, [sources], min_tokens=2 * TINY.doc_tokens, limit=6)
    assert len(documents) == 6 and all(len(ids) >= 64 for _, ids in documents)

    report = distil_reader(runtime, documents, tmp_path / "reader", TINY)

    assert report.tasks == TINY.sets * TINY.queries_per_set and report.documents == 6
    assert sorted(Path(name).name for name in report.sources) == sorted(p.name for p in sources.iterdir())
    assert len(report.epoch_losses) == TINY.epochs
    assert report.epoch_losses[-1] < 0.8 * report.epoch_losses[0], report.epoch_losses
    assert (tmp_path / "reader" / "adapter_config.json").is_file()
    info = reader_info(tmp_path / "reader")
    assert info["kind"] == "squid-reader" and info["recovery"] == "squid"
    assert runtime.adapter_id is None
    assert torch.equal(_logits(runtime, "def main(argv):\n    "), before)  # no LoRA left in the model


def test_a_reader_changes_the_model_only_inside_reading(runtime, tmp_path):
    path = reader_with_weights(runtime, tmp_path, scale=0.05)
    base = _logits(runtime, "import os\n")
    reader = load_reader(runtime, path)
    try:
        assert torch.equal(_logits(runtime, "import os\n"), base)
        with reader.reading():
            read = _logits(runtime, "import os\n")
        assert (read - base).abs().max() > 1e-3
        assert torch.equal(_logits(runtime, "import os\n"), base)
        assert runtime.adapter_id is None
    finally:
        reader.close()
    assert torch.equal(_logits(runtime, "import os\n"), base)


def test_a_folder_that_is_not_a_reader_for_this_model_is_refused(runtime, tmp_path):
    with pytest.raises(AdapterError, match="no Squid reader"):
        load_reader(runtime, tmp_path)
    path = reader_with_weights(runtime, tmp_path, scale=0.0)
    info = json.loads((path / READER_FILE).read_text())
    (path / READER_FILE).write_text(json.dumps({**info, "model": "another model"}))
    with pytest.raises(AdapterError, match="distilled for 'another model'"):
        load_reader(runtime, path)
    (path / READER_FILE).write_text("{not json")
    with pytest.raises(AdapterError, match="cannot be read"):
        load_reader(runtime, path)


def test_the_bench_measures_reader_variants_and_a_zero_reader_scores_as_its_composition(runtime, tmp_path,
                                                                                        one_torch_thread):
    settings = BenchSettings(docs=2, doc_tokens=32, queries=2, runs=1, continuation=3, reader_only=True,
                             reader=str(reader_with_weights(runtime, tmp_path / "zero", scale=0.0)))
    result = run_bench(runtime, settings, log=lambda message: None)
    variants = {v["name"]: v for v in result["variants"]}
    # `reader_only`: the compositions the reader reads, with and without it, beside full prefill.
    assert list(variants) == ["full", "prefix_cache", "squid", "squid_first16", "squid_first32",
                              "squid+reader", "squid_first16+reader", "squid_first32+reader"]
    for name in ("squid", "squid_first16", "squid_first32"):
        read = variants[f"{name}+reader"]
        # LoRA's B is zero: reading changes nothing, so the figures are the composition's own.
        assert read["top1_agreement"] == variants[name]["top1_agreement"]
        assert read["mean_kl"] == pytest.approx(variants[name]["mean_kl"], abs=1e-6)
        assert read["recomputed_fraction"] == variants[name]["recomputed_fraction"]
        assert read["ttft_s"] > 0
    assert runtime.adapter_id is None

    # A reader with weights: the same queries score otherwise (its quality alone, not a whole run).
    bench = _Bench(runtime, replace(settings, reader=None), tmp_path / "bench")
    bench.reader = load_reader(runtime, reader_with_weights(runtime, tmp_path / "some", scale=0.05))
    try:
        with torch.inference_mode():
            quality = bench.quality([("squid", Recovery()), ("squid+reader", ReaderVariant(Recovery()))])
    finally:
        bench.reader.close()
    assert quality["squid+reader"]["mean_kl"] != pytest.approx(quality["squid"]["mean_kl"], abs=1e-6)


def test_bench_squid_reader_only_needs_a_reader(capsys):
    from lsp_server.cli import main

    assert main(["bench", "squid", "--reader-only"]) == 2
    assert "--reader-only needs --reader DIR" in capsys.readouterr().err


def reader_with_weights(runtime, folder: Path, scale: float) -> Path:
    """A reader folder whose LoRA B matrices hold `scale`-sized random values (0: a no-op reader)."""
    from context.squid.keys import model_identity

    identity = model_identity(runtime)
    wrapper = attach_lora(runtime.model, rank=4, alpha=8, seed=1)
    try:
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in wrapper.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * scale)
        wrapper.save_pretrained(str(folder))
    finally:
        runtime.model = wrapper.unload()
    (folder / READER_FILE).write_text(json.dumps({"kind": "squid-reader", "model": identity}))
    return folder


def test_an_epoch_visits_each_set_once_with_its_tasks_together():
    from feedback.train.squid_reader import _epoch_order, _Task

    tasks = [_Task(set_index, [i], None) for i, set_index in enumerate([0, 0, 1, 2, 1, 2, 0, 1])]
    order = _epoch_order(tasks, seed=3)
    assert sorted(order) == list(range(len(tasks)))
    runs = [tasks[i].set_index for i in order]
    # Each set's tasks come together: the composition is made once per set and epoch.
    assert [s for k, s in enumerate(runs) if k == 0 or runs[k - 1] != s] == sorted(set(runs), key=runs.index)
    assert len({s for s in runs}) == 3 and _epoch_order(tasks, seed=3) == order
    assert any(_epoch_order(tasks, seed=s) != order for s in range(4, 10))
