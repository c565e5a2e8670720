"""Selective log-probabilities: chunked torch path and Triton kernels against the full log_softmax."""

from __future__ import annotations

import pytest
import torch

from kernels.logprob import (
    selective_logprob,
    selective_logprob_from_logits,
    selective_logprob_from_logits_reference,
    selective_logprob_reference,
)
from tests.unit.kernels.conftest import max_rel_err, poisoned, requires_triton

SHAPES = [  # (batch, seq, dim, vocab, chunk)
    (1, 1, 16, 50, 1),
    (2, 37, 48, 1000, 10),
    (3, 5, 33, 257, 4),
]


def _inputs(batch, seq, dim, vocab, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, dim, generator=gen).to(dtype)
    weight = (torch.randn(vocab, dim, generator=gen) * dim**-0.5 * 3).to(dtype)
    bias = torch.randn(vocab, generator=gen).to(dtype)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
    return hidden, weight, bias, tokens


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_values_match_the_full_log_softmax(shape, temperature):
    batch, seq, dim, vocab, chunk = shape
    hidden, weight, bias, tokens = _inputs(batch, seq, dim, vocab, seed=seq * 7 + vocab)
    want = selective_logprob_reference(hidden, weight, tokens, bias=bias, temperature=temperature)
    got = selective_logprob(hidden, weight, tokens, bias=bias, temperature=temperature,
                            chunk_size=chunk, backend="torch")
    assert got.shape == (batch, seq) and got.dtype == torch.float32
    assert (got <= 0).all()
    assert max_rel_err(got, want) < 1e-5


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_gradients_match_autograd_of_the_reference(shape):
    batch, seq, dim, vocab, chunk = shape
    hidden, weight, bias, tokens = _inputs(batch, seq, dim, vocab, seed=seq + 3 * vocab)
    upstream = torch.randn(batch, seq)
    grads = []
    for fn in (
        lambda h, w, b: selective_logprob_reference(h, w, tokens, bias=b, temperature=0.8),
        lambda h, w, b: selective_logprob(
            h, w, tokens, bias=b, temperature=0.8, chunk_size=chunk, backend="torch"
        ),
    ):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        (fn(*leaves) * upstream).sum().backward()
        grads.append([leaf.grad for leaf in leaves])
    for got, want in zip(grads[1], grads[0], strict=True):
        assert max_rel_err(got, want) < 1e-5


def test_gradient_only_for_what_requires_it_and_bfloat16_weights():
    hidden, weight, _, tokens = _inputs(2, 9, 32, 300, seed=1, dtype=torch.bfloat16)
    hidden.requires_grad_()
    got = selective_logprob(hidden, weight, tokens, chunk_size=4)
    want = selective_logprob_reference(hidden.detach(), weight, tokens)
    assert max_rel_err(got.detach(), want) < 1e-5
    got.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_from_logits_values_and_gradients(dtype):
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 13, 501, generator=gen) * 4).to(dtype)
    tokens = torch.randint(0, 501, (2, 13), generator=gen)
    upstream = torch.randn(2, 13, generator=gen)
    want_leaf = logits.clone().requires_grad_()
    want = selective_logprob_from_logits_reference(want_leaf, tokens, temperature=1.5)
    (want * upstream).sum().backward()
    got_leaf = logits.clone().requires_grad_()
    got = selective_logprob_from_logits(got_leaf, tokens, temperature=1.5, chunk_size=3)
    (got * upstream).sum().backward()
    assert max_rel_err(got, want) < 1e-5
    assert got_leaf.grad.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16 gradients are rounded to 8 bits
    assert max_rel_err(got_leaf.grad, want_leaf.grad) < tol


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h, w, t: (h, w, t + 10_000), "token ids must lie"),
        (lambda h, w, t: (h, w, t.float()), "integer ids"),
        (lambda h, w, t: (h, w, t[:, :-1]), "do not match"),
        (lambda h, w, t: (h, w[:, :-1], t), "weight must be"),
        (lambda h, w, t: (h[0], w, t), "expected \\[batch, seq"),
    ],
)
def test_bad_input_gets_a_clear_error(change, message):
    hidden, weight, _, tokens = _inputs(2, 4, 8, 20, seed=2)
    with pytest.raises(ValueError, match=message):
        selective_logprob(*change(hidden, weight, tokens))
    with pytest.raises(ValueError, match="temperature"):
        selective_logprob(hidden, weight, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        selective_logprob(hidden, weight, tokens, chunk_size=0)


@requires_triton
@pytest.mark.parametrize("shape", SHAPES + [(1, 70, 40, 130, 8)])
def test_triton_head_kernel_matches_the_reference(shape):
    from kernels._logprob_triton import head_lse_target

    batch, seq, dim, vocab, _ = shape
    hidden, weight, bias, tokens = _inputs(batch, seq, dim, vocab, seed=11 * seq + dim)
    rows = batch * seq
    for b, splits in ((bias, None), (None, 3)):  # 3 splits: fewer than, equal to or more than the tiles
        logits = (hidden.reshape(rows, dim) @ weight.T + (b if b is not None else 0)) / 0.9
        lse, target = head_lse_target(hidden.reshape(rows, dim), weight, b, tokens.reshape(rows), 0.9,
                                      lse=poisoned(rows), target=poisoned(rows), splits=splits,
                                      poison_scratch=True)
        assert max_rel_err(lse, logits.logsumexp(-1)) < 1e-5
        assert max_rel_err(target, logits.gather(1, tokens.reshape(rows, 1)).squeeze(1)) < 1e-5


@requires_triton
@pytest.mark.parametrize("rows, vocab", [(1, 3), (7, 4099), (20, 500)])
def test_triton_logits_kernel_matches_the_reference(rows, vocab):
    from kernels._logprob_triton import logits_lse_target

    gen = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 5
    tokens = torch.randint(0, vocab, (rows,), generator=gen)
    lse, target = logits_lse_target(logits, tokens, 1.3, lse=poisoned(rows), target=poisoned(rows))
    assert max_rel_err(lse, (logits / 1.3).logsumexp(-1)) < 1e-5
    assert max_rel_err(target, logits.gather(1, tokens[:, None]).squeeze(1) / 1.3) < 1e-5


@requires_triton
def test_triton_backend_end_to_end_with_gradients():
    hidden, weight, bias, tokens = _inputs(2, 19, 24, 333, seed=9)
    want_leaves = [t.clone().requires_grad_() for t in (hidden, weight)]
    want = selective_logprob_reference(*want_leaves, tokens, bias=bias, temperature=0.7)
    want.sum().backward()
    got_leaves = [t.clone().requires_grad_() for t in (hidden, weight)]
    got = selective_logprob(*got_leaves, tokens, bias=bias, temperature=0.7, chunk_size=5, backend="triton")
    got.sum().backward()
    assert max_rel_err(got, want) < 1e-5
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert max_rel_err(g.grad, w.grad) < 1e-5
    logits = hidden @ weight.T
    got = selective_logprob_from_logits(logits, tokens, backend="triton")
    assert max_rel_err(got, selective_logprob_from_logits_reference(logits, tokens)) < 1e-5


@requires_triton
def test_triton_head_kernel_on_bfloat16():
    from kernels._logprob_triton import head_lse_target

    hidden, weight, _, tokens = _inputs(1, 21, 40, 300, seed=4, dtype=torch.bfloat16)
    logits = hidden[0].float() @ weight.float().T  # what bfloat16 inputs with a float32 accumulator give
    lse, target = head_lse_target(hidden[0], weight, None, tokens[0], 1.0,
                                  lse=poisoned(21), target=poisoned(21))
    assert max_rel_err(lse, logits.logsumexp(-1)) < 1e-5
    assert max_rel_err(target, logits.gather(1, tokens[0][:, None]).squeeze(1)) < 1e-5
