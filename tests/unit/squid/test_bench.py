"""`squidcode bench squid`'s measurements at a size a test can afford, with the real model: every
variant reported with figures that can be checked against what the variant computes."""

from __future__ import annotations

import math

import torch

from context.squid.bench import BenchSettings, _Bench, run_bench


def test_every_variant_is_reported_and_a_full_recompute_matches_full_prefill(runtime, one_torch_thread):
    settings = BenchSettings(docs=2, doc_tokens=32, queries=1, runs=1, continuation=2)
    result = run_bench(runtime, settings, log=lambda message: None)
    variants = {v["name"]: v for v in result["variants"]}
    assert list(variants)[:2] == ["full", "prefix_cache"]
    assert variants["full"]["top1_agreement"] == 1.0 and variants["full"]["mean_kl"] == 0.0
    for v in variants.values():
        assert v["ttft_s"] > 0 and 0 <= v["top1_agreement"] <= 1 and 0 <= v["recomputed_fraction"] <= 1
    # 512 last tokens of two 32-token documents: the whole second one is recomputed, and the first
    # follows the prefix exactly, so the composition is full prefill.
    last = variants["squid_last512"]
    assert last["recomputed_fraction"] == 0.5
    assert last["top1_agreement"] == 1.0 and last["mean_kl"] < 1e-3
    assert variants["squid"]["recomputed_fraction"] == 0.0
    assert result["swap"]["encode_one_s"] > 0 and result["tiers"]["entry_bytes"] > 0


def test_an_attention_mask_override_changes_what_a_variant_scores(runtime, tmp_path):
    class Halved(_Bench):
        def _attention_mask(self, make, length, start):
            if make != "halved":
                return None
            mask = torch.zeros(1, 1, length, start + length)
            mask[..., self.prefix.length : start] = math.log(0.5)
            future = torch.arange(start + length)[None, :] > (start + torch.arange(length))[:, None]
            mask[0, 0][future] = -math.inf
            return mask

        def _variant_context(self, make, docs, ref_kv):
            return ref_kv if make == "halved" else super()._variant_context(make, docs, ref_kv)

    settings = BenchSettings(docs=2, doc_tokens=32, queries=1, runs=1, continuation=4)
    with torch.inference_mode():
        quality = Halved(runtime, settings, tmp_path).quality([("full", "full"), ("halved", "halved")])
    assert quality["full"]["mean_kl"] < 1e-6
    assert quality["halved"]["mean_kl"] > 1e-3  # the same keys and values, half the documents' share
