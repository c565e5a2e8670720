"""The lean decode engine against transformers, on the real embedded model and real code.

Greedy output must equal transformers `generate()`; prompt-lookup drafts, keystroke-incremental
prefill, a prefilled `past` and batched candidates must not change what greedy decoding produces.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from context.decode import DecodeEngine, engine_unsupported_reason
from context.quant import int4_linear, int8_linear, logit_agreement, quantize_int4
from context.runtime import PREFILL_CHUNK

REPO = Path(__file__).resolve().parents[2]


def _code(name: str, start: str, chars: int) -> str:
    text = (PROMPTS / name).read_text()
    at = text.index(start)
    return text[at : at + chars]


# Real code from this repository, cut mid-body so the model keeps writing code. Frozen copies
# (commit 6b27e70): the assertions on drafts depend on what the model writes after them.
PROMPTS = REPO / "tests" / "data" / "runtime_prompts"
STORE_PROMPT = _code("store.py.txt", "", 2000)
CONFIG_PROMPT = _code("config.py.txt", "@dataclass(frozen=True)\nclass ModelConfig", 1500)
ORIGINAL = _code("boundary.py.txt", "def cursor_context(", 900)
# An agent-style edit: the model rewrites a function it was shown, so most lines are copies.
EDIT_PROMPT = (
    "# Original code:\n" + ORIGINAL + "\n\n# The same function, with `offset` renamed to `cursor`:\n"
    + ORIGINAL.split("\n", 1)[0].replace("offset", "cursor") + "\n"
)


@contextlib.contextmanager
def configured(runtime, **changes):
    """Run with some model settings changed (the runtime is shared by the test session)."""
    before = runtime.config
    runtime.config = dataclasses.replace(before, **changes)
    try:
        yield runtime
    finally:
        runtime.config = before


def transformers_greedy(runtime, ids: list[int], new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = runtime.model.generate(
            torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=2
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("prompt", [STORE_PROMPT, CONFIG_PROMPT], ids=["store", "config"])
def test_greedy_output_equals_transformers_generate(runtime, prompt):
    ids = runtime.encode(prompt)
    expected = transformers_greedy(runtime, ids, 40)
    runtime.forget_prefix()
    result = runtime.generate(ids, max_new_tokens=40)
    assert result.text == runtime.decode(expected)
    assert result.new_tokens == len(expected)
    assert result.reused_tokens == 0
    assert result.logprob is not None and result.logprob < 0


def test_engine_logits_match_transformers_forward(runtime):
    ids = runtime.encode(CONFIG_PROMPT)[:300]
    engine = DecodeEngine(runtime.model)
    with torch.inference_mode():
        expected = runtime.model(input_ids=torch.tensor([ids])).logits[0].float()
        cache = engine.new_cache()
        first = engine.forward(torch.tensor([ids[:200]]), cache, all_logits=True)[0]
        rest = engine.forward(torch.tensor([ids[200:]]), cache, all_logits=True)[0]
    got = torch.cat([first, rest])
    assert torch.allclose(got, expected, atol=2e-3, rtol=1e-4), (got - expected).abs().max()
    assert cache.length == len(ids) and cache.ids == ids


def test_prompt_lookup_drafts_leave_greedy_output_unchanged(runtime):
    ids = runtime.encode(EDIT_PROMPT)
    runtime.forget_prefix()
    with configured(runtime, draft_tokens=0):
        plain = runtime.generate(ids, max_new_tokens=48)
    runtime.forget_prefix()
    drafted = runtime.generate(ids, max_new_tokens=48)
    assert plain.drafted_tokens == 0
    assert drafted.text == plain.text
    assert drafted.new_tokens == plain.new_tokens
    # An edit that copies its original: many tokens come from confirmed drafts.
    assert drafted.accepted_tokens >= drafted.new_tokens // 3, drafted
    # A verify pass computes each token's logits in another order than a single step: float32
    # rounding apart. Where 4-bit codes meet activations rounded to 15 bits (integer products), an
    # activation that rounding moves across a rounding boundary moves by 1/128 of its group's step,
    # so the 48 tokens' summed log-probability drifts further (0.027 measured on an AVX-512 EPYC).
    step = runtime._engine.fused_step
    drift = 0.06 if step is not None and step.activation_bits else 1e-2
    assert drafted.logprob == pytest.approx(plain.logprob, abs=drift)


def test_an_edited_prompt_prefills_from_the_first_changed_token(runtime):
    before = STORE_PROMPT
    at = len(before) // 2
    after = before[:at] + "# note\n" + before[at:]  # a keystroke-sized edit in the middle
    old_ids, new_ids = runtime.encode(before), runtime.encode(after)
    common = next(i for i, (a, b) in enumerate(zip(old_ids, new_ids, strict=False)) if a != b)

    runtime.forget_prefix()
    runtime.generate(old_ids, max_new_tokens=8)
    warm = runtime.generate(new_ids, max_new_tokens=24)
    runtime.forget_prefix()
    cold = runtime.generate(new_ids, max_new_tokens=24)

    assert warm.reused_tokens == common
    assert cold.reused_tokens == 0
    assert warm.text == cold.text
    # Typing on after the accepted text reuses everything up to the new keystroke.
    typed = new_ids + runtime.encode(warm.text)[:3]
    assert runtime.generate(typed, max_new_tokens=4).reused_tokens >= len(new_ids)


def test_a_window_that_slid_forward_keeps_the_earlier_tokens_as_context(runtime):
    ids = runtime.encode(STORE_PROMPT)
    runtime.forget_prefix()
    runtime.generate(ids[:400], max_new_tokens=4)
    slid = runtime.generate(ids[30:420], max_new_tokens=16)  # the window follows the cursor
    assert slid.head_tokens == 30
    assert slid.reused_tokens >= 370  # (more where the 4 generated tokens matched the text)
    runtime.forget_prefix()
    cold = runtime.generate(ids[:420], max_new_tokens=16)
    assert slid.text == cold.text  # the same as reading the kept tokens in the first place
    with configured(runtime, reuse_slack_tokens=0):
        exact = runtime.generate(ids[40:430], max_new_tokens=2)
    assert exact.head_tokens == 0 and exact.reused_tokens == 0


def test_prefix_reuse_can_be_turned_off(runtime):
    ids = runtime.encode(CONFIG_PROMPT)[:120]
    runtime.generate(ids, max_new_tokens=2)
    with configured(runtime, reuse_prefix=False):
        assert runtime.generate(ids, max_new_tokens=2).reused_tokens == 0


def _past_for(runtime, ids):
    with torch.inference_mode():
        return runtime.model(input_ids=torch.tensor([ids]), cache=DynamicCache(), use_cache=True).cache


def test_a_prefilled_past_is_recognised_and_the_query_reused(runtime):
    ids = runtime.encode(STORE_PROMPT)
    context_ids, query_ids = ids[:-40], ids[-40:]
    runtime.forget_prefix()
    whole = runtime.generate(ids, max_new_tokens=16)
    past = _past_for(runtime, context_ids)
    first = runtime.generate(query_ids, max_new_tokens=16, past=past)
    # A second request with an equal (copied) past reuses the query it already prefilled.
    second = runtime.generate(query_ids, max_new_tokens=16, past=_past_for(runtime, context_ids))
    assert first.text == whole.text == second.text
    assert first.reused_tokens == 0
    assert second.reused_tokens == len(query_ids) - 1
    # A different past is not mistaken for the cached one.
    other = runtime.generate(query_ids, max_new_tokens=4, past=_past_for(runtime, context_ids[1:]))
    assert other.reused_tokens == 0


def test_a_window_sliding_behind_a_held_past_keeps_its_earlier_tokens(runtime):
    # Squid references are the `past` of an inline completion; the window after them follows the
    # cursor, and a keystroke must not re-prefill it.
    ids = runtime.encode(STORE_PROMPT)
    context_ids, window = ids[:100], ids[100:]
    runtime.forget_prefix()
    runtime.generate(window[:300], max_new_tokens=4, past=_past_for(runtime, context_ids))
    slid = runtime.generate(window[20:320], max_new_tokens=12, past=_past_for(runtime, context_ids))
    assert slid.head_tokens == 20
    assert slid.reused_tokens >= 280
    runtime.forget_prefix()
    cold = runtime.generate(window[:320], max_new_tokens=12, past=_past_for(runtime, context_ids))
    assert slid.text == cold.text


def test_batched_greedy_candidates_equal_the_single_generation(runtime):
    ids = runtime.encode(CONFIG_PROMPT)
    runtime.forget_prefix()
    single = runtime.generate(ids, max_new_tokens=20)
    batch = runtime.generate_batch(ids, 3, max_new_tokens=20, temperature=0.0)
    assert [r.text for r in batch] == [single.text] * 3
    for result in batch:
        # The single greedy generation reads the output matrix through the shortlist head, whose
        # logits outside the best 32 are bfloat16: its log-probability is off by ~1e-3 per token.
        assert result.logprob == pytest.approx(single.logprob, abs=5e-2)
        assert result.reused_tokens == len(ids) - 1  # the prompt's cache is shared, not rebuilt


def test_sampled_batch_is_seeded_and_varied(runtime):
    ids = runtime.encode("def fibonacci(n):\n")
    kwargs = dict(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=7, stop=("\n\n",))
    first = runtime.generate_batch(ids, 4, **kwargs)
    again = runtime.generate_batch(ids, 4, **kwargs)
    assert [r.text for r in first] == [r.text for r in again]
    assert len({r.text for r in first}) > 1
    assert all("\n\n" not in r.text for r in first)
    assert all(r.logprob is not None and r.logprob < 0 for r in first)
    # Ranking by log-probability is what best-of-K does; each is the sum over its own tokens.
    assert all(r.new_tokens > 0 for r in first)


def test_batch_needs_at_least_one_candidate(runtime):
    with pytest.raises(ValueError, match="n >= 1"):
        runtime.generate_batch("x = 1", 0, max_new_tokens=4)


def test_should_stop_is_polled_before_every_drafted_token(runtime):
    ids = runtime.encode(EDIT_PROMPT)
    prefill_checks = -(-len(ids) // PREFILL_CHUNK)  # one per prefill chunk
    calls = {"n": 0}

    def stop_after_five_tokens():
        calls["n"] += 1
        return calls["n"] > prefill_checks + 5

    runtime.forget_prefix()
    result = runtime.generate(ids, max_new_tokens=40, should_stop=stop_after_five_tokens)
    assert result.stop_reason == "stopped_by_caller"
    assert result.new_tokens == 5


def test_a_prompt_longer_than_the_context_is_a_clear_error(runtime):
    limit = runtime.model.config.max_position_embeddings
    with pytest.raises(ValueError, match="exceed the model's context"):
        runtime.generate([17] * (limit - 4), max_new_tokens=8)
    # The runtime still serves the next request.
    assert runtime.generate("def f():\n", max_new_tokens=3).new_tokens > 0


def test_changed_weights_rebuild_the_engine_and_drop_the_cache(runtime):
    ids = runtime.encode(CONFIG_PROMPT)[:100]
    runtime.generate(ids, max_new_tokens=2)
    assert runtime.generate(ids, max_new_tokens=2).reused_tokens == len(ids) - 1
    weight = runtime.model.model.norm.weight
    with torch.no_grad():
        weight.add_(0.0)  # an in-place update, as a training step makes
    assert runtime.generate(ids, max_new_tokens=2).reused_tokens == 0


def test_engine_declines_models_it_cannot_run(runtime):
    assert engine_unsupported_reason(runtime.model) is None
    config = runtime.model.config
    try:
        config.attention_bias = True
        assert "bias" in engine_unsupported_reason(runtime.model)
    finally:
        config.attention_bias = False


def test_int8_weights_stay_close_to_float32_on_real_code(runtime):
    ids = runtime.encode(STORE_PROMPT)[:256]
    candidate = DecodeEngine(runtime.model, int8_linear, quantize_head=False)  # as quantize="int8" runs
    report = logit_agreement(DecodeEngine(runtime.model), candidate, ids)
    assert report.positions == 256
    assert report.top1_agreement >= 0.9, report
    assert report.mean_kl < 0.02, report


def test_int4_codes_recover_the_embedded_models_q4_1_weights_exactly(runtime):
    weight = runtime.model.model.layers[5].mlp.down_proj.weight
    codes, scales_and_zeros = quantize_int4(weight)
    scale, zero = scales_and_zeros[..., 0].T, scales_and_zeros[..., 1].T  # [out, in/32]
    groups = (codes.view(weight.shape[0], -1, 32).float() - 8) * scale[..., None] + zero[..., None]
    assert torch.allclose(groups.view_as(weight), weight.float(), atol=1e-6, rtol=0)


def test_int4_weights_are_closer_to_float32_than_int8(runtime):
    ids = runtime.encode(CONFIG_PROMPT)[:256]
    reference = DecodeEngine(runtime.model)
    int4 = logit_agreement(reference, DecodeEngine(runtime.model, int4_linear, quantize_head=False), ids)
    int8 = logit_agreement(reference, DecodeEngine(runtime.model, int8_linear, quantize_head=False), ids)
    assert int4.top1_agreement >= 0.95, int4
    assert int4.mean_kl < 0.005, int4
    assert int4.mean_kl < int8.mean_kl


def test_quantized_runtime_generates_with_drafts_and_reuse(runtime):
    ids = runtime.encode(EDIT_PROMPT)
    with configured(runtime, quantize="int4"):
        first = runtime.generate(ids, max_new_tokens=24)
        again = runtime.generate(ids, max_new_tokens=24)
    assert first.new_tokens > 0 and first.text == again.text
    assert again.reused_tokens == len(ids) - 1
    # Back on the loaded weights: a new engine, a new cache.
    assert runtime.generate(ids, max_new_tokens=2).reused_tokens == 0


def test_prepare_builds_the_engine_before_the_first_generation(runtime):
    runtime._engine_key = None  # as after loading: no engine yet
    runtime.prepare()
    engine = runtime._engine
    assert engine is not None and runtime._engine_key is not None
    runtime.generate(runtime.encode("def f(x):\n    return"), max_new_tokens=2)
    assert runtime._engine is engine  # the generation used it, not a new one
