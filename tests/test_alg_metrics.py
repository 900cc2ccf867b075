"""Unbiased pass@k (Chen et al. 2021) and avg@k."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_lightning.algorithms import avg_at_k, pass_at_k, unbiased_pass_at_k


def test_pass_at_k_by_hand():
    # n = 5 samples, c = 2 correct
    assert unbiased_pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert unbiased_pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert unbiased_pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert unbiased_pass_at_k(5, 2, 4) == 1.0  # n - c = 3 < k: every 4-subset has a correct one
    assert unbiased_pass_at_k(5, 0, 5) == 0.0
    # large n, no big binomials: 1 - C(199, 100)/C(200, 100) = 1 - 100/200
    assert unbiased_pass_at_k(200, 1, 100) == pytest.approx(0.5)


def test_tensor_pass_at_k_matches_the_binomial_formula():
    n = 10
    correct = torch.zeros(n + 1, n, dtype=torch.bool)
    for c in range(n + 1):
        correct[c, :c] = True  # problem c has c correct samples
    for k in range(1, n + 1):
        expected = [1 - math.comb(n - c, k) / math.comb(n, k) for c in range(n + 1)]
        torch.testing.assert_close(pass_at_k(correct, k, reduction="none"), torch.tensor(expected, dtype=torch.float64))
        assert pass_at_k(correct, k).item() == pytest.approx(sum(expected) / len(expected))  # benchmark mean
        assert [unbiased_pass_at_k(n, c, k) for c in range(n + 1)] == pytest.approx(expected)


def test_avg_at_k_and_errors():
    scores = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0]])
    torch.testing.assert_close(avg_at_k(scores, reduction="none"), torch.tensor([0.75, 0.0], dtype=torch.float64))
    assert avg_at_k(scores).item() == pytest.approx(0.375)
    with pytest.raises(ValueError):
        pass_at_k(scores, 5)
    with pytest.raises(ValueError, match="reduction"):
        pass_at_k(scores, 2, reduction="sum")
    with pytest.raises(ValueError):
        unbiased_pass_at_k(3, 4, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=5))
def test_pass_at_k_is_a_probability_monotone_in_k(rows):
    correct = torch.tensor(rows)
    values = torch.stack([pass_at_k(correct, k, reduction="none") for k in range(1, 7)])  # [k, P]
    assert bool(((values >= 0) & (values <= 1 + 1e-12)).all())
    assert bool((values[1:] >= values[:-1] - 1e-12).all())
    torch.testing.assert_close(values[0], avg_at_k(correct, reduction="none"))  # pass@1 = avg accuracy
