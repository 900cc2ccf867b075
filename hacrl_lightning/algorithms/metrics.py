"""Evaluation estimators: unbiased pass@k (Chen et al. 2021, arXiv 2107.03374) and avg@k.

With n samples per problem of which c are correct, the unbiased estimate of pass@k is
`1 - C(n - c, k) / C(n, k)`, computed as the stable product `1 - Π_{i=n-c+1}^{n} (1 - k / i)`.
avg@k is the mean accuracy of k samples per problem. Deliberately not here: generating samples,
scoring them, and per-agent tables (`hacrl_lightning.evaluation`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["avg_at_k", "pass_at_k", "unbiased_pass_at_k"]


def unbiased_pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """`1 - C(n - c, k) / C(n, k)` for one problem, as a product (no large binomials). 1 <= k <= n."""
    n, c = num_samples, num_correct
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def _reduce(per_problem: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return per_problem.mean()
    if reduction == "none":
        return per_problem
    raise ValueError(f"unknown reduction {reduction!r}: known ['mean', 'none']")


def pass_at_k(correct: Tensor, k: int, *, reduction: str = "mean") -> Tensor:
    """Unbiased pass@k over a benchmark. correct: [P, n] (bool or 0/1), n samples of each of P problems.

    Returns the benchmark's pass@k (the mean over problems, a float64 scalar), or with
    `reduction="none"` the estimate of every problem, [P] (for confidence intervals over problems).
    """
    if correct.ndim != 2:
        raise ValueError(f"correct must have shape [P, n], got {tuple(correct.shape)}")
    n = correct.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, n={n}], got {k}")
    c = (correct > 0).sum(dim=1, keepdim=True)  # [P, 1]
    i = torch.arange(1, n + 1, dtype=torch.float64, device=correct.device)  # [n]
    factors = torch.where(i > n - c, 1.0 - k / i, torch.ones_like(i))  # [P, n]; a factor 0 when n - c < k
    return _reduce(1.0 - factors.prod(dim=1), reduction)


def avg_at_k(correct: Tensor, *, reduction: str = "mean") -> Tensor:
    """avg@k over a benchmark: the mean score of k samples per problem. correct: [P, k].

    Returns a float64 scalar, or with `reduction="none"` each problem's mean, [P].
    """
    if correct.ndim != 2:
        raise ValueError(f"correct must have shape [P, k], got {tuple(correct.shape)}")
    return _reduce(correct.to(torch.float64).mean(dim=1), reduction)
