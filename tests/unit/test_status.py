"""The status object's pure parts: the model section before and after a load, and sections."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from context.config import ModelConfig
from lsp_server.features.status import build_status, model_section


def test_model_section_before_load_reports_the_configured_model():
    section = model_section(ModelConfig(path="/models/x", device="cuda", dtype="bfloat16"), None, None)
    assert section == {"name": "/models/x", "loaded": False, "device": "cuda", "dtype": "bfloat16",
                       "adapter": None, "error": None}


def test_model_section_reports_a_load_error():
    section = model_section(ModelConfig(), None, "model.path /nope does not exist.")
    assert section["name"] == "SmolLM2-135M-Instruct"
    assert section["loaded"] is False and section["error"] == "model.path /nope does not exist."


def test_model_section_after_load_reports_what_was_loaded():
    runtime = SimpleNamespace(model=SimpleNamespace(dtype=torch.bfloat16), source="/m", device="cuda",
                              adapter_id="lora-7")
    section = model_section(ModelConfig(), runtime, None)
    assert section == {"name": "/m", "loaded": True, "device": "cuda", "dtype": "bfloat16",
                       "adapter": "lora-7", "error": None}


def test_sections_default_override_and_a_failing_provider_is_reported():
    def broken():
        raise RuntimeError("store locked")

    status = build_status("1.2", {"loaded": False}, None, {
        "feedback": lambda: {"record": True, "share": False},
        "training": broken,
    })
    assert status["version"] == "1.2" and status["index"] == {"state": "off"}
    assert status["feedback"] == {"record": True, "share": False}
    assert status["training"] == {"error": "store locked"}
    assert build_status("1.2", {}, {"state": "ready"}, {})["training"] == {
        "state": "off", "adapter": None, "step": None}
