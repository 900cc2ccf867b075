"""Loss building blocks (paper Eqs. 11-14, 47-52; verl aggregation and KL): hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_lightning.algorithms import (
    aggregate_loss,
    cross_clip_lower,
    hacpo_cross_term,
    kl_penalty,
    log_ratio_from_means,
    ppo_clip_term,
    sequence_log_ratio,
    sequence_mean_logp,
)

D = torch.float64
INF = float("inf")


def t(values, **kw):
    return torch.tensor(values, dtype=D, **kw)


def grad_of(fn, x):
    x = x.clone().requires_grad_(True)
    value = fn(x)
    (g,) = torch.autograd.grad(value.sum(), x)
    return value.detach(), g


# --- ratios --------------------------------------------------------------------------------------


def test_sequence_log_ratio_uses_each_side_own_token_count():
    # learner's tokenization: 3 and 1 tokens (padding holds -inf and is never read)
    logp_new = t([[-1.0, -2.0, -3.0, -INF], [-0.5, -INF, -INF, -INF]])
    mask_new = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # source's tokenization: 2 tokens each (T_old = 2 != T = 4)
    logp_old = t([[-0.5, -1.5], [-1.0, -2.0]])
    mask_old = torch.ones(2, 2, dtype=torch.bool)
    torch.testing.assert_close(sequence_mean_logp(logp_new, mask_new), t([-2.0, -0.5]))  # (-1-2-3)/3, -.5/1
    # log s = mean_new - mean_old = [-2 - (-1), -.5 - (-1.5)]
    torch.testing.assert_close(sequence_log_ratio(logp_new, mask_new, logp_old, mask_old), t([-1.0, 1.0]))
    # the trainer's form: the source mean computed once, shared
    torch.testing.assert_close(log_ratio_from_means(t([-2.0, -0.5]), t([-1.0, -1.5])), t([-1.0, 1.0]))


def test_log_ratio_is_clamped_to_ten():
    torch.testing.assert_close(log_ratio_from_means(t([0.0, -30.0, 3.0]), t([-20.0, 0.0, 0.0])), t([10.0, -10.0, 3.0]))


def test_cross_clip_lower_steps_up_to_one():
    # 1 - .2 + m · .025
    assert cross_clip_lower(0, 0.2, 0.025) == pytest.approx(0.8)
    assert cross_clip_lower(1, 0.2, 0.025) == pytest.approx(0.825)
    assert cross_clip_lower(3, 0.2, 0.025) == pytest.approx(0.875)
    assert cross_clip_lower(8, 0.2, 0.025) == pytest.approx(1.0)  # .8 + .2
    assert cross_clip_lower(100, 0.2, 0.025) == 1.0  # capped
    assert cross_clip_lower(5, 0.2, 0.0) == pytest.approx(0.8)  # no stepwise clipping
    assert cross_clip_lower(2, 0.1, 0.01) == pytest.approx(0.92)  # Table 5's lower bound .9 pair
    with pytest.raises(ValueError):
        cross_clip_lower(-1, 0.2, 0.025)


# --- own term: PPO / GSPO clip --------------------------------------------------------------------


def test_ppo_clip_term_by_hand():
    ratio, adv = t([0.5, 0.9, 1.5, 0.5, 1.5]), t([1.0, 1.0, 1.0, -1.0, -1.0])
    value, grad = grad_of(lambda r: ppo_clip_term(r, adv, clip_low=0.2, clip_high=0.3), ratio)
    # A>0: min(.5, .8·1)=.5 | min(.9, .9)=.9 | min(1.5, 1.3)=1.3 (clipped)
    # A<0: min(-.5, -.8)=-.8 (clipped) | min(-1.5, -1.3)=-1.5 (pessimistic, not clipped)
    torch.testing.assert_close(value, t([0.5, 0.9, 1.3, -0.8, -1.5]))
    torch.testing.assert_close(grad, t([1.0, 1.0, 0.0, 0.0, -1.0]))


def test_dual_clip_by_hand():
    # verl's clip_ratio_c: where A < 0 the term is max(min(r·A, clip(r)·A), c·A), c = 3
    ratio, adv = t([0.5, 2.0, 4.0, 4.0, 1.0]), t([-1.0, -1.0, -1.0, 1.0, -2.0])
    term = lambda r, c: ppo_clip_term(r, adv, clip_low=0.2, clip_high=0.28, dual_clip_c=c)  # noqa: E731
    value, grad = grad_of(lambda r: term(r, 3.0), ratio)
    # A<0: max(min(-.5, -.8), -3) = -.8 | max(-2, -3) = -2 | max(-4, -3) = -3 (held: no gradient)
    # A>0 untouched: min(4, 1.28) = 1.28 | A=-2, r=1: max(-2, -6) = -2
    torch.testing.assert_close(value, t([-0.8, -2.0, -3.0, 1.28, -2.0]))
    torch.testing.assert_close(grad, t([0.0, -1.0, 0.0, 0.0, -2.0]))
    for off in (None, 0.0):  # off: the plain PPO min, r = 4 with A < 0 unbounded
        value, grad = grad_of(lambda r: term(r, off), ratio)
        torch.testing.assert_close(value, t([-0.8, -2.0, -4.0, 1.28, -2.0]))
        torch.testing.assert_close(grad, t([0.0, -1.0, -1.0, 0.0, -2.0]))
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        term(ratio, 1.0)


def test_gspo_clip_range_is_tiny():
    # clip 3e-4 / 4e-4: s = 1.001 with A = 1 is clipped to 1.0004
    value = ppo_clip_term(t([1.001]), t([1.0]), clip_low=3e-4, clip_high=4e-4)
    torch.testing.assert_close(value, t([1.0004]))


# --- cross term -----------------------------------------------------------------------------------


def test_cross_term_inside_the_range():
    # lower .8, alpha 1, omega 2, A .5, s = .9: term = .9 · .9 · 2 · .5 = .81
    value, grad = grad_of(lambda s: hacpo_cross_term(s, t([0.5]), t([2.0]), lower=0.8, alpha=1.0), t([0.9]))
    torch.testing.assert_close(value, t([0.81]))
    # d/ds [s · sg(s)] · ω · A = sg(s) · 1 = .9   (not 2s: the weight is detached)
    torch.testing.assert_close(grad, t([0.9]))


@pytest.mark.parametrize(
    "s, adv, expected",
    [
        (0.7, 0.5, 0.8 * 0.8 * 2 * 0.5),  # below: c = .8 -> .64
        (0.7, -0.5, -0.64),  # below, negative A: still no gradient
        (1.1, 0.5, 1.0),  # above: c = 1 -> 1 · 1 · 2 · .5
        (1.1, -0.5, -1.0),  # above, negative A: PPO's min would keep the gradient here
    ],
)
def test_cross_term_outside_the_range_has_zero_gradient(s, adv, expected):
    value, grad = grad_of(lambda r: hacpo_cross_term(r, t([adv]), t([2.0]), lower=0.8, alpha=1.0), t([s]))
    torch.testing.assert_close(value, t([expected]))
    assert grad.item() == 0.0


def test_ppo_min_would_not_zero_the_gradient_where_the_hard_clamp_does():
    # the contrast with the last case above: s = 1.1, A = -.5 under a PPO min keeps a gradient
    _, grad = grad_of(lambda r: ppo_clip_term(r, t([-0.5]), clip_low=0.2, clip_high=0.0), t([1.1]))
    assert grad.item() == pytest.approx(-0.5)


def test_cross_term_alpha_and_no_clip():
    # alpha = 3: .9 · .9³ · 1 · 1 = .9⁴ = .6561
    assert hacpo_cross_term(t([0.9]), t([1.0]), t([1.0]), lower=0.8, alpha=3.0).item() == pytest.approx(0.6561)
    # alpha = 0: plain clipped ratio
    assert hacpo_cross_term(t([0.9]), t([1.0]), t([1.0]), lower=0.8, alpha=0.0).item() == pytest.approx(0.9)
    # clip off: s = 1.1 is kept: 1.1 · 1.1 · 2 · .5 = 1.21, gradient sg(s) · ω · A = 1.1
    value, grad = grad_of(lambda r: hacpo_cross_term(r, t([0.5]), t([2.0]), lower=0.8, alpha=1.0, clip=False), t([1.1]))
    torch.testing.assert_close(value, t([1.21]))
    torch.testing.assert_close(grad, t([1.1]))


def test_stepwise_bound_drops_a_ratio_in_later_mini_batches():
    s = t([0.81])
    grads = []
    for m in range(3):  # lower bounds .8, .825, .85
        lower = cross_clip_lower(m, 0.2, 0.025)
        _, grad = grad_of(lambda r: hacpo_cross_term(r, t([1.0]), t([1.0]), lower=lower, alpha=1.0), s)
        grads.append(grad.item())
    # m = 0: .81 inside [.8, 1] -> gradient sg(s) = .81; m = 1, 2: .81 < lower -> none
    assert grads == pytest.approx([0.81, 0.0, 0.0])


# --- KL -------------------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp, ref = t([[math.log(0.5)]]), t([[math.log(0.25)]])
    # logp - ref = log 2 = .693147
    assert kl_penalty(logp, ref, estimator="k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, estimator="k2").item() == pytest.approx(0.5 * math.log(2) ** 2)  # .240227
    # k3 = exp(ref - logp) - (ref - logp) - 1 = .5 + .693147 - 1 = .193147
    assert kl_penalty(logp, ref, estimator="k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(ref, ref, estimator="k3").item() == 0.0
    with pytest.raises(ValueError, match=r"known \['k1', 'k2', 'k3'\]"):
        kl_penalty(logp, ref, estimator="abs")


# --- aggregation ----------------------------------------------------------------------------------

LOSS_MAT = t([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
LOSS_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 15 / 5),  # (1+2+3+4+5) / 5 tokens
        ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),  # (2 + 4.5) / 2 = 3.25
        ("seq-mean-token-sum", (6 + 9) / 2),  # 7.5
        ("seq-mean-token-sum-norm", (6 + 9) / (2 * 3)),  # token sums / (2 seqs · T=3) = 2.5
    ],
)
def test_aggregation_modes_by_hand(mode, expected):
    assert aggregate_loss(LOSS_MAT, LOSS_MASK, mode=mode).item() == pytest.approx(expected)


def test_aggregation_with_totals_is_micro_batch_invariant():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        whole = aggregate_loss(LOSS_MAT, LOSS_MASK, mode=mode, loss_scale_factor=3)
        totals = dict(total_tokens=5, total_seqs=2, loss_scale_factor=3)
        parts = sum(aggregate_loss(LOSS_MAT[i : i + 1], LOSS_MASK[i : i + 1], mode=mode, **totals) for i in range(2))
        assert parts.item() == pytest.approx(whole.item()), mode


def test_aggregation_ignores_rows_without_tokens_and_rejects_unknown_modes():
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    assert aggregate_loss(LOSS_MAT, mask, mode="seq-mean-token-mean").item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate_loss(LOSS_MAT, LOSS_MASK, mode="sum")
