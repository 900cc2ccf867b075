"""`select_cross_samples`: capped, uniform, seeded choice of partner responses (beyond the paper)."""

from __future__ import annotations

import pytest
import torch

from hacrl_lightning.algorithms import select_cross_samples

# learner 0's view with n = 3, P = 2, G = 4: per prompt 4 own and 8 partner responses
SOURCE = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [0] * 4 + [1] * 4 + [2] * 4)
PROMPT = torch.tensor([0] * 12 + [1] * 12)


def draw(per_prompt, seed=0, learner=0):
    gen = torch.Generator().manual_seed(seed)
    return select_cross_samples(SOURCE, PROMPT, learner=learner, per_prompt=per_prompt, generator=gen)


def test_all_keeps_everything():
    for value in (None, 8, 100):  # the config's "all" arrives as None (config.parse_cross_samples)
        assert bool(draw(value).all())


def test_cap_per_prompt_and_own_always_kept():
    for learner in (0, 2):
        keep = draw(3, learner=learner)
        own = SOURCE == learner
        assert bool(keep[own].all())
        for p in (0, 1):
            assert int((keep & ~own & (PROMPT == p)).sum()) == 3


def test_seeded_and_reproducible():
    assert torch.equal(draw(3, seed=5), draw(3, seed=5))
    assert len({tuple(draw(3, seed=s).tolist()) for s in range(10)}) > 1


def test_uniform_over_partner_responses():
    counts = torch.zeros(24)
    draws = 1500
    for seed in range(draws):
        counts += draw(2, seed=seed).double()
    cross = SOURCE != 0
    # each of the 8 partner responses of a prompt is kept with probability 2/8 = .25;
    # sd of a frequency over 1500 draws = sqrt(.25·.75/1500) ≈ .011, tolerance .05 ≈ 4.5 sd
    freq = counts[cross] / draws
    assert bool(((freq - 0.25).abs() < 0.05).all()), freq
    assert bool((counts[~cross] == draws).all())


def test_invalid_values_are_refused():
    for bad in (0, -1, "all", "some", 2.5, True):
        with pytest.raises(ValueError, match="per_prompt must be None"):
            draw(bad)


def test_order_of_the_view_does_not_matter():
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(0)
    keep = select_cross_samples(SOURCE[perm], PROMPT[perm], learner=1, per_prompt=5, generator=gen)
    own = SOURCE[perm] == 1
    assert bool(keep[own].all())
    for p in (0, 1):
        assert int((keep & ~own & (PROMPT[perm] == p)).sum()) == 5
