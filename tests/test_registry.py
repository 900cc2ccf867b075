"""Algorithm presets (docs/spec.md §9): selectable by name, loud on unknown names, and each ablation
differs from `hacpo` only in the component it names, in its fields and in its behaviour."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import pytest
import torch

from conftest import preset_loss

from hacrl_lightning.algorithms import compute_advantages, hacpo_loss
from hacrl_lightning.config import AlgorithmConfig, PairConfig
from hacrl_lightning.presets import (PRESETS, composition_problems, defining_values, get_preset, pair_fields_taken,
                                     preset_names, resolve_algorithm)

D = torch.float64
GSPO_FIELDS = {"share_rollouts", "advantage", "capability_baseline"}
# the fields each preset may change relative to hacpo (besides its name)
COMPONENT_FIELDS = {
    "hacpo": set(),
    "hacpo_no_adv": {"capability_baseline"},
    "hacpo_no_omega": {"omega_factor"},
    "hacpo_alpha0": {"alpha"},
    "hacpo_no_stepwise": {"delta_step"},
    "hacpo_no_clip": {"cross_clip"},
    "hacpo_paper_main": {"learner_order", "partner_advantage_span", "kl_agg_mode"},
    "naive": {"capability_baseline", "cross_loss", "alpha", "delta_step", "omega_factor"},
    "gspo": GSPO_FIELDS,
    "gspo_x2": GSPO_FIELDS | {"rollout_multiplier"},
    "grpo": GSPO_FIELDS | {"ratio_level", "clip_low", "clip_high", "loss_agg_mode"},
}


def test_every_spec_preset_exists_and_is_selectable():
    assert preset_names() == sorted(COMPONENT_FIELDS)
    for name in preset_names():
        cfg = get_preset(name)
        assert isinstance(cfg, AlgorithmConfig) and cfg.name == name


def test_get_preset_returns_a_copy():
    cfg = get_preset("hacpo")
    cfg.alpha = 42.0
    assert PRESETS["hacpo"].alpha == 1.0 and get_preset("hacpo").alpha == 1.0


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(KeyError) as info:
        get_preset("hacpo_no_alpha")
    message = str(info.value)
    assert "hacpo_no_alpha" in message and str(sorted(PRESETS)) in message
    assert "did you mean" in message


@pytest.mark.parametrize("name", sorted(COMPONENT_FIELDS))
def test_preset_differs_from_hacpo_only_in_its_component(name):
    base, cfg = asdict(get_preset("hacpo")), asdict(get_preset(name))
    changed = {key for key in base if base[key] != cfg[key]} - {"name"}
    assert changed == COMPONENT_FIELDS[name]


@pytest.mark.parametrize("name", sorted(COMPONENT_FIELDS))
def test_defining_values_are_the_component_with_the_presets_values(name):
    assert defining_values(name) == {key: getattr(get_preset(name), key) for key in COMPONENT_FIELDS[name]}


# --- an experiment's pair values (Table 5) on top of a preset: pure, no Hydra ----------------------

PAIR = PairConfig(alpha=3.0, delta=0.1, delta_step=0.01)


def test_pair_values_reach_the_hacpo_family_only_and_never_undo_an_ablation():
    assert pair_fields_taken("hacpo") == pair_fields_taken("hacpo_no_clip") == ("alpha", "delta", "delta_step")
    assert pair_fields_taken("hacpo_alpha0") == ("delta", "delta_step")
    assert pair_fields_taken("hacpo_no_stepwise") == ("alpha", "delta")
    for baseline in ("grpo", "gspo", "gspo_x2", "naive"):
        assert pair_fields_taken(baseline) == ()
        assert resolve_algorithm(get_preset(baseline), PAIR) == get_preset(baseline)
    alpha0 = resolve_algorithm(get_preset("hacpo_alpha0"), PAIR)
    assert (alpha0.alpha, alpha0.delta, alpha0.delta_step) == (0.0, 0.1, 0.01)


def test_an_explicit_algorithm_value_wins_and_unset_pair_fields_change_nothing():
    tuned = resolve_algorithm(replace(get_preset("hacpo"), alpha=2.0), PAIR, explicit={"algorithm.alpha"})
    assert (tuned.alpha, tuned.delta) == (2.0, 0.1)
    assert resolve_algorithm(get_preset("hacpo"), PairConfig()) == get_preset("hacpo")


def test_composition_problems_come_from_the_defining_values():
    assert composition_problems(get_preset("hacpo_no_omega"), PAIR) == []
    (undone,) = composition_problems(replace(get_preset("hacpo_no_omega"), omega_factor=True), PAIR,
                                     explicit={"algorithm.omega_factor"})
    assert undone.key == "algorithm.omega_factor" and "algorithm=hacpo " in undone.fix
    (from_a_file,) = composition_problems(replace(get_preset("hacpo_alpha0"), alpha=3.0), PAIR)
    assert from_a_file.key == "algorithm.alpha" and "config file" in from_a_file.fix
    # the command line may tune a baseline's own numbers, a shared experiment file may not
    assert composition_problems(replace(get_preset("grpo"), clip_low=0.1), PAIR, explicit={"algorithm.clip_low"}) == []
    assert [p.key for p in composition_problems(replace(get_preset("grpo"), clip_low=0.1), PAIR)] == ["algorithm.clip_low"]


# --- behaviour: each ablation changes the loss (or the advantage) only through its component ------


def loss_and_grad(cfg, *, s_cross=0.9, omega_cross=2.0, m=0):
    """A mini-batch of one own response (s = 1) and one cross response (ratio s_cross, omega factor)."""
    logp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], dtype=D, requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    old_mean = torch.tensor([-1.0, -2.0 - math.log(s_cross)], dtype=D)
    loss, _ = hacpo_loss(
        logp_new=logp, loss_mask=mask, advantages=torch.tensor([0.5, 1.5], dtype=D),
        is_own=torch.tensor([True, False]), old_logp_mean=old_mean,
        omega_factor=torch.tensor([1.0, omega_cross], dtype=D), **preset_loss(cfg, m),
    )
    return loss.detach(), torch.autograd.grad(loss, logp)[0]


def same(a, b):
    return all(torch.allclose(x, y, rtol=0, atol=1e-12) for x, y in zip(a, b))


# (preset, inputs where its component is inactive, inputs where it acts)
LOSS_CASES = [
    ("hacpo_alpha0", dict(s_cross=1.0), dict(s_cross=0.9)),  # sg(1)^α = 1 for any α
    ("hacpo_no_omega", dict(omega_cross=1.0), dict(omega_cross=2.0)),
    ("hacpo_no_stepwise", dict(s_cross=0.82, m=0), dict(s_cross=0.82, m=2)),  # lower .8 vs .85
    ("hacpo_no_clip", dict(s_cross=0.9), dict(s_cross=0.5)),  # .5 < lower .8
    ("naive", dict(s_cross=1.0, omega_cross=1.0), dict(s_cross=0.9)),  # at s = 1, ω = 1 both terms are A
]


@pytest.mark.parametrize("name, neutral, witness", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_ablation_changes_the_loss_only_where_its_component_acts(name, neutral, witness):
    hacpo, ablation = get_preset("hacpo"), get_preset(name)
    assert same(loss_and_grad(hacpo, **neutral), loss_and_grad(ablation, **neutral))
    assert not same(loss_and_grad(hacpo, **witness), loss_and_grad(ablation, **witness))


def test_no_adv_changes_the_baseline_only():
    hacpo, no_adv = get_preset("hacpo"), get_preset("hacpo_no_adv")
    # the loss is untouched, whatever the inputs
    for kw in (dict(s_cross=0.9), dict(s_cross=0.5, m=3), dict(omega_cross=4.0)):
        assert same(loss_and_grad(hacpo, **kw), loss_and_grad(no_adv, **kw))
    rewards = torch.tensor([[[1, 0], [1, 1]], [[0, 0], [1, 0]]], dtype=D)  # [P=2, n=2, G=2]
    ones, unequal = torch.ones(2, 2, dtype=D), torch.tensor([[1.0, 0.5], [2.0, 1.0]], dtype=D)
    torch.testing.assert_close(compute_advantages(rewards, ones, **hacpo.advantage_settings()),
                               compute_advantages(rewards, ones, **no_adv.advantage_settings()))
    assert not torch.allclose(compute_advantages(rewards, unequal, **hacpo.advantage_settings()),
                              compute_advantages(rewards, unequal, **no_adv.advantage_settings()))


@pytest.mark.parametrize("register, table", [
    ("register_ratio_level", "RATIO_TERMS"), ("register_cross_loss", "CROSS_TERMS"), ("register_reward", "REWARDS")])
def test_a_registry_refuses_a_taken_name_and_keeps_its_function(register, table):
    """Every registry of named choices (the loss's ratio levels and cross terms, the rewards) refuses a second
    function under a taken name, naming the holder, and keeps the first; the same function again is a no-op."""
    from hacrl_lightning.algorithms import objective
    from hacrl_lightning.rewards import registry

    module = objective if hasattr(objective, register) else registry
    holders = getattr(module, table)
    name, first = next(iter(holders.items()))
    with pytest.raises(ValueError, match=rf"{name!r} is already registered to {first.__qualname__}; pick another"):
        getattr(module, register)(name)(lambda *args: None)
    assert holders[name] is first
    assert getattr(module, register)(name)(first) is first and holders[name] is first
