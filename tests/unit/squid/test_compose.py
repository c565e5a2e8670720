"""Encode and compose against full prefill with the real model, where they must be equal.

- one document composed == full prefill of prefix + document (+ query);
- re-rotating a document's cached keys == encoding it at the shifted positions (every layer);
- recomputing every document token (first-k with k >= length, CacheBlend at 100%) == full prefill;
- without recompute several documents differ from full prefill (what recovery is for);
- generation from a composed cache never writes into the stored entries.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from context.squid import Recovery, compose, document_key, encode_document, encode_prefix
from context.squid.encode import cache_tensors
from kernels import rope_shift

TEXTS = (
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "import os\nprint(os.getcwd())\n",
)
ATOL = 2e-4


@pytest.fixture(scope="module")
def prefix(runtime):
    return encode_prefix(runtime)


@pytest.fixture(scope="module")
def docs(runtime, prefix):
    return [encode_document(runtime, prefix, runtime.encode(t), document_key(runtime, prefix, t),
                            source=f"/w/{i}.py") for i, t in enumerate(TEXTS)]


def _full(runtime, ids: list[int], start: int = 0):
    cache = DynamicCache(config=runtime.model.config)
    positions = torch.arange(start, start + len(ids))[None]
    with torch.inference_mode():
        out = runtime.model(input_ids=torch.tensor([ids]), position_ids=positions, cache=cache,
                            use_cache=True)
    return cache, out.logits[0, -1]


def test_single_document_equals_full_prefill(runtime, prefix, docs):
    query = runtime.encode("x = add(")
    ctx = compose(runtime, prefix, docs[:1], query)
    cache, logits = _full(runtime, list(prefix.token_ids) + list(docs[0].token_ids) + query)
    keys, values = cache_tensors(cache)
    got_keys, got_values = cache_tensors(ctx.cache)
    assert got_keys.shape == keys.shape
    assert torch.allclose(got_keys, keys, atol=ATOL) and torch.allclose(got_values, values, atol=ATOL)
    assert torch.allclose(ctx.logits[0], logits, atol=ATOL)
    assert ctx.offset == prefix.length + docs[0].length
    assert ctx.spans == ((prefix.length, ctx.offset),)


@pytest.mark.parametrize("delta", [1, 37, 1000])
def test_rotated_keys_equal_encoding_at_the_shifted_positions(runtime, prefix, docs, delta):
    doc = docs[1]
    cache, _ = _full(runtime, list(prefix.token_ids) + list(doc.token_ids), start=delta)
    keys, values = cache_tensors(cache, prefix.length)
    shifted = rope_shift(doc.keys, delta, runtime.model.model.rotary_emb.inv_freq)
    assert torch.allclose(shifted, keys, atol=ATOL), (shifted - keys).abs().max()
    assert torch.allclose(doc.values, values, atol=ATOL)
    # The unshifted keys are not the answer (the test can fail).
    assert not torch.allclose(doc.keys, keys, atol=1e-2)


def test_composed_positions_and_first_document_are_exact(runtime, prefix, docs):
    ctx = compose(runtime, prefix, docs)
    cache, _ = _full(runtime, list(ctx.token_ids))
    keys, values = cache_tensors(cache)
    first_end = ctx.spans[0][1]
    assert [end - start for start, end in ctx.spans] == [d.length for d in docs]
    assert ctx.spans[1][0] == first_end and ctx.spans[2][1] == ctx.offset == keys.shape[2]
    # Prefix and first document saw exactly what full prefill saw.
    assert torch.allclose(ctx.keys[:, :, :first_end], keys[:, :, :first_end], atol=ATOL)
    # Layer 0 depends on the token and its position only: exact everywhere after re-rotation.
    assert torch.allclose(ctx.keys[0], keys[0], atol=ATOL)
    assert torch.allclose(ctx.values[0], values[0], atol=ATOL)
    # Deeper layers of later documents lost the cross-document attention.
    assert not torch.allclose(ctx.values[-1], values[-1], atol=1e-2)


@pytest.mark.parametrize(
    "recovery", [Recovery(first_k=10_000), Recovery(last_k=10_000), Recovery(blend_ratio=1.0)],
    ids=["first-all", "last-all", "blend-all"],
)
def test_recomputing_every_token_equals_full_prefill(runtime, prefix, docs, recovery):
    query = runtime.encode("s = Stack()\n")
    ctx = compose(runtime, prefix, docs, query, recovery=recovery)
    cache, logits = _full(runtime, list(ctx.token_ids) + query)
    keys, values = cache_tensors(cache)
    got_keys, got_values = cache_tensors(ctx.cache)
    assert torch.allclose(got_keys, keys, atol=1e-3) and torch.allclose(got_values, values, atol=1e-3)
    assert torch.allclose(ctx.logits[0], logits, atol=1e-3)
    plain = compose(runtime, prefix, docs, query)
    assert not torch.allclose(plain.logits[0], logits, atol=1e-2)
    assert 0 < ctx.recomputed_fraction <= 1


def test_partial_recovery_moves_toward_full_prefill(runtime, prefix, docs):
    query = runtime.encode("s = Stack()\n")
    _, logits = _full(runtime, list(prefix.token_ids) + [t for d in docs for t in d.token_ids] + query)
    error = {}
    for recovery in (Recovery(), Recovery(first_k=8), Recovery(last_k=8), Recovery(blend_ratio=0.5)):
        ctx = compose(runtime, prefix, docs, query, recovery=recovery)
        error[recovery.name] = float((ctx.logits[0] - logits).abs().max())
    recovered = ("squid_first8", "squid_last8", "squid_blend50")
    assert all(error[name] < error["squid"] for name in recovered), error


def test_last_k_recovery_recomputes_only_the_tokens_nearest_the_query(runtime, prefix, docs):
    plain = compose(runtime, prefix, docs)
    tail = compose(runtime, prefix, docs, recovery=Recovery(last_k=5))
    cut = tail.offset - 5
    assert torch.equal(tail.keys[:, :, :cut], plain.keys[:, :, :cut])
    assert torch.equal(tail.values[:, :, :cut], plain.values[:, :, :cut])
    assert not torch.allclose(tail.values[-1, :, cut:], plain.values[-1, :, cut:], atol=1e-3)
    assert tail.recomputed_fraction == pytest.approx(5 / sum(d.length for d in docs))
    assert tail.recovery.name == "squid_last5"
    # More than the documents hold: every document but the first, which follows the prefix exactly.
    whole = compose(runtime, prefix, docs, recovery=Recovery(last_k=10_000))
    first_end = whole.spans[0][1]
    assert torch.equal(whole.keys[:, :, :first_end], plain.keys[:, :, :first_end])
    lengths = [d.length for d in docs]
    assert whole.recomputed_fraction == pytest.approx(sum(lengths[1:]) / sum(lengths))


def test_a_window_that_covers_everything_changes_nothing(runtime, prefix, docs):
    for recovery in (Recovery(first_k=6), Recovery(last_k=12), Recovery(first_k=4, last_k=12)):
        whole = compose(runtime, prefix, docs, recovery=recovery)
        wide = compose(runtime, prefix, docs, recovery=replace(recovery, window=10_000))
        assert torch.allclose(wide.keys, whole.keys, atol=ATOL) and torch.allclose(wide.values, whole.values,
                                                                                   atol=ATOL)
        assert wide.recomputed_fraction == whole.recomputed_fraction


def _poked(entry, at: int):
    """`entry` (the prefix or a document) with the keys and values of its token `at` changed."""
    keys, values = entry.keys.clone(), entry.values.clone()
    keys[:, :, at] += 1.0
    values[:, :, at] -= 1.0
    return replace(entry, keys=keys, values=values)


def test_windowed_recovery_attends_only_to_the_prefix_the_sinks_and_the_window(runtime, prefix, docs):
    # The last document is recomputed attending to the prefix, each document's first 2 tokens and
    # the 4 positions before it: a change anywhere else before it leaves it as it was.
    recovery = Recovery(last_k=docs[-1].length, window=4, sinks=2)
    assert recovery.name == f"squid_last{docs[-1].length}_w4s2"
    middle = docs[1]
    assert middle.length > 8

    def last(prefix_, docs_):
        ctx = compose(runtime, prefix_, docs_, recovery=recovery)
        return ctx.keys[:, :, ctx.spans[-1][0] :], ctx.values[:, :, ctx.spans[-1][0] :]

    untouched = last(prefix, docs)
    plain = compose(runtime, prefix, docs)
    assert not torch.allclose(untouched[1], plain.values[:, :, plain.spans[-1][0] :], atol=1e-3)  # recomputed
    unseen = last(prefix, [docs[0], _poked(middle, 3), docs[2]])  # neither a sink nor in the window
    assert all(torch.equal(a, b) for a, b in zip(unseen, untouched, strict=True))
    for changed in (last(_poked(prefix, prefix.length - 1), docs),  # the prefix
                    last(prefix, [docs[0], _poked(middle, 1), docs[2]]),  # a sink
                    last(prefix, [docs[0], _poked(middle, middle.length - 2), docs[2]])):  # the window
        assert not torch.allclose(changed[1], untouched[1], atol=1e-4)


def test_generation_from_a_composed_cache_leaves_the_entries_untouched(runtime, prefix, docs):
    before = [(d.keys.clone(), d.values.clone()) for d in docs]
    prefix_keys = prefix.keys.clone()
    ctx = compose(runtime, prefix, docs[:1])
    composed = runtime.generate(runtime.encode("x = add("), max_new_tokens=6, past=ctx.new_cache())
    whole = runtime.generate(list(ctx.token_ids) + runtime.encode("x = add("), max_new_tokens=6)
    assert composed.text == whole.text
    # Twice from the same context: the first generation did not extend what the second reads.
    again = runtime.generate(runtime.encode("x = add("), max_new_tokens=6, past=ctx.new_cache())
    assert again.text == composed.text
    compose(runtime, prefix, docs, recovery=Recovery(first_k=4, blend_ratio=0.5))
    for doc, (keys, values) in zip(docs, before, strict=True):
        assert torch.equal(doc.keys, keys) and torch.equal(doc.values, values)
    assert torch.equal(prefix.keys, prefix_keys)


def test_documents_of_another_prefix_are_refused(runtime, prefix, docs):
    other = encode_prefix(runtime, "# Another prefix\n")
    with pytest.raises(ValueError, match="another prefix"):
        compose(runtime, other, docs)


@pytest.mark.parametrize("recovery", [Recovery(), Recovery(first_k=6)], ids=["rotation", "first6"])
def test_a_swap_copies_unchanged_documents_from_the_previous_composition(runtime, prefix, docs, recovery):
    # The middle document is replaced by another of the same length: the others keep their positions.
    swapped_text = "import re\nprint(re.escape(\"a.b\"))\n"
    ids = runtime.encode(swapped_text)[: docs[1].length]
    ids += runtime.encode("# pad\n" * 8)[: docs[1].length - len(ids)]
    swapped = encode_document(runtime, prefix, ids, document_key(runtime, prefix, "swapped"),
                              source="/w/s.py")
    query = runtime.encode("s = Stack()\n")
    before = compose(runtime, prefix, docs, recovery=recovery)
    before_keys = before.keys.clone()
    again = compose(runtime, prefix, [docs[0], swapped, docs[2]], query, recovery=recovery, previous=before)
    fresh = compose(runtime, prefix, [docs[0], swapped, docs[2]], query, recovery=recovery)
    assert again.reused_documents == 2 and fresh.reused_documents == 0
    assert torch.allclose(again.keys, fresh.keys, atol=1e-5)
    assert torch.allclose(again.values, fresh.values, atol=1e-5)
    assert torch.allclose(again.logits, fresh.logits, atol=1e-4)
    # first-k recovery starts at the swapped document, the second: as much work as composing afresh.
    assert again.recomputed_fraction == pytest.approx(fresh.recomputed_fraction)
    assert torch.equal(before.keys, before_keys)  # the previous composition is only read
    # Documents that moved are re-rotated, not copied; CacheBlend never copies.
    moved = compose(runtime, prefix, [docs[1], docs[0], docs[2]], recovery=recovery, previous=before)
    assert moved.reused_documents == 1  # only the last one sits where it was
    blended = compose(runtime, prefix, docs, recovery=Recovery(blend_ratio=0.5),
                      previous=compose(runtime, prefix, docs, recovery=Recovery(blend_ratio=0.5)))
    assert blended.reused_documents == 0


@pytest.mark.parametrize("following", [0, 1], ids=["itself", "next"])
def test_a_swap_refreshes_the_changed_document_and_following_ones_and_keeps_the_rest(
    runtime, prefix, docs, following
):
    # Four documents; the second is swapped. The swapped one and `following` after it are recovered
    # as a fresh composition recovers them; the ones further on keep their earlier recovery.
    four = [*docs, docs[0]]
    swapped = encode_document(runtime, prefix, runtime.encode("import os\n" * 40)[: docs[1].length],
                              document_key(runtime, prefix, "swapped-next"), source="/w/n.py")
    assert swapped.length == docs[1].length
    after = [four[0], swapped, four[2], four[3]]
    recovery = Recovery(first_k=6, following=following)
    before = compose(runtime, prefix, four, recovery=recovery)
    again = compose(runtime, prefix, after, recovery=recovery, previous=before)
    fresh = compose(runtime, prefix, after, recovery=Recovery(first_k=6))
    end_refreshed, start_kept = again.spans[1 + following][1], again.spans[2 + following][0]
    assert torch.allclose(again.keys[:, :, :end_refreshed], fresh.keys[:, :, :end_refreshed], atol=ATOL)
    assert torch.allclose(again.values[:, :, :end_refreshed], fresh.values[:, :, :end_refreshed], atol=ATOL)
    assert torch.equal(again.keys[:, :, start_kept:], before.keys[:, :, start_kept:])
    assert torch.equal(again.values[:, :, start_kept:], before.values[:, :, start_kept:])
    start_last, end_last = again.spans[3]
    assert not torch.allclose(fresh.keys[:, :, start_last:end_last], before.keys[:, :, start_last:end_last],
                              atol=1e-5)  # the old neighbour did change what the last one recovered
    # Of the three documents after the first, 1 + `following` have their first tokens recomputed.
    assert again.recomputed_fraction == pytest.approx(fresh.recomputed_fraction * (1 + following) / 3)
    assert recovery.name == f"squid_first6_next{following}"


def test_a_paused_encode_goes_on_where_it_stopped(runtime, prefix):
    from context.errors import GenerationCancelled
    from context.squid.encode import DocumentEncoding

    text = "def area(width, height):\n    return width * height\n" * 4
    ids = runtime.encode(text)
    key = document_key(runtime, prefix, text)
    whole = encode_document(runtime, prefix, ids, key, chunk_tokens=8)
    encoding = DocumentEncoding(runtime, prefix, ids, key)
    polls = []

    def pause_at_the_third_chunk() -> bool:
        polls.append(encoding.done)
        return len(polls) == 3

    with pytest.raises(GenerationCancelled):
        encoding.run(pause_at_the_third_chunk, chunk_tokens=8)
    assert encoding.done == 16, "two chunks were encoded before the pause, and kept"
    resumed = encoding.run(lambda: polls.append(encoding.done) and False, chunk_tokens=8)
    assert polls[3] == 16, "the second run starts at the first token not encoded"
    # The same chunks at the same positions: the same keys and values as an encode never paused.
    assert torch.equal(resumed.keys, whole.keys) and torch.equal(resumed.values, whole.values)
    assert resumed.token_ids == whole.token_ids and resumed.start == prefix.length


def test_a_paused_encode_refuses_to_go_on_for_another_adapter(runtime, prefix):
    from context.errors import GenerationCancelled
    from context.squid.encode import DocumentEncoding

    ids = runtime.encode(TEXTS[1] * 3)
    encoding = DocumentEncoding(runtime, prefix, ids, document_key(runtime, prefix, TEXTS[1]))
    with pytest.raises(GenerationCancelled):
        encoding.run(lambda: encoding.done > 0, chunk_tokens=4)
    runtime.adapter_id = "adapter-under-test"
    try:
        assert not encoding.current()
        with pytest.raises(ValueError, match="another model or adapter"):
            encoding.run()
    finally:
        runtime.adapter_id = None
    assert encoding.current() and encoding.run().length == len(ids)
