"""The output projection for greedy decoding: cheap logits everywhere, exact ones where they decide.

On a CPU the float32 output projection of a small model is a large share of a decode step (the
embedded model's 49,152 x 576 matrix is 113 MB, a fifth of its weights, read once per token and
once per row of a prompt-lookup verify pass). Greedy decoding needs only the argmax, so
`ShortlistHead` computes bfloat16 logits over the whole vocabulary (half the bytes), recomputes the
`shortlist` best of them in the weight's own precision, and proves that nothing outside the
shortlist could have won: every bfloat16 logit is within a bound of its exact value (Cauchy-Schwarz
on the rounding of the weights and of the hidden state, plus the rounding of the result), so when
the best exact logit clears the best logit left out by more than that bound, the argmax is the
exact one. A row that does not clear it (about 1 in 500 on real code with 32 candidates) gets its
logits computed exactly. The logits returned are exact for the shortlist and within the bound
elsewhere, so the greedy token is exactly the float32 model's, and a log-probability taken from
them is off by a negligible amount of probability mass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ShortlistHead"]

# bfloat16 keeps 8 significant bits: rounding moves a value by at most 2^-8 of its magnitude.
_BF16_ROUNDING = 2.0**-8
# Headroom over the analytic bound for float32 accumulation order (measured error stays 5x below).
_SAFETY = 1.25


class ShortlistHead:
    """Greedy logits from a float32 output matrix `weight` [vocab, hidden], read mostly in bfloat16."""

    def __init__(self, weight: torch.Tensor, shortlist: int = 32):
        self.weight = weight  # [vocab, hidden], the model's own tensor
        self.approx = weight.detach().to(torch.bfloat16)
        self.shortlist = shortlist
        # Per-row norms of the weights and of their rounding error, for the bound (their maxima).
        self.weight_norm = float(weight.detach().float().norm(dim=1).max())
        self.rounding_norm = float((weight.detach().float() - self.approx.float()).norm(dim=1).max())
        self.exact_rows = 0  # rows whose bound did not clear: computed in full
        self.rows = 0

    @staticmethod
    def supports(weight: torch.Tensor) -> bool:
        """Worth it only where the weight is float32 on the CPU (elsewhere bfloat16 is no cheaper)."""
        return weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.shape[0] > 1024

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] (float32) for hidden states [..., hidden]; their argmax is exact."""
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1]).float()  # [rows, hidden]
        x_low = x.to(torch.bfloat16)
        logits = F.linear(x_low, self.approx).float()  # [rows, vocab]
        top = torch.topk(logits, self.shortlist + 1, dim=-1)
        chosen = top.indices[:, : self.shortlist]  # [rows, k]
        exact = torch.bmm(self.weight[chosen], x.unsqueeze(-1)).squeeze(-1)  # [rows, k]
        bound = self._bound(x, x_low, logits)  # [rows]
        left_out = top.values[:, self.shortlist]  # the best logit not recomputed
        unsure = exact.max(dim=-1).values <= left_out + bound
        logits.scatter_(1, chosen, exact)
        if bool(unsure.any()):
            rows = unsure.nonzero().squeeze(-1)
            logits[rows] = F.linear(x[rows], self.weight).float()
            self.exact_rows += int(rows.numel())
        self.rows += x.shape[0]
        return logits.view(*shape[:-1], -1)

    def _bound(self, x: torch.Tensor, x_low: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """How far any bfloat16 logit of each row can be from its exact value."""
        # |w.x - w'.x'| <= |w||x - x'| + |w - w'||x'| + rounding of the bfloat16 result.
        from_hidden = self.weight_norm * (x - x_low.float()).norm(dim=-1)
        from_weights = self.rounding_norm * x_low.float().norm(dim=-1)
        from_result = logits.abs().amax(dim=-1) * _BF16_ROUNDING
        return (from_hidden + from_weights + from_result) * _SAFETY
