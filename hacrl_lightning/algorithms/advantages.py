"""Advantages: the own-group baseline of GRPO/GSPO and HACPO's capability-aware joint baseline.

- `group_advantages`: paper Eq. 5, each response against its own group of G (grpo, gspo, gspo_x2).
- `hacpo_baseline` / `hacpo_advantages`: Eqs. 6-7 with the two guards of docs/spec.md §4. One
  response pool gives every learner its own baseline, so the result carries a learner axis.
- `compute_advantages`: what the trainer calls; the `AlgorithmConfig` switches pick the estimator.

Deliberately not here: choosing which responses a learner trains on (`sampling.py`) and the
ratios and clipping that consume these advantages (`losses.py`, `objective.py`).
Shape legend: P prompts, n agents, G responses per prompt per agent.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

ADVANTAGES = ("hacpo", "group")
"""`hacpo`: the capability-aware joint baseline (docs/spec.md §4); `group`: each group's own mean/std (GRPO/GSPO)."""

__all__ = ["compute_advantages", "group_advantages", "hacpo_advantages", "hacpo_baseline"]


def _all_equal(rewards: Tensor) -> Tensor:
    """[..., N] -> [...]: True where every value along the last axis is equal."""
    return (rewards == rewards[..., :1]).all(dim=-1)


def group_advantages(rewards: Tensor, *, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    """Own-group advantage, paper Eq. 5: `A[p, i] = (R[p, i] - mean_i R[p]) / (std_i R[p] + eps)`.

    std is the sample std (Bessel correction), as in docs/spec.md §4. `scale_by_std=False` keeps only
    the centring (Dr. GRPO). A prompt whose G rewards are all equal gets A = 0.
    rewards: [P, G]. Returns [P, G].
    """
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [P, G] with G >= 2, got {tuple(rewards.shape)}")
    adv = rewards - rewards.mean(dim=-1, keepdim=True)  # [P, G]
    if scale_by_std:
        adv = adv / (rewards.std(dim=-1, correction=1, keepdim=True) + eps)
    return adv.masked_fill(_all_equal(rewards)[:, None], 0.0)


def _check_joint(rewards: Tensor, omega: Tensor) -> None:
    if rewards.ndim != 3:
        raise ValueError(f"rewards must have shape [P, n, G], got {tuple(rewards.shape)}")
    _, n, g = rewards.shape
    if n * g < 2:
        raise ValueError(f"the joint group needs n * G >= 2 responses, got n={n}, G={g}")
    if omega.shape != (n, n):
        raise ValueError(
            f"omega must have shape [{n}, {n}] for rewards {tuple(rewards.shape)}, got {tuple(omega.shape)}"
        )


def hacpo_baseline(rewards: Tensor, omega: Tensor, *, baseline_guard: bool = True) -> Tensor:
    """Capability-aware baseline of every learner, paper Eq. 7.

        mu[k, p] = (1 / (n G)) Σ_j Σ_i omega[k, j] R[p, j, i]

    Partner j's rewards are scaled by cap_k / cap_j, so mu[k] estimates learner k's own expected
    reward (Theorem 4.1). Guard (docs/spec.md §4, authors' code): where mu[k, p] > 1, the top of the
    reward range, use the learner's own-group mean `mean_i R[p, k, i]` instead.
    rewards: [P, n, G]; omega: [n, n] (learner, source). Returns mu: [n, P] (learner, prompt).
    """
    _check_joint(rewards, omega)
    _, n, g = rewards.shape
    omega = omega.to(dtype=rewards.dtype, device=rewards.device)
    source_sums = rewards.sum(dim=-1)  # [P, n]  Σ_i R[p, j, i]
    mu = torch.einsum("kj,pj->kp", omega, source_sums) / (n * g)  # [n, P]
    if baseline_guard:
        own_mean = rewards.mean(dim=-1).T  # [n, P]  mean_i R[p, k, i]
        mu = torch.where(mu > 1.0, own_mean, mu)
    return mu


def hacpo_advantages(
    rewards: Tensor,
    omega: Tensor,
    *,
    eps: float = 1e-6,
    baseline_guard: bool = True,
    scale_by_std: bool = True,
) -> Tensor:
    """Agent-capability-aware advantage, paper Eq. 6, from every learner's point of view.

        A[k, p, j, i] = (R[p, j, i] - mu[k, p]) / (sigma[p] + eps)

    mu is `hacpo_baseline` (Eq. 7, with the baseline guard); sigma[p] is the sample std (Bessel)
    of all n·G raw rewards of prompt p. A response of source j != k uses learner k's advantage
    (docs/spec.md §4, Decision). A prompt whose n·G rewards are all equal gets A = 0 for every
    learner (Decision). `omega = ones(n, n)` gives the unweighted joint baseline (naive, hacpo_no_adv).
    rewards: [P, n, G]; omega: [n, n]. Returns [n, P, n, G] (learner, prompt, source, sample).
    """
    mu = hacpo_baseline(rewards, omega, baseline_guard=baseline_guard)  # [n, P]
    num_prompts, n, g = rewards.shape
    joint = rewards.reshape(num_prompts, n * g)  # [P, nG]
    adv = rewards[None] - mu[:, :, None, None]  # [n, P, n, G]
    if scale_by_std:
        sigma = joint.std(dim=-1, correction=1)  # [P]
        adv = adv / (sigma[None, :, None, None] + eps)
    return adv.masked_fill(_all_equal(joint)[None, :, None, None], 0.0)


def compute_advantages(rewards: Tensor, omega: Optional[Tensor], *, advantage: str = "hacpo",
                       capability_baseline: bool = True, scale_by_std: bool = True, baseline_guard: bool = True,
                       eps: float = 1e-6) -> Tensor:
    """Advantages of one training step for every learner, as a preset asks
    (`AlgorithmConfig.advantage_settings()` gives these switches for a preset).

    - `advantage="hacpo"`: `hacpo_advantages` with `omega` (or ones when capability_baseline is off;
      then omega may be None).
    - `advantage="group"`: every response against its own source's group of G (Eq. 5). The value
      does not depend on the learner, so all learner rows are equal; without shared rollouts the
      trainer reads only the diagonal `[k, :, k, :]`.
    rewards: [P, n, G]; omega: [n, n] or None. Returns [n, P, n, G] (learner, prompt, source, sample).
    """
    if rewards.ndim != 3:
        raise ValueError(f"rewards must have shape [P, n, G], got {tuple(rewards.shape)}")
    num_prompts, n, g = rewards.shape
    if advantage == "hacpo":
        if not capability_baseline:
            omega = torch.ones(n, n, dtype=rewards.dtype, device=rewards.device)
        elif omega is None:
            raise ValueError("advantage='hacpo' with capability_baseline=True needs the omega matrix")
        return hacpo_advantages(rewards, omega, eps=eps, baseline_guard=baseline_guard, scale_by_std=scale_by_std)
    if advantage == "group":
        own = group_advantages(rewards.reshape(num_prompts * n, g), eps=eps, scale_by_std=scale_by_std)
        return own.reshape(num_prompts, n, g).expand(n, num_prompts, n, g).contiguous()
    raise ValueError(f"unknown advantage {advantage!r}: known {sorted(ADVANTAGES)}")
