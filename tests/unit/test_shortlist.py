"""The greedy output head: bfloat16 logits with an exact shortlist must pick the float32 argmax.

Checked on the real embedded model's hidden states over real code, and on a constructed case
where the bound cannot be cleared, which must fall back to exact logits rather than guess.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from context.decode import DecodeEngine
from context.shortlist import ShortlistHead

REPO = Path(__file__).resolve().parents[2]


def _final_hidden(runtime, text: str, tokens: int) -> torch.Tensor:
    """The normalised last hidden state of every position of `text`: [positions, hidden]."""
    engine = DecodeEngine(runtime.model, shortlist_head=False)
    captured = []
    projection = engine.lm_head
    engine.lm_head = lambda hidden: (captured.append(hidden[0].clone()), projection(hidden))[1]
    ids = runtime.encode(text)[:tokens]
    cache = engine.new_cache()
    with torch.inference_mode():
        for start in range(0, len(ids), 256):
            engine.forward(torch.tensor([ids[start : start + 256]]), cache, all_logits=True)
    return torch.cat(captured)


def test_greedy_logits_have_the_exact_argmax_on_real_code(runtime):
    hidden = _final_hidden(runtime, (REPO / "context/runtime.py").read_text(), 512)
    weight = runtime.model.lm_head.weight
    head = ShortlistHead(weight)
    with torch.inference_mode():
        exact = F.linear(hidden, weight)
        greedy = head(hidden)
    assert greedy.shape == exact.shape
    assert torch.equal(greedy.argmax(-1), exact.argmax(-1))
    # Exact where recomputed, close elsewhere (bfloat16), never wildly off.
    top = exact.topk(5, dim=-1).indices
    assert torch.allclose(greedy.gather(1, top), exact.gather(1, top), atol=1e-4)
    assert float((greedy - exact).abs().max()) < 1.0
    assert head.rows == hidden.shape[0]
    assert head.exact_rows < hidden.shape[0] // 20  # the shortlist decides almost every row


def test_a_row_whose_bound_cannot_be_cleared_is_computed_exactly():
    torch.manual_seed(0)
    weight = torch.randn(2048, 64)
    # Rows 7 and 9 differ by less than bfloat16 can tell apart: with a shortlist of one the
    # bound is never cleared, so the head must compute the logits in full.
    weight[9] = weight[7] + 1e-4 * weight[7].sign()
    hidden = weight[7:8].clone() * 3
    head = ShortlistHead(weight, shortlist=1)
    with torch.inference_mode():
        exact = F.linear(hidden, weight)
        greedy = head(hidden)
    assert head.exact_rows == 1
    assert torch.equal(greedy, exact)
    assert int(greedy.argmax()) == int(exact.argmax()) == 9


def test_the_head_is_offered_only_for_float32_on_the_cpu():
    assert ShortlistHead.supports(torch.zeros(4096, 8))
    assert not ShortlistHead.supports(torch.zeros(4096, 8, dtype=torch.bfloat16))
    assert not ShortlistHead.supports(torch.zeros(16, 8))


def test_greedy_generation_is_the_same_with_and_without_the_shortlist(runtime):
    """The engine's greedy decode (with drafts) produces the float32 head's tokens exactly."""
    prompt = (REPO / "context/index/store.py").read_text()[:2500]
    ids = runtime.encode(prompt)
    outputs = []
    for shortlist in (False, True):
        engine = DecodeEngine(runtime.model, shortlist_head=shortlist)
        assert (engine.greedy_head is not None) == shortlist
        cache = engine.new_cache()
        with torch.inference_mode():
            logits = engine.forward(torch.tensor([ids]), cache, greedy=shortlist)
            tokens = []
            for _ in range(48):
                tokens.append(int(logits[0, -1].argmax()))
                logits = engine.forward(torch.tensor([[tokens[-1]]]), cache, greedy=shortlist)
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
