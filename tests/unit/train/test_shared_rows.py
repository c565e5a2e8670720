"""Sampling a group over one shared copy of its common positions: the same samples and scores as
with the cache repeated for every row, and the rows' caches hold only what they generated."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from feedback.train.policy import prefilled
from feedback.train.shared_rows import SharedRowsLayer, share_rows

from .conftest import tiny_model


def _generate(model, prompt, cache, seed: int):
    torch.manual_seed(seed)
    rows = cache.layers[0].keys.shape[0] if not isinstance(cache.layers[0], SharedRowsLayer) else 4
    inputs = prompt.expand(rows, -1)
    return model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), cache=cache,
                          max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          pad_token_id=0, output_scores=True, return_dict_in_generate=True)


def test_shared_rows_sample_what_repeated_rows_sample():
    model = tiny_model()
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 2]])
    with torch.no_grad():
        repeated = DynamicCache(config=model.config)
        model.model(input_ids=prompt[:, :-1], cache=repeated, use_cache=True)
        repeated.batch_repeat_interleave(4)
        expected = _generate(model, prompt, repeated, seed=7)
        shared = prefilled(model, prompt, None, 0, 4)
        assert all(isinstance(layer, SharedRowsLayer) for layer in shared.layers)
        assert shared.layers[0].shared_keys.shape[0] == 1  # the prompt held once
        got = _generate(model, prompt, shared, seed=7)
    assert torch.equal(got.sequences, expected.sequences)
    for a, b in zip(got.scores, expected.scores, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    # Each row holds only the tokens it generated (the last prompt token and all but the last new one).
    layer = shared.layers[0]
    assert layer.keys.shape[0] == 4 and layer.keys.shape[-2] == 12
    assert shared.get_seq_length() == prompt.shape[1] - 1 + 12


def test_reordering_rows_unshares_them_with_the_same_contents():
    model = tiny_model()
    prompt = torch.tensor([[3, 4, 5, 6, 2]])
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model.model(input_ids=prompt, cache=cache, use_cache=True)
        share_rows(cache, 3)
        layer = cache.layers[1]
        keys = torch.randn(3, *layer.shared_keys.shape[1:-2], 2, layer.shared_keys.shape[-1])
        joined, _ = layer.update(keys, keys.clone())
        layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, joined[[2, 0]]) and layer.get_seq_length() == 7
    assert layer.shared_keys.shape[-2] == 0 and layer.rows == 2
