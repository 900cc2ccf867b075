"""Evaluation estimators: unbiased pass@k (Chen et al. 2021, arXiv 2107.03374) and avg@k.

With n samples per problem of which c are correct, the unbiased estimate of pass@k is
`1 - C(n - c, k) / C(n, k)`, computed as the stable product `1 - Π_{i=n-c+1}^{n} (1 - k / i)`.
avg@k is the mean accuracy of k samples per problem. `collective_accuracy`: what several agents know
together, from one scored answer per agent and problem (union, majority vote, who is right where whom is
wrong). Deliberately not here: generating samples, scoring them, reading answers out of responses
(`hacrl_lightning.collective`), and per-agent tables (`hacrl_lightning.evaluation`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["avg_at_k", "collective_accuracy", "pass_at_k", "unbiased_pass_at_k"]


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


def collective_accuracy(correct: Tensor, answers: Tensor) -> dict[str, Tensor]:
    """What A agents know together on P problems, from one scored answer of each agent to each problem.

    correct: [A, P] bool, c[a, p] = agent a's answer to problem p was scored right; answers: [A, P] int64,
    x[a, p] = an id of the answer agent a gave (equal ids within a column = the same answer), -1 for none
    (that agent does not vote on p). With v[p, y] = Σ_a [x[a, p] = y] the votes for answer y ≠ -1:

        union[p]         = max_a c[a, p]                                 (some agent is right)
        tied[p]          = at least two answers y share the largest v[p, y] > 0
        majority[p]      = ¬tied[p] ∧ c[a, p] for every a with x[a, p] = argmax_y v[p, y]
                           (the plurality answer of the agents that answered; a tie is no majority: wrong)
        best             = max_a (1/P) Σ_p c[a, p]                       (the best single agent)
        right_wrong[i, j] = (1/P) Σ_p c[i, p] (1 - c[j, p])              (i right where j is wrong; 0 at i = j)

    Returns float64 tensors: `union`, `majority`, `tied` (each the mean over problems, a scalar), `best`,
    `union_gain` = union - best, `majority_gain` = majority - best, `right_wrong` [A, A]. P = 0 gives nan.
    """
    if correct.ndim != 2 or answers.shape != correct.shape:
        raise ValueError(f"correct and answers must both have shape [A, P], got {tuple(correct.shape)} and "
                         f"{tuple(answers.shape)}")
    correct = correct.bool()
    given = answers >= 0                                                                   # [A, P]
    same = (answers[:, None, :] == answers[None, :, :]) & given[:, None, :] & given[None, :, :]  # [A, A, P]
    votes = same.sum(dim=1)                                              # [A, P]: votes for agent a's answer
    top = votes.max(dim=0).values                                        # [P]
    leaders = (votes == top) & (top > 0)                                 # [A, P]: gave a most-voted answer
    leading = leaders.sum(dim=0) // top.clamp(min=1)                     # [P]: distinct most-voted answers
    tied = leading > 1
    majority = (leading == 1) & (correct | ~leaders).all(dim=0)          # [P]
    mean = lambda t: t.to(torch.float64).mean(dim=-1)  # noqa: E731
    best = mean(correct).max() if correct.shape[0] else torch.tensor(math.nan, dtype=torch.float64)
    union = mean(correct.any(dim=0))
    majority_acc = mean(majority)
    return {"union": union, "majority": majority_acc, "tied": mean(tied), "best": best,
            "union_gain": union - best, "majority_gain": majority_acc - best,
            "right_wrong": mean(correct[:, None, :] & ~correct[None, :, :])}          # [A, A]
