"""Capability window and ratio matrix (docs/spec.md §2-3, paper Eqs. 8-9): hand-computed numbers."""

from __future__ import annotations

import json

import pytest
import torch

from hacrl_lightning.algorithms import CapabilityWindow, capability_ratios, step_accuracy
from hacrl_lightning.presets import get_preset


def test_capability_ratios_by_hand():
    cap = torch.tensor([0.2, 0.4, 0.8])
    omega = capability_ratios(cap)
    # [k, j] = cap[k] / cap[j]: row 0 = [1, .2/.4, .2/.8], row 1 = [.4/.2, 1, .4/.8], row 2 = [.8/.2, .8/.4, 1]
    expected = torch.tensor([[1.0, 0.5, 0.25], [2.0, 1.0, 0.5], [4.0, 2.0, 1.0]])
    torch.testing.assert_close(omega, expected)


def test_capability_ratios_clamp_and_diagonal():
    cap = torch.tensor([1e-8, 0.5, 1.0])
    omega = capability_ratios(cap, clamp=(0.1, 10.0))
    # 1e-8 / 0.5 = 2e-8 -> 0.1; 0.5 / 1e-8 = 5e7 -> 10; 0.5 / 1.0 = 0.5 stays; diagonal 1
    expected = torch.tensor([[1.0, 0.1, 0.1], [10.0, 1.0, 0.5], [10.0, 2.0, 1.0]])
    torch.testing.assert_close(omega, expected)


def test_capability_ratios_rejects_non_positive():
    with pytest.raises(ValueError, match="positive"):
        capability_ratios(torch.tensor([0.5, 0.0]))


def test_step_accuracy_counts_positive_rewards():
    # P=2, n=2, G=2: agent 0 has rewards {1, 0, 0.5, 0} -> 2 of 4 positive; agent 1 {0,0,0,1} -> 1 of 4
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.5, 0.0], [0.0, 1.0]]])
    torch.testing.assert_close(step_accuracy(rewards), torch.tensor([0.5, 0.25]))


def test_window_before_history_is_all_ones():
    window = CapabilityWindow(3)
    torch.testing.assert_close(window.capabilities(), torch.ones(3))
    torch.testing.assert_close(window.omega(), torch.ones(3, 3))


def test_window_mean_over_last_k_steps_including_current():
    window = CapabilityWindow(2, window=3)
    for acc in ([0.2, 0.4], [0.4, 0.8], [0.6, 0.0], [0.8, 0.0]):
        window.update(torch.tensor(acc))
    # the first step falls out: agent 0 mean(.4, .6, .8) = .6; agent 1 mean(.8, 0, 0) = .8/3
    torch.testing.assert_close(window.capabilities(), torch.tensor([0.6, 0.8 / 3]))
    # omega[0, 1] = .6 / (.8/3) = 2.25; omega[1, 0] = 1 / 2.25
    torch.testing.assert_close(window.omega(), torch.tensor([[1.0, 2.25], [1 / 2.25, 1.0]]))


def test_window_floor_and_clamp():
    window = CapabilityWindow(2, window=2, floor=1e-8)
    window.update(torch.tensor([0.5, 0.0]))
    # agent 1 has accuracy 0 -> cap floored to 1e-8; ratios .5/1e-8 -> 10 and 1e-8/.5 -> 0.1
    torch.testing.assert_close(window.capabilities(), torch.tensor([0.5, 1e-8]))
    torch.testing.assert_close(window.omega(), torch.tensor([[1.0, 10.0], [0.1, 1.0]]))


def test_window_warmup_forces_ones():
    window = CapabilityWindow(2, warmup_steps=2)
    window.update(torch.tensor([0.2, 0.8]))
    window.update(torch.tensor([0.2, 0.8]))
    torch.testing.assert_close(window.omega(), torch.ones(2, 2))  # steps 1 and 2: warm-up
    window.update(torch.tensor([0.2, 0.8]))
    torch.testing.assert_close(window.omega(), torch.tensor([[1.0, 0.25], [4.0, 1.0]]))  # .2/.8, .8/.2


def test_window_rejects_bad_accuracy():
    window = CapabilityWindow(2)
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        window.update(torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        window.update(torch.tensor([1.5, 0.5]))


def test_state_dict_round_trip_is_plain_and_exact():
    window = CapabilityWindow(3, window=2, warmup_steps=1)
    for acc in ([0.1, 0.5, 0.9], [0.3, 0.5, 0.7], [0.2, 0.6, 0.4]):
        window.update(torch.tensor(acc))
    state = json.loads(json.dumps(window.state_dict()))  # plain lists / floats / ints only
    restored = CapabilityWindow(3, window=2, warmup_steps=1)
    restored.load_state_dict(state)
    assert restored.steps == 3
    torch.testing.assert_close(restored.omega(), window.omega())
    # and both continue identically
    window.update(torch.tensor([0.5, 0.5, 0.5]))
    restored.update(torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(restored.capabilities(), window.capabilities())


def test_load_state_dict_refuses_other_agent_count():
    state = CapabilityWindow(2).state_dict()
    with pytest.raises(ValueError, match="n_agents=2"):
        CapabilityWindow(3).load_state_dict(state)


def test_capability_settings_are_the_algorithm_fields():
    cfg = get_preset("hacpo")
    window = CapabilityWindow(2, **cfg.capability_settings())
    assert (window.window, window.floor, window.warmup_steps, window.clamp) == (5, 1e-8, 0, (0.1, 10.0))
