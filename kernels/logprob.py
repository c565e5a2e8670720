"""Selective log-probabilities: log p(token) for the chosen tokens only, without the full vocabulary tensor.

A policy-gradient trainer needs log p(y_t | y_<t) for the sampled tokens. The direct way computes the
logits [batch, seq, vocab], takes a float32 log_softmax over the vocabulary and gathers one entry per
row: for a 49k vocabulary and a few thousand tokens that is gigabytes, most of it thrown away.
Here the rows are processed `chunk_size` at a time: each chunk's logits are computed, reduced to a
log-sum-exp and the target logit, and dropped. Backward recomputes each chunk's logits from the saved
hidden states and log-sum-exps, so only [chunk, vocab] float32 is alive at any moment:

    d logp_t / d logit_v = (onehot(y_t)_v - softmax_v) / temperature

Three formulations live here:
- `*_reference`: the direct full-vocabulary log_softmax (the oracle, and what the benchmark calls naive);
- the chunked torch path (the CPU path), a custom autograd.Function;
- Triton kernels that compute each row's log-sum-exp and target logit in one pass over the vocabulary
  with an online softmax (CUDA, or the interpreter in tests); backward is the same chunked torch code.
"""

from __future__ import annotations

import torch

from ._triton import triton_available, use_triton

__all__ = [
    "selective_logprob",
    "selective_logprob_from_logits",
    "selective_logprob_from_logits_reference",
    "selective_logprob_reference",
]


def selective_logprob_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p(tokens) [b, s] float32 through the full [b, s, vocab] float32 log_softmax."""
    logits = hidden.float() @ weight.float().T  # [b, s, vocab]
    if bias is not None:
        logits = logits + bias.float()
    return selective_logprob_from_logits_reference(logits, tokens, temperature=temperature)


def selective_logprob_from_logits_reference(
    logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """log p(tokens) [b, s] float32 from logits [b, s, vocab] through a full float32 log_softmax."""
    logp = (logits.float() / temperature).log_softmax(dim=-1)  # [b, s, vocab]
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def _check(rows: torch.Tensor, tokens: torch.Tensor, vocab: int, temperature: float, chunk_size: int) -> None:
    if rows.dim() != 3:
        raise ValueError(f"expected [batch, seq, features], got shape {tuple(rows.shape)}")
    if tokens.shape != rows.shape[:2]:
        raise ValueError(
            f"tokens of shape {tuple(tokens.shape)} do not match [batch, seq] {tuple(rows.shape[:2])}"
        )
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be integer ids, got {tokens.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        low, high = int(tokens.min()), int(tokens.max())
        raise ValueError(f"token ids must lie in [0, {vocab}), got [{low}, {high}]")


def _chunk_logits(h: torch.Tensor, w32: torch.Tensor, b32: torch.Tensor | None, temperature: float,
                  workspace: torch.Tensor):
    """Scaled float32 logits [chunk, vocab] of hidden rows `h` [chunk, d], written into `workspace`.

    One workspace serves every chunk of a pass, so the allocator never churns [chunk, vocab] buffers.
    """
    logits = torch.matmul(h.float(), w32.T, out=workspace[: h.shape[0]])  # [chunk, vocab]
    if b32 is not None:
        logits += b32
    if temperature != 1.0:
        logits /= temperature
    return logits


def _lse_target_inplace(logits: torch.Tensor, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-sum-exp, target logit) per row; overwrites `logits` so no second [chunk, vocab] buffer exists."""
    target = logits.gather(1, tok.unsqueeze(1)).squeeze(1)
    top = logits.amax(dim=1)
    lse = top + logits.sub_(top.unsqueeze(1)).exp_().sum(dim=1).log()
    return lse, target


def _grad_logits_inplace(logits: torch.Tensor, lse: torch.Tensor, tok: torch.Tensor, g: torch.Tensor):
    """g * (onehot - softmax) / temperature is applied by the caller's scale; here in place on `logits`."""
    probs = logits.sub_(lse.unsqueeze(1)).exp_()  # [chunk, vocab] softmax
    probs.mul_(-g.unsqueeze(1))
    probs.scatter_add_(1, tok.unsqueeze(1), g.unsqueeze(1))
    return probs


def _workspace(rows: int, chunk_size: int, like: torch.Tensor) -> torch.Tensor:
    """A float32 [min(rows, chunk_size), vocab] buffer; `like` has the vocabulary as its first dim."""
    return torch.empty(min(rows, chunk_size), like.shape[0], dtype=torch.float32, device=like.device)


def _scaled_copy(rows: torch.Tensor, temperature: float, workspace: torch.Tensor) -> torch.Tensor:
    chunk = workspace[: rows.shape[0]].copy_(rows)  # float32 [chunk, vocab]
    return chunk.div_(temperature) if temperature != 1.0 else chunk


class _ChunkedHeadLogprob(torch.autograd.Function):
    """log p(tokens) from hidden rows [n, d] and the head [vocab, d], chunk by chunk in both passes."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk_size, triton_forward):
        if triton_forward:
            lse, target = _head_lse_target_triton(hidden, weight, bias, tokens, temperature)
        else:
            w32, b32 = weight.float(), None if bias is None else bias.float()
            lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
            target = torch.empty_like(lse)
            workspace = _workspace(hidden.shape[0], chunk_size, w32)
            for start in range(0, hidden.shape[0], chunk_size):
                end = start + chunk_size
                logits = _chunk_logits(hidden[start:end], w32, b32, temperature, workspace)
                lse[start:end], target[start:end] = _lse_target_inplace(logits, tokens[start:end])
        ctx.save_for_backward(hidden, weight, bias, tokens, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return target - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, tokens, lse = ctx.saved_tensors
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        w32, b32 = weight.float(), None if bias is None else bias.float()
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(w32) if want_w else None
        grad_b = torch.zeros_like(b32) if want_b else None
        grad_out = grad_out.float() / ctx.temperature
        workspace = _workspace(hidden.shape[0], ctx.chunk_size, w32)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = start + ctx.chunk_size
            h = hidden[start:end]
            logits = _chunk_logits(h, w32, b32, ctx.temperature, workspace)
            grad_logits = _grad_logits_inplace(logits, lse[start:end], tokens[start:end], grad_out[start:end])
            if want_h:
                grad_h[start:end] = grad_logits @ w32
            if want_w:
                grad_w.addmm_(grad_logits.T, h.float())
            if want_b:
                grad_b += grad_logits.sum(dim=0)
        grad_w = grad_w.to(weight.dtype) if want_w else None
        grad_b = grad_b.to(bias.dtype) if want_b else None
        return grad_h, grad_w, grad_b, None, None, None, None


class _ChunkedLogitsLogprob(torch.autograd.Function):
    """log p(tokens) from logit rows [n, vocab], a float32 copy of at most one chunk at a time."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature, chunk_size, triton_forward):
        if triton_forward:
            lse, target = _logits_lse_target_triton(logits, tokens, temperature)
        else:
            lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            target = torch.empty_like(lse)
            workspace = _workspace(logits.shape[0], chunk_size, logits[0])
            for start in range(0, logits.shape[0], chunk_size):
                end = start + chunk_size
                chunk = _scaled_copy(logits[start:end], temperature, workspace)
                lse[start:end], target[start:end] = _lse_target_inplace(chunk, tokens[start:end])
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return target - lse

    @staticmethod
    def backward(ctx, grad_out):
        logits, tokens, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        grad_out = grad_out.float() / ctx.temperature
        workspace = _workspace(logits.shape[0], ctx.chunk_size, logits[0])
        for start in range(0, logits.shape[0], ctx.chunk_size):
            end = start + ctx.chunk_size
            chunk = _scaled_copy(logits[start:end], ctx.temperature, workspace)
            rows = slice(start, end)
            grad[rows] = _grad_logits_inplace(chunk, lse[rows], tokens[rows], grad_out[rows])
        return grad, None, None, None, None


def selective_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    backend: str = "auto",
) -> torch.Tensor:
    """log p(tokens) [b, s] float32 from hidden states [b, s, d] and the LM head `weight` [vocab, d].

    Equals `log_softmax(hidden @ weight.T + bias) / temperature` gathered at `tokens` [b, s], but holds
    at most `chunk_size` rows of float32 logits at a time. Differentiable w.r.t. hidden, weight and
    bias; backward recomputes each chunk. `backend`: "auto" (Triton forward on CUDA when available),
    "torch" or "triton" (the latter also runs CPU tensors under TRITON_INTERPRET=1).
    """
    _check(hidden, tokens, weight.shape[0], temperature, chunk_size)
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must be [vocab, {hidden.shape[-1]}], got shape {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}], got shape {tuple(bias.shape)}")
    batch, seq, dim = hidden.shape
    flat = hidden.reshape(batch * seq, dim)  # [b*s, d]
    toks = tokens.reshape(batch * seq).long()
    triton_forward = _pick_backend(backend, hidden, weight)
    out = _ChunkedHeadLogprob.apply(flat, weight, bias, toks, float(temperature), chunk_size, triton_forward)
    return out.reshape(batch, seq)


def selective_logprob_from_logits(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    backend: str = "auto",
) -> torch.Tensor:
    """log p(tokens) [b, s] float32 from logits [b, s, vocab] (any float dtype), differentiable.

    The float32 log_softmax is never built for more than `chunk_size` rows at once.
    """
    _check(logits, tokens, logits.shape[-1], temperature, chunk_size)
    batch, seq, vocab = logits.shape
    flat = logits.reshape(batch * seq, vocab)  # [b*s, vocab]
    toks = tokens.reshape(batch * seq).long()
    triton_forward = _pick_backend(backend, logits)
    out = _ChunkedLogitsLogprob.apply(flat, toks, float(temperature), chunk_size, triton_forward)
    return out.reshape(batch, seq)


def _pick_backend(backend: str, *tensors: torch.Tensor) -> bool:
    if backend == "auto":
        return use_triton(*tensors)
    if backend == "torch":
        return False
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' but triton does not import on this machine")
        return True
    raise ValueError(f"unknown backend {backend!r}; expected 'auto', 'torch' or 'triton'")


def _head_lse_target_triton(hidden, weight, bias, tokens, temperature):
    from ._logprob_triton import head_lse_target

    return head_lse_target(hidden, weight, bias, tokens, temperature)


def _logits_lse_target_triton(logits, tokens, temperature):
    from ._logprob_triton import logits_lse_target

    return logits_lse_target(logits, tokens, temperature)
