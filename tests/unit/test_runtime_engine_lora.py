"""The lean engine with a LoRA adapter applied (peft), on the real embedded model and real code.

With the adapter in, generation must stay on the engine and produce what the peft-wrapped
transformers model produces; taking it off must bring back the base model's output; int8 copies of
the base weights must keep the adapter's low-rank paths. Adapter kinds the engine cannot read are
declined by name (on a tiny random Llama: building them on the embedded model would be slow).
"""

from __future__ import annotations

import pytest
import torch

from context.adapters import apply_adapter, remove_adapter
from context.decode import DecodeEngine, engine_unsupported_reason
from context.quant import logit_agreement
from tests.unit.test_runtime_engine import CONFIG_PROMPT, STORE_PROMPT, configured, transformers_greedy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NEW_TOKENS = 24


def write_adapter(model, path, seed: int, rank: int = 8, scale: float = 0.05):
    """A real peft LoRA adapter on every projection of every layer, A and B random (peft itself
    starts B at zero, which would leave the model's output unchanged)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in TARGETS:
            out_features, in_features = module.weight.shape
            prefix = f"base_model.model.{name}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) * scale
            weights[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * scale
    path.mkdir(parents=True)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), task_type="CAUSAL_LM")
    config.save_pretrained(str(path))
    save_file(weights, str(path / "adapter_model.safetensors"))
    return path




@pytest.fixture(scope="module")
def adapter_dir(runtime, tmp_path_factory):
    return write_adapter(runtime.model, tmp_path_factory.mktemp("lora") / "adapter", seed=11)


@pytest.fixture
def adapted(runtime, adapter_dir):
    """The runtime with the adapter applied for one test."""
    apply_adapter(runtime, adapter_dir, "lora-test")
    try:
        yield runtime
    finally:
        remove_adapter(runtime)


def test_the_engine_generates_with_the_adapter_as_transformers_does(runtime, adapter_dir):
    ids = runtime.encode(CONFIG_PROMPT)[:160]
    runtime.forget_prefix()
    base = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
    apply_adapter(runtime, adapter_dir, "lora-test")
    try:
        assert engine_unsupported_reason(runtime.model) is None
        assert runtime._current_engine() is not None  # not the transformers fallback
        expected = transformers_greedy(runtime, ids, NEW_TOKENS)
        adapted = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
        assert adapted.reused_tokens == 0  # keys computed without the adapter are not reused
        assert adapted.text == runtime.decode(expected)
        assert adapted.new_tokens == len(expected) == NEW_TOKENS
        assert adapted.text != base.text  # the adapter is not ignored
    finally:
        remove_adapter(runtime)
    restored = runtime.generate(ids, max_new_tokens=NEW_TOKENS)
    assert restored.reused_tokens == 0  # nor are keys computed with it
    assert restored.text == base.text


def test_engine_logits_match_the_adapted_transformers_forward(adapted):
    ids = adapted.encode(STORE_PROMPT)[:160]
    engine = DecodeEngine(adapted.model)
    with torch.inference_mode():
        expected = adapted.model(input_ids=torch.tensor([ids])).logits[0].float()
        cache = engine.new_cache()
        first = engine.forward(torch.tensor([ids[:100]]), cache, all_logits=True)[0]
        rest = engine.forward(torch.tensor([ids[100:]]), cache, all_logits=True)[0]
    diff = (torch.cat([first, rest]) - expected).abs().max()
    assert diff < 1e-3, diff


def test_int8_base_weights_keep_the_adapter(runtime, adapter_dir):
    ids = runtime.encode(STORE_PROMPT)[:128]
    base = DecodeEngine(runtime.model)  # the base weights' own tensors, kept through the swap
    apply_adapter(runtime, adapter_dir, "lora-test")
    try:
        with configured(runtime, quantize="int8"):
            engine = runtime._current_engine()
            assert engine is not None
            assert runtime.generate(ids, max_new_tokens=4).new_tokens > 0
        reference = DecodeEngine(runtime.model)
        int8 = logit_agreement(reference, engine, ids)
        without_adapter = logit_agreement(reference, base, ids)
    finally:
        remove_adapter(runtime)
    assert int8.top1_agreement >= 0.9, int8
    # Quantization moves the logits far less than dropping the adapter would.
    assert int8.mean_kl < without_adapter.mean_kl / 2, (int8, without_adapter)


# -- adapters on a tiny random Llama ---------------------------------------------------------------


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def with_lora(model, targets, **options):
    """`model` with a peft LoRA adapter injected (in place), B random so that it changes the output."""
    from peft import LoraConfig, get_peft_model

    wrapper = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), **options))
    with torch.no_grad():
        for name, parameter in wrapper.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    return wrapper.eval()


@pytest.mark.parametrize("fused", [False, True], ids=["own-tensors", "fused-copies"])
def test_projections_with_lora_on_some_of_them_match_peft(fused):
    model = tiny_llama()
    ids = torch.tensor([[5, 9, 2, 33, 17, 8, 41, 3]])
    with torch.inference_mode():
        base_logits = model(input_ids=ids).logits[0]
    with_lora(model, ["q_proj", "up_proj"])  # q beside plain k and v; up beside a plain gate
    seen = []

    def copying(weight):  # a copy of each weight, as quantizing factories make (without their error)
        seen.append(weight)
        copy = weight.detach().clone()
        return lambda x: torch.nn.functional.linear(x, copy)

    engine = DecodeEngine(model, copying if fused else None, quantize_head=False)
    with torch.inference_mode():
        expected = model(input_ids=ids).logits[0]
        got = engine.forward(ids, engine.new_cache(), all_logits=True)[0]
    assert (expected - base_logits).abs().max() > 1e-2
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    if fused:
        # The factory only ever saw base weights: q, k and v fused, then o, then gate and up, then down.
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        assert torch.equal(seen[0], torch.cat([attn.q_proj.base_layer.weight, attn.k_proj.weight,
                                               attn.v_proj.weight]))
        assert torch.equal(seen[2], torch.cat([mlp.gate_proj.weight, mlp.up_proj.base_layer.weight]))


@pytest.mark.parametrize(
    ("targets", "options", "reason"),
    [
        (["q_proj"], {"use_dora": True}, "DoRA"),
        (["q_proj", "lm_head"], {}, "lm_head is a peft Linear"),
        (["embed_tokens"], {}, "embed_tokens is a peft Embedding"),
    ],
    ids=["dora", "lm_head", "embedding"],
)
def test_adapters_the_engine_cannot_read_are_declined_by_name(targets, options, reason):
    model = tiny_llama()
    with_lora(model, targets, **options)
    assert reason in engine_unsupported_reason(model)


def test_a_merged_adapter_is_declined():
    model = tiny_llama()
    wrapper = with_lora(model, ["q_proj", "v_proj"])
    assert engine_unsupported_reason(model) is None
    wrapper.merge_adapter()
    assert "merged into the base weight" in engine_unsupported_reason(model)
    wrapper.unmerge_adapter()
    with wrapper.disable_adapter():  # nothing merged and the base output only: plain weights
        assert engine_unsupported_reason(model) is None
