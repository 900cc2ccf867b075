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


def _step(rewards):
    """A StepBatch holding only what the step-start callbacks read: rewards [P, n, G], one view per agent."""
    from types import SimpleNamespace

    from hacrl_lightning.step import StepBatch

    rewards = torch.tensor(rewards, dtype=torch.float32)
    views = {f"a{j}": SimpleNamespace(row_idx=torch.arange(rewards.numel())) for j in range(rewards.shape[1])}
    return StepBatch(examples=[], rollouts=[], rewards=rewards, views=views)


def test_the_capability_callback_feeds_its_window_hands_omega_forward_and_round_trips_its_state():
    from hacrl_lightning.callbacks import CapabilityCallback

    callback = CapabilityCallback(CapabilityWindow(2, window=2), ["a0", "a1"])
    first, second, third = _step([[[1, 0], [1, 1]]]), _step([[[0, 0], [1, 0]]]), _step([[[1, 1], [0, 0]]])  # P=1, n=2, G=2
    callback.on_train_batch_start(None, None, first, 0)      # acc = (0.5, 1.0)
    callback.on_train_batch_start(None, None, second, 1)     # acc = (0.0, 0.5): window means (0.25, 0.75)
    torch.testing.assert_close(second.omega, torch.tensor([[1.0, 1 / 3], [3.0, 1.0]]))
    restored = CapabilityCallback(CapabilityWindow(2, window=2), ["a0", "a1"])
    restored.load_state_dict(json.loads(json.dumps(callback.state_dict())))  # plain values
    again = _step([[[1, 1], [0, 0]]])
    callback.on_train_batch_start(None, None, third, 2)      # acc = (1, 0): window (0.5, 0.25) on both
    restored.on_train_batch_start(None, None, again, 2)
    torch.testing.assert_close(third.omega, torch.tensor([[1.0, 2.0], [0.5, 1.0]]))
    assert torch.equal(again.omega, third.omega) and restored.state_dict() == callback.state_dict()
    with pytest.raises(ValueError, match="resume with the same agents"):
        CapabilityCallback(CapabilityWindow(2), ["a1", "a0"]).load_state_dict(callback.state_dict())


def test_the_clip_schedule_callback_hands_one_bound_per_possible_mini_batch_forward():
    from hacrl_lightning.callbacks import StepwiseClipCallback

    step = _step([[[0, 1, 0], [1, 1, 0]]] * 4)                  # P = 4, n = 2, G = 3: 24 rows per view
    StepwiseClipCallback(delta=0.2, delta_step=0.1, mini_batch_size=5).on_train_batch_start(None, None, step, 0)
    # ceil(24 / 5) = 5 mini-batches; min(1, 0.8 + 0.1 m), the last two held at 1
    assert step.cross_lower == pytest.approx((0.8, 0.9, 1.0, 1.0, 1.0))
