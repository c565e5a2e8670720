"""Applying a LoRA adapter to the loaded embedded model and taking it off again, in place."""

from __future__ import annotations

import pytest
import torch

from context.adapters import apply_adapter, remove_adapter
from context.errors import AdapterError


def write_adapter(runtime, path, seed: int, scale: float = 0.05):
    return write_adapter_for(runtime.model.config, path, seed, scale)


def write_adapter_for(config, path, seed: int, scale: float = 0.05):
    """A real peft LoRA adapter (q_proj and v_proj of every layer, random A and B) for a model config."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    weights = {}
    head_dim = config.hidden_size // config.num_attention_heads
    outs = {"q_proj": config.hidden_size, "v_proj": config.num_key_value_heads * head_dim}
    for layer in range(config.num_hidden_layers):
        for name, out in outs.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(4, config.hidden_size, generator=gen) * scale
            weights[f"{prefix}.lora_B.weight"] = torch.randn(out, 4, generator=gen) * scale
    path.mkdir(parents=True)
    LoraConfig(r=4, lora_alpha=8, target_modules=list(outs), task_type="CAUSAL_LM").save_pretrained(str(path))
    save_file(weights, str(path / "adapter_model.safetensors"))
    return path


def next_logits(runtime) -> torch.Tensor:
    ids = torch.tensor([runtime.encode("def add(a, b):\n    return")])
    with torch.no_grad():
        return runtime.model(input_ids=ids).logits[0, -1]


def test_apply_swap_and_remove_in_place(runtime, tmp_path):
    base = next_logits(runtime)
    model_object = runtime.model
    try:
        apply_adapter(runtime, write_adapter(runtime, tmp_path / "a", seed=1), "v0001")
        assert runtime.adapter_id == "v0001" and runtime.model is model_object
        with_a = next_logits(runtime)
        assert not torch.allclose(with_a, base, atol=1e-3)
        apply_adapter(runtime, write_adapter(runtime, tmp_path / "b", seed=2), "v0002")
        assert runtime.adapter_id == "v0002"
        assert not torch.allclose(next_logits(runtime), with_a, atol=1e-3)
        # Generation works through the runtime's own loop with the adapter in.
        assert runtime.generate("def add(a, b):\n    return", max_new_tokens=3).new_tokens > 0
    finally:
        remove_adapter(runtime)
    assert runtime.adapter_id is None
    assert torch.allclose(next_logits(runtime), base, atol=1e-5)


def test_a_broken_adapter_is_a_clear_error_and_leaves_the_base_model(runtime, tmp_path):
    base = next_logits(runtime)
    with pytest.raises(AdapterError, match="adapter_config.json is missing"):
        apply_adapter(runtime, tmp_path / "nothing", "v0009")
    broken = write_adapter(runtime, tmp_path / "broken", seed=3)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    try:
        with pytest.raises(AdapterError, match="cannot apply adapter v0010"):
            apply_adapter(runtime, broken, "v0010")
    finally:
        remove_adapter(runtime)
    assert runtime.adapter_id is None
    assert torch.allclose(next_logits(runtime), base, atol=1e-5)


def test_an_adapter_trained_in_a_fim_format_is_served_in_it(runtime, tmp_path):
    """A version whose meta.json names the format it was trained in (`feedback.train`) sets the
    runtime's `adapter_fim`; "auto" completions then build that hole, the text after the cursor in
    it; taking the adapter off (or one without the field) goes back to the prefix prompt."""
    import json

    from agent.completion import CompletionRequest, fim_format, served_prompt
    from context.boundary import cursor_context
    from context.config import CompletionConfig
    from context.fim import TAUGHT_TEMPLATE

    taught = write_adapter(runtime, tmp_path / "taught", seed=4)
    (taught / "meta.json").write_text(json.dumps({"id": "v0001", "fim": TAUGHT_TEMPLATE}))
    plain = write_adapter(runtime, tmp_path / "plain", seed=5)
    (plain / "meta.json").write_text(json.dumps({"id": "v0002"}))
    unknown = write_adapter(runtime, tmp_path / "unknown", seed=6)
    (unknown / "meta.json").write_text(json.dumps({"id": "v0003", "fim": "a format from a later version"}))
    text = "def area(r):\n    return \n\nprint(area(2))\n"
    offset = text.index("return ") + len("return ")
    request = CompletionRequest(text=text, offset=offset, language="python")
    ctx = cursor_context(text, offset, 8)
    config = CompletionConfig()
    try:
        assert fim_format(runtime, config) is None  # the embedded model has no FIM tokens of its own
        apply_adapter(runtime, taught, "v0001")
        assert runtime.adapter_fim is not None and runtime.adapter_fim.template == TAUGHT_TEMPLATE
        served = served_prompt(runtime, request, ctx, config)
        assert served.fim == TAUGHT_TEMPLATE and served.suffix == "\n\nprint(area(2))\n"
        separator = runtime.encode("<file_sep>")
        assert len(separator) == 1 and list(served.ids).count(separator[0]) == 2
        assert runtime.decode(list(served.ids)).startswith("\n\nprint(area(2))")
        assert fim_format(runtime, CompletionConfig(fim="off")) is None  # the setting still rules
        apply_adapter(runtime, plain, "v0002")
        assert runtime.adapter_fim is None and not served_prompt(runtime, request, ctx, config).fim
        apply_adapter(runtime, unknown, "v0003")
        assert runtime.adapter_fim is None
        apply_adapter(runtime, taught, "v0001")
    finally:
        remove_adapter(runtime)
    assert runtime.adapter_fim is None and fim_format(runtime, config) is None
