"""Advantages (docs/spec.md §4, paper Eqs. 5-7): hand-computed 2- and 3-agent cases, guards, properties.

Hand cases use eps=0 so the numbers are exact fractions; one test checks the default eps.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_lightning.algorithms import (
    capability_ratios,
    compute_advantages,
    group_advantages,
    hacpo_advantages,
    hacpo_baseline,
)
from hacrl_lightning.presets import get_preset

D = torch.float64


def t(values):
    return torch.tensor(values, dtype=D)


# --- group advantages (GRPO / GSPO, Eq. 5) -----------------------------------------------------


def test_group_advantages_by_hand():
    rewards = t([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    adv = group_advantages(rewards, eps=0.0)
    # row 0: mean .5, sample var = 4 * .25 / 3 = 1/3 -> A = ±.5 / sqrt(1/3)
    a = 0.5 / math.sqrt(1 / 3)
    # row 1: all equal -> 0
    # row 2: mean .25, sample var = (3 * .0625 + .5625) / 3 = .25 -> std .5 -> A = (R - .25) / .5
    expected = t([[a, -a, -a, a], [0, 0, 0, 0], [-0.5, -0.5, -0.5, 1.5]])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_without_std_only_centres():
    rewards = t([[1, 0, 0, 1], [0, 0, 0, 1]])
    adv = group_advantages(rewards, scale_by_std=False)
    torch.testing.assert_close(adv, t([[0.5, -0.5, -0.5, 0.5], [-0.25, -0.25, -0.25, 0.75]]))


def test_group_advantages_default_eps():
    adv = group_advantages(t([[0, 0, 0, 1]]))
    # std .5 + 1e-6 in the denominator
    torch.testing.assert_close(adv, t([[-0.25, -0.25, -0.25, 0.75]]) / (0.5 + 1e-6))


def test_group_advantages_equal_non_binary_rewards_are_exactly_zero():
    adv = group_advantages(t([[0.1, 0.1, 0.1]]))
    assert torch.equal(adv, torch.zeros(1, 3, dtype=D))


# --- HACPO, two agents ---------------------------------------------------------------------------

# caps [.25, .5] -> omega[k, j] = cap_k / cap_j = [[1, .5], [2, 1]] (agent 1 is the stronger)
OMEGA_2 = capability_ratios(t([0.25, 0.5]))
REWARDS_2 = t(
    [
        [[1, 1], [1, 0]],  # p0: agent 0 all right, agent 1 half
        [[1, 1], [1, 1]],  # p1: every reward equal
        [[0, 1], [0, 0]],  # p2
    ]
)  # [P=3, n=2, G=2]


def test_two_agent_baseline_by_hand():
    torch.testing.assert_close(OMEGA_2, t([[1.0, 0.5], [2.0, 1.0]]))
    mu = hacpo_baseline(REWARDS_2, OMEGA_2)
    # p0: mu[0] = (1·(1+1) + .5·(1+0)) / 4 = 2.5/4 = .625
    #     mu[1] = (2·(1+1) + 1·(1+0)) / 4 = 5/4 = 1.25 > 1 -> guard -> own mean mean(1, 0) = .5
    # p1: mu[0] = (1·2 + .5·2) / 4 = .75;  mu[1] = (2·2 + 1·2) / 4 = 1.5 > 1 -> own mean 1
    # p2: mu[0] = (1·1 + .5·0) / 4 = .25;  mu[1] = (2·1 + 1·0) / 4 = .5
    torch.testing.assert_close(mu, t([[0.625, 0.75, 0.25], [0.5, 1.0, 0.5]]))
    unguarded = hacpo_baseline(REWARDS_2, OMEGA_2, baseline_guard=False)
    torch.testing.assert_close(unguarded, t([[0.625, 0.75, 0.25], [1.25, 1.5, 0.5]]))


def test_two_agent_advantages_by_hand():
    adv = hacpo_advantages(REWARDS_2, OMEGA_2, eps=0.0)
    assert adv.shape == (2, 3, 2, 2)  # [learner, prompt, source, sample]
    # p0 joint {1,1,1,0}: mean .75, sample var = (3·.0625 + .5625)/3 = .25 -> sigma .5
    torch.testing.assert_close(adv[0, 0], (REWARDS_2[0] - 0.625) / 0.5)  # [[.75,.75],[.75,-1.25]]
    torch.testing.assert_close(adv[0, 0], t([[0.75, 0.75], [0.75, -1.25]]))
    torch.testing.assert_close(adv[1, 0], t([[1.0, 1.0], [1.0, -1.0]]))  # guard: baseline .5
    # p1: all n·G rewards equal -> 0 for every learner (the equal-reward guard beats the baseline guard)
    assert torch.equal(adv[:, 1], torch.zeros(2, 2, 2, dtype=D))
    # p2 joint {0,1,0,0}: mean .25, sigma .5 (as p0, mirrored)
    torch.testing.assert_close(adv[0, 2], t([[-0.5, 1.5], [-0.5, -0.5]]))  # (R - .25) / .5
    torch.testing.assert_close(adv[1, 2], t([[-1.0, 1.0], [-1.0, -1.0]]))  # (R - .5) / .5


def test_two_agent_without_baseline_guard():
    adv = hacpo_advantages(REWARDS_2, OMEGA_2, eps=0.0, baseline_guard=False)
    # p0, learner 1: (R - 1.25) / .5
    torch.testing.assert_close(adv[1, 0], t([[-0.5, -0.5], [-0.5, -2.5]]))
    assert torch.equal(adv[:, 1], torch.zeros(2, 2, 2, dtype=D))  # equal rewards still 0


def test_default_eps_is_added_to_sigma():
    adv = hacpo_advantages(REWARDS_2, OMEGA_2)
    torch.testing.assert_close(adv[0, 2], t([[-0.25, 0.75], [-0.25, -0.25]]) / (0.5 + 1e-6))


# --- HACPO, three agents -------------------------------------------------------------------------

# caps [.2, .4, .8] -> omega = [[1, .5, .25], [2, 1, .5], [4, 2, 1]]
OMEGA_3 = capability_ratios(t([0.2, 0.4, 0.8]))
REWARDS_3 = t(
    [
        [[1, 0], [1, 0], [1, 1]],  # p0: source sums [1, 1, 2]
        [[0, 0], [1, 0], [0, 0]],  # p1: source sums [0, 1, 0]
        [[0, 0], [0, 0], [0, 0]],  # p2: all equal
    ]
)  # [P=3, n=3, G=2]


def test_three_agent_advantages_by_hand():
    torch.testing.assert_close(OMEGA_3, t([[1, 0.5, 0.25], [2, 1, 0.5], [4, 2, 1]]))
    mu = hacpo_baseline(REWARDS_3, OMEGA_3)
    # p0, nG = 6: mu[0] = (1·1 + .5·1 + .25·2)/6 = 2/6;  mu[1] = (2·1 + 1·1 + .5·2)/6 = 4/6
    #             mu[2] = (4·1 + 2·1 + 1·2)/6 = 8/6 > 1 -> guard -> own mean mean(1, 1) = 1
    # p1:         mu[0] = (.5·1)/6 = 1/12;  mu[1] = (1·1)/6 = 1/6;  mu[2] = (2·1)/6 = 1/3
    # p2:         all rewards 0 -> mu = 0
    torch.testing.assert_close(mu, t([[1 / 3, 1 / 12, 0], [2 / 3, 1 / 6, 0], [1.0, 1 / 3, 0]]))

    adv = hacpo_advantages(REWARDS_3, OMEGA_3, eps=0.0)
    assert adv.shape == (3, 3, 3, 2)
    # p0 joint {1,0,1,0,1,1}: mean 2/3, Σ(x - mean)² = 4·(1/3)² + 2·(2/3)² = 4/3 -> var = (4/3)/5 = 4/15
    sigma0 = math.sqrt(4 / 15)
    for k, mu_k in enumerate([1 / 3, 2 / 3, 1.0]):
        torch.testing.assert_close(adv[k, 0], (REWARDS_3[0] - mu_k) / sigma0)
    # spot values: learner 0, source 2, sample 0: (1 - 1/3)/sqrt(4/15) = 1.2909944
    assert adv[0, 0, 2, 0].item() == pytest.approx(1.2909944, abs=1e-6)
    # learner 2 (guarded, baseline 1): a wrong answer of source 0 gives (0 - 1)/sqrt(4/15) = -1.9364917
    assert adv[2, 0, 0, 1].item() == pytest.approx(-1.9364917, abs=1e-6)
    # p1 joint {0,0,1,0,0,0}: mean 1/6, Σ(x - mean)² = 5/36 + 25/36 = 30/36 -> var = (30/36)/5 = 1/6
    sigma1 = math.sqrt(1 / 6)
    for k, mu_k in enumerate([1 / 12, 1 / 6, 1 / 3]):
        torch.testing.assert_close(adv[k, 1], (REWARDS_3[1] - mu_k) / sigma1)
    assert adv[1, 1, 1, 0].item() == pytest.approx((1 - 1 / 6) / sigma1)  # 2.0412415
    assert torch.equal(adv[:, 2], torch.zeros(3, 3, 2, dtype=D))  # p2: equal rewards


def test_hacpo_rejects_mismatched_omega():
    with pytest.raises(ValueError, match=r"omega must have shape \[3, 3\]"):
        hacpo_advantages(REWARDS_3, OMEGA_2)


# --- compute_advantages: the config decides ------------------------------------------------------


def test_compute_advantages_follows_the_preset():
    hacpo = compute_advantages(REWARDS_3, OMEGA_3, **get_preset("hacpo").advantage_settings(), eps=0.0)
    torch.testing.assert_close(hacpo, hacpo_advantages(REWARDS_3, OMEGA_3, eps=0.0))
    ones = torch.ones(3, 3, dtype=D)
    for name in ("hacpo_no_adv", "naive"):  # omega ≡ 1 in the baseline; omega may be omitted
        torch.testing.assert_close(
            compute_advantages(REWARDS_3, None, **get_preset(name).advantage_settings(), eps=0.0), hacpo_advantages(REWARDS_3, ones, eps=0.0)
        )
    # the other ablations leave the baseline alone
    for name in ("hacpo_no_omega", "hacpo_alpha0", "hacpo_no_stepwise", "hacpo_no_clip"):
        torch.testing.assert_close(compute_advantages(REWARDS_3, OMEGA_3, **get_preset(name).advantage_settings(), eps=0.0), hacpo)


def test_compute_advantages_group_is_own_group_for_every_learner():
    adv = compute_advantages(REWARDS_3, None, **get_preset("gspo").advantage_settings(), eps=0.0)
    assert adv.shape == (3, 3, 3, 2)
    for k in range(3):
        for j in range(3):
            torch.testing.assert_close(adv[k, :, j], group_advantages(REWARDS_3[:, j], eps=0.0))
    # p0 source 0 rewards (1, 0): mean .5, sample std sqrt(.5) -> ±.5/sqrt(.5) = ±.7071068
    assert adv[0, 0, 0, 0].item() == pytest.approx(0.7071068, abs=1e-6)


def test_compute_advantages_errors():
    with pytest.raises(ValueError, match="needs the omega matrix"):
        compute_advantages(REWARDS_3, None, **get_preset("hacpo").advantage_settings())
    with pytest.raises(ValueError, match=r"known \['group', 'hacpo'\]"):
        compute_advantages(REWARDS_3, OMEGA_3, **replace(get_preset("hacpo"), advantage="nope").advantage_settings())


def test_single_agent_hacpo_is_the_group_advantage():
    rewards = t([[[1, 0, 0, 1]], [[0, 0, 0, 1]], [[1, 1, 1, 1]]])  # [P=3, n=1, G=4]
    adv = compute_advantages(rewards, torch.ones(1, 1), **get_preset("hacpo").advantage_settings())
    torch.testing.assert_close(adv[0, :, 0], group_advantages(rewards[:, 0]))


# --- properties ----------------------------------------------------------------------------------


def _draw(seed: int, num_prompts: int, n: int, g: int, binary: bool):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(num_prompts, n, g, generator=gen, dtype=D)
    rewards = (rewards > 0.5).to(D) if binary else rewards
    cap = torch.rand(n, generator=gen, dtype=D) * 0.98 + 0.01
    return rewards, capability_ratios(cap)


DIMS = dict(seed=st.integers(0, 2**31 - 1), num_prompts=st.integers(1, 4), n=st.integers(1, 4), g=st.integers(2, 5))


@settings(max_examples=60, deadline=None)
@given(binary=st.booleans(), **DIMS)
def test_unweighted_joint_advantages_sum_to_zero(seed, num_prompts, n, g, binary):
    rewards, _ = _draw(seed, num_prompts, n, g, binary)
    adv = hacpo_advantages(rewards, torch.ones(n, n, dtype=D))
    assert adv.shape == (n, num_prompts, n, g)
    # omega ≡ 1: one joint baseline (<= 1, so the guard never fires), the same for every learner
    torch.testing.assert_close(adv.sum(dim=(2, 3)), torch.zeros(n, num_prompts, dtype=D), atol=1e-9, rtol=0)
    torch.testing.assert_close(adv, adv[:1].expand_as(adv))


@settings(max_examples=60, deadline=None)
@given(binary=st.booleans(), **DIMS)
def test_advantages_rank_responses_like_rewards(seed, num_prompts, n, g, binary):
    rewards, omega = _draw(seed, num_prompts, n, g, binary)
    adv = hacpo_advantages(rewards, omega)
    joint = rewards.reshape(1, num_prompts, n * g)  # [1, P, nG]
    flat = adv.reshape(n, num_prompts, n * g)  # [n, P, nG]
    # within one learner and prompt, a higher reward always has a higher advantage (any omega)
    higher = joint[..., :, None] > joint[..., None, :]  # [1, P, nG, nG]
    gap = flat[..., :, None] - flat[..., None, :]  # [n, P, nG, nG]
    assert bool((gap[higher.expand_as(gap)] > 0).all())
    # equal-reward prompts give exactly 0
    uniform = (joint == joint[..., :1]).all(-1).squeeze(0)  # [P]
    assert bool((adv[:, uniform] == 0).all())
