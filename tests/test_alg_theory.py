"""The paper's theory, checked numerically: Prop. D.6 (gradient law), Theorem 4.1 (unbiased
baseline, by Monte Carlo), and the reduction of HACPO to GSPO when no partner is involved."""

from __future__ import annotations

import pytest
import torch

from conftest import preset_loss

from hacrl_lightning.algorithms import (
    compute_advantages,
    cross_clip_lower,
    hacpo_baseline,
    hacpo_cross_term,
    hacpo_loss,
    log_ratio_from_means,
    sequence_mean_logp,
)
from hacrl_lightning.presets import PRESETS, get_preset

D = torch.float64


def _cross_batch(seed: int, s_low: float, s_high: float):
    """Random learner log-probs [6, 5] with lengths 1..5 and old means that put s in (s_low, s_high)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 2, 3, 4, 5, 3])
    mask = torch.arange(5)[None, :] < lengths[:, None]  # [6, 5]
    logp = -2.0 * torch.rand(6, 5, generator=gen, dtype=D)
    s = s_low + (s_high - s_low) * torch.rand(6, generator=gen, dtype=D)
    old_mean = sequence_mean_logp(logp, mask) - s.log()
    adv = torch.randn(6, generator=gen, dtype=D)
    omega = 0.1 + 3.0 * torch.rand(6, generator=gen, dtype=D)
    return logp, mask, lengths, old_mean, s, adv, omega


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_prop_d6_gradient_law_inside_the_clip_range(alpha):
    lower = cross_clip_lower(2, 0.2, 0.025)  # .85
    logp, mask, lengths, old_mean, s, adv, omega = _cross_batch(0, lower + 1e-3, 1.0 - 1e-3)
    logp.requires_grad_(True)
    ratio = log_ratio_from_means(sequence_mean_logp(logp, mask), old_mean).exp()
    term = hacpo_cross_term(ratio, adv, omega, lower=lower, alpha=alpha)
    (grad,) = torch.autograd.grad(term.sum(), logp)
    # ∇ term = sg(c)^(α+1) · ω · A · ∇ log s, and ∂ log s / ∂ logp[b, t] = 1/|y_b| on response tokens
    per_token = s.pow(alpha + 1) * omega * adv / lengths  # [6]
    expected = torch.where(mask, per_token[:, None].expand(6, 5), torch.zeros(6, 5, dtype=D))
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("s_low, s_high", [(0.3, 0.84), (1.001, 3.0)])
def test_prop_d6_zero_gradient_outside_the_clip_range(s_low, s_high):
    lower = cross_clip_lower(2, 0.2, 0.025)
    logp, mask, _, old_mean, _, adv, omega = _cross_batch(1, s_low, s_high)
    logp.requires_grad_(True)
    ratio = log_ratio_from_means(sequence_mean_logp(logp, mask), old_mean).exp()
    (grad,) = torch.autograd.grad(hacpo_cross_term(ratio, adv, omega, lower=lower, alpha=1.0).sum(), logp)
    assert bool((grad == 0).all())


def test_theorem_4_1_capability_baseline_is_unbiased():
    # Bernoulli rewards with success rates p; omega[k, j] = p_k / p_j (the true ratios, fixed in advance)
    p = torch.tensor([0.2, 0.5, 0.8], dtype=D)
    gen = torch.Generator().manual_seed(1234)
    num_draws, group = 20_000, 8
    rewards = torch.bernoulli(p[None, :, None].expand(num_draws, 3, group), generator=gen)  # [P, n, G]
    omega = p[:, None] / p[None, :]
    mu = hacpo_baseline(rewards, omega, baseline_guard=False)  # [n, P]
    # E[mu_k] = p_k. Per draw sd(mu_2) = sqrt(8 · Σ_j ω_2j² p_j (1 - p_j)) / 24 ≈ .22, so the
    # standard error over 20 000 draws is ≈ .0015: a tolerance of .01 is > 6 standard errors.
    torch.testing.assert_close(mu.mean(dim=1), p, atol=0.01, rtol=0)
    # Corollary 4.2: the un-normalised advantage R - mu of the learner's own responses has mean 0
    own_adv = rewards.permute(1, 0, 2) - mu[:, :, None]  # [n, P, G]
    torch.testing.assert_close(own_adv.mean(dim=(1, 2)), torch.zeros(3, dtype=D), atol=0.01, rtol=0)
    # and the test can fail: the unweighted joint baseline estimates mean(p) = .5 for everyone
    plain = hacpo_baseline(rewards, torch.ones(3, 3, dtype=D), baseline_guard=False).mean(dim=1)
    assert (plain - p).abs()[[0, 2]].min().item() > 0.25


def _own_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([2, 4, 3, 1])
    mask = torch.arange(4)[None, :] < lengths[:, None]
    logp = -torch.rand(4, 4, generator=gen, dtype=D)
    # ratios around 1 within ±1e-3, so some fall inside GSPO's tiny clip range and some outside
    old_mean = sequence_mean_logp(logp, mask) + 1e-3 * (2 * torch.rand(4, generator=gen, dtype=D) - 1)
    adv = torch.randn(4, generator=gen, dtype=D)
    return logp, mask, old_mean, adv


@pytest.mark.parametrize("name", sorted(n for n, c in PRESETS.items() if c.ratio_level == "sequence"))
def test_on_own_responses_every_sequence_preset_is_gspo(name):
    logp, mask, old_mean, adv = _own_batch(7)
    results = []
    for cfg in (get_preset("gspo"), get_preset(name)):
        x = logp.clone().requires_grad_(True)
        loss, _ = hacpo_loss(
            logp_new=x, loss_mask=mask, advantages=adv, is_own=torch.ones(4, dtype=torch.bool),
            old_logp_mean=old_mean, omega_factor=torch.full((4,), 3.0, dtype=D), **preset_loss(cfg, 3),
        )
        results.append((loss, torch.autograd.grad(loss, x)[0]))
    (gspo_loss, gspo_grad), (loss, grad) = results
    assert torch.equal(loss, gspo_loss) and torch.equal(grad, gspo_grad)


def test_single_agent_hacpo_step_is_a_gspo_step():
    # n = 1: omega = [[1]], the joint group is the own group, and there are no cross responses
    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(2, 1, 4, generator=gen) > 0.5).to(D)  # [P=2, n=1, G=4]
    rewards[0, 0] = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=D)
    adv_hacpo = compute_advantages(rewards, torch.ones(1, 1), **get_preset("hacpo").advantage_settings())[0, :, 0].reshape(-1)  # [8]
    adv_gspo = compute_advantages(rewards, None, **get_preset("gspo").advantage_settings())[0, :, 0].reshape(-1)
    torch.testing.assert_close(adv_hacpo, adv_gspo)
    logp = -torch.rand(8, 3, generator=gen, dtype=D)
    mask = torch.ones(8, 3, dtype=torch.bool)
    old_mean = sequence_mean_logp(logp, mask) + 2e-4
    kw = dict(logp_new=logp, loss_mask=mask, is_own=torch.ones(8, dtype=torch.bool), old_logp_mean=old_mean)
    loss_hacpo, _ = hacpo_loss(advantages=adv_hacpo, **preset_loss(get_preset("hacpo")), **kw)
    loss_gspo, _ = hacpo_loss(advantages=adv_gspo, **preset_loss(get_preset("gspo")), **kw)
    torch.testing.assert_close(loss_hacpo, loss_gspo)
