"""Sparse decode attention inside the real runtime: SmolLM2 on real code, switched on by ModelConfig."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from context.config import ModelConfig, config_from_mapping
from context.runtime import ModelRuntime
from context.sparse_attention import (
    ATTENTION_NAME,
    SparseAttentionSettings,
    install_sparse_attention,
    uninstall_sparse_attention,
)
from kernels.sparse_attention import build_block_summaries

SETTINGS = dict(
    sparse_min_context=128, sparse_sinks=16, sparse_window=32, sparse_top_k=4, sparse_block_size=16
)
PREFIX, STEPS = 320, 12


@pytest.fixture(scope="module")
def sparse_runtime(model_cache_dir):
    """A runtime of its own (the shared `runtime` fixture stays dense), loaded with sparse attention on."""
    return ModelRuntime(ModelConfig(sparse_attention=True, **SETTINGS), model_cache_dir).load()


@pytest.fixture(scope="module")
def code_ids(sparse_runtime):
    import json.decoder  # real code from the standard library, ~3k tokens

    return sparse_runtime.encode(Path(json.decoder.__file__).read_text())[: PREFIX + STEPS + 1]


@pytest.fixture(scope="module")
def prefilled(sparse_runtime, code_ids):
    """The cache of the first PREFIX tokens (prefill is dense whatever the attention setting)."""
    with torch.inference_mode():
        return sparse_runtime.model(input_ids=torch.tensor([code_ids[:PREFIX]]), use_cache=True).cache


def _decode(model, cache, ids: list[int], start: int, steps: int) -> tuple[torch.Tensor, object]:
    """Teacher-forced next-token logits [steps, vocab] for ids[start : start + steps], and the cache."""
    rows = []
    with torch.inference_mode():
        for t in range(start, start + steps):
            out = model(input_ids=torch.tensor([[ids[t]]]), cache=cache, use_cache=True)
            cache = out.cache
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows), cache


@pytest.fixture(scope="module")
def dense_steps(sparse_runtime, code_ids, prefilled):
    model = sparse_runtime.model
    uninstall_sparse_attention(model)
    try:
        return _decode(model, copy.deepcopy(prefilled), code_ids, PREFIX, STEPS)[0]
    finally:
        install_sparse_attention(model, ModelConfig(sparse_attention=True, **SETTINGS))


def test_the_runtime_installs_it_from_model_config(sparse_runtime):
    assert sparse_runtime.model.config._attn_implementation == ATTENTION_NAME
    assert install_sparse_attention(sparse_runtime.model, ModelConfig()) is None  # off by default
    assert sparse_runtime.model.config._attn_implementation == ATTENTION_NAME  # a no-op leaves it alone


def test_prefill_and_short_contexts_stay_dense_and_exact(sparse_runtime, code_ids):
    model = sparse_runtime.model
    stats = install_sparse_attention(model, ModelConfig(sparse_attention=True, **SETTINGS))
    prompt = torch.tensor([code_ids[:100]])
    with torch.inference_mode():
        out = model(input_ids=prompt, use_cache=True)
    short, _ = _decode(model, out.cache, code_ids, 100, 2)  # caches of 101-102 tokens: under 128
    assert stats.sparse_calls == 0 and stats.dense_calls == 3 * model.config.num_hidden_layers
    uninstall_sparse_attention(model)
    try:
        assert model.config._attn_implementation == "sdpa"
        with torch.inference_mode():
            dense = model(input_ids=prompt, use_cache=True)
        dense_short, _ = _decode(model, dense.cache, code_ids, 100, 2)
    finally:
        install_sparse_attention(model, ModelConfig(sparse_attention=True, **SETTINGS))
    assert torch.equal(out.logits, dense.logits)
    assert torch.equal(short, dense_short)


def test_all_blocks_chosen_equals_dense(sparse_runtime, code_ids, prefilled, dense_steps):
    model = sparse_runtime.model
    everything = SparseAttentionSettings(min_context=128, sinks=16, window=32, top_k=1000, block_size=16)
    stats = install_sparse_attention(model, everything)
    sparse, _ = _decode(model, copy.deepcopy(prefilled), code_ids, PREFIX, 4)
    assert stats.sparse_calls == 4 * model.config.num_hidden_layers
    assert stats.attended_tokens == stats.cached_tokens
    torch.testing.assert_close(sparse, dense_steps[:4], rtol=1e-4, atol=1e-4)


def test_sparse_decode_attends_a_fraction_and_keeps_the_top_token(sparse_runtime, code_ids, prefilled,
                                                                  dense_steps):
    model = sparse_runtime.model
    stats = install_sparse_attention(model, ModelConfig(sparse_attention=True, **SETTINGS))
    sparse, cache = _decode(model, copy.deepcopy(prefilled), code_ids, PREFIX, STEPS)
    assert stats.sparse_calls == STEPS * model.config.num_hidden_layers
    assert stats.attended_tokens < 0.45 * stats.cached_tokens  # 16 + 4 * 16 + 32-47 of 321-332
    assert not torch.allclose(sparse, dense_steps, atol=1e-3)  # it really attended to less
    agree = (sparse.argmax(-1) == dense_steps.argmax(-1)).float().mean()
    assert agree >= 0.75

    # The layers' summaries followed the growing cache (block 20 completed at 336 tokens).
    layer = model.model.layers[3].self_attn
    keys = cache.layers[3].keys
    summaries = layer._squid_sparse_summaries[0]
    assert summaries.covered == keys.shape[2] // 16 * 16
    torch.testing.assert_close(summaries.mean, build_block_summaries(keys, 16, kinds=("mean",)).mean)
    # Its chosen blocks stayed copied across the steps: fewer copies than blocks attended.
    gathered = layer._squid_sparse_gathered
    assert 0 < gathered.copied_blocks < STEPS * 3 * 4
    # Another request: a different cache of the same length gets summaries of its own.
    other = copy.deepcopy(cache)
    other.layers[3].keys.mul_(-1)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[code_ids[PREFIX + STEPS]]]), cache=other, use_cache=True)
    mine = layer._squid_sparse_summaries[0]
    other_keys = other.layers[3].keys
    torch.testing.assert_close(mine.mean, build_block_summaries(other_keys, 16, kinds=("mean",)).mean)
    assert gathered.copied_blocks == 3 * 4  # its copies were dropped and every block copied again


def test_sparse_settings_validate_in_the_model_section():
    config, problems = config_from_mapping({"model": {"sparse_attention": True, "sparse_top_k": 8}})
    assert problems == [] and config.model.sparse_attention and config.model.sparse_top_k == 8
    config, problems = config_from_mapping({"model": {"sparse_block_size": 0, "sparse_attention": "yes"}})
    assert len(problems) == 2 and not config.model.sparse_attention and config.model.sparse_block_size == 64
    config, problems = config_from_mapping({"model": {"sparse_score": "best"}})
    assert len(problems) == 1 and "sparse_score" in problems[0] and config.model.sparse_score == "mass"


class RefusingModelDouble(torch.nn.Module):
    """A model double whose attention cannot be switched (as some architectures refuse custom kernels)."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"_attn_implementation": "sdpa"})()
        self.attn = torch.nn.Module()
        self.attn.num_key_value_groups, self.attn.layer_idx = 3, 0

    def set_attn_implementation(self, name):
        raise ValueError(f"{name} is not supported by this model")


def test_a_model_that_refuses_custom_attention_stays_dense(caplog):
    model = RefusingModelDouble()
    assert install_sparse_attention(model, ModelConfig(sparse_attention=True)) is None
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.attn, "_squid_sparse_settings")
    assert "refuses custom attention" in caplog.text
