"""`hacpo_loss`, the trainer's one entry point: hand-computed mixed batches under each preset."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch

from conftest import preset_loss
from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.algorithms.objective import CROSS_TERMS, SETTINGS, LossSettings
from hacrl_lightning.presets import PRESETS, get_preset

D = torch.float64
INF = float("inf")


def rows(means, lengths, width):
    """logp [B, T] with every token of row b equal to means[b] (so its mean is means[b]), padding -inf."""
    logp = torch.full((len(means), width), -INF, dtype=D)
    mask = torch.zeros(len(means), width, dtype=torch.bool)
    for b, (mean, length) in enumerate(zip(means, lengths)):
        logp[b, :length] = mean
        mask[b, :length] = True
    return logp, mask


# a learner's mini-batch: two own responses, then two of partners (own first)
LENGTHS = [2, 3, 1, 4]
NEW_MEANS = [-1.0, -1.0, -2.0, -2.0]
OLD_MEANS = torch.tensor([-1.0, -1.1, -1.9, -1.5], dtype=D)  # s = 1, e^.1, e^-.1, e^-.5
ADV = torch.tensor([1.0, 2.0, -1.0, 1.0], dtype=D)
IS_OWN = torch.tensor([True, True, False, False])
OMEGA = torch.tensor([1.0, 1.0, 0.5, 2.0], dtype=D)  # omega[source, learner] per response


def run(cfg, *, m=1, means=NEW_MEANS, **kw):
    logp, mask = rows(means, LENGTHS, 4)
    logp.requires_grad_(True)
    inputs = dict(
        logp_new=logp, loss_mask=mask, advantages=ADV, is_own=IS_OWN, old_logp_mean=OLD_MEANS, omega_factor=OMEGA
    )
    inputs.update(kw)
    loss, metrics = hacpo_loss(**{**preset_loss(cfg, m), **inputs})
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), metrics, torch.where(mask, grad, torch.zeros_like(grad))


def test_hacpo_mixed_batch_by_hand():
    loss, metrics, grad = run(get_preset("hacpo"), m=1)  # lower_1 = .8 + .025 = .825
    s2 = math.exp(-0.1)  # .904837, inside [.825, 1]
    terms = [
        1.0,  # own, s = 1: min(1·1, 1·1)
        1.0004 * 2.0,  # own, s = e^.1 = 1.105 > 1 + 4e-4 with A = 2 > 0: clipped -> 2.0008
        s2 * s2 * 0.5 * -1.0,  # cross inside: s · sg(s) · ω · A = e^-.2 · .5 · -1 = -.409365
        0.825 * 0.825 * 2.0 * 1.0,  # cross, s = e^-.5 = .6065 < .825: c = .825 -> 1.36125
    ]
    assert loss.item() == pytest.approx(-sum(terms) / 4)  # seq-mean-token-mean over 4 sequences
    # d loss / d logp[b, t] = -(1/4) · d term_b / d log s_b · (1 / |y_b|)
    expected = torch.zeros(4, 4, dtype=D)
    expected[0, :2] = -(1 / 4) * 1.0 / 2  # s · A = 1
    expected[2, :1] = -(1 / 4) * terms[2] / 1  # inside: sg(c)^2 · ω · A = term
    torch.testing.assert_close(grad, expected)  # rows 1 and 3 are clipped: no gradient

    assert metrics["clip/self_high_frac"].item() == 0.5 and metrics["clip/self_low_frac"].item() == 0.0
    assert metrics["clip/cross_low_frac"].item() == 0.5 and metrics["clip/cross_high_frac"].item() == 0.0
    assert metrics["clip/cross_frac"].item() == 0.5
    assert metrics["ratio/cross_min"].item() == pytest.approx(math.exp(-0.5))
    assert metrics["ratio/self_max"].item() == pytest.approx(math.exp(0.1))
    assert metrics["omega/cross_mean"].item() == pytest.approx(1.25)
    assert metrics["clip/cross_lower"].item() == pytest.approx(0.825)
    assert (metrics["count/self"].item(), metrics["count/cross"].item()) == (2, 2)
    assert not any(value.requires_grad for value in metrics.values())


def test_naive_uses_the_own_term_for_cross_responses():
    loss, metrics, grad = run(get_preset("naive"), m=1)
    terms = [
        1.0,
        2.0008,
        -0.9997,  # s = .9048 < 1 - 3e-4 with A = -1: min(-.9048, -.9997) = -.9997 (clipped)
        math.exp(-0.5),  # s = .6065 with A = 1: min(.6065, .9997) = .6065 (not clipped, no omega, no alpha)
    ]
    assert loss.item() == pytest.approx(-sum(terms) / 4)
    assert grad[3, 0].item() == pytest.approx(-(1 / 4) * math.exp(-0.5) / 4)  # d(s·A)/dlog s = s
    assert metrics["clip/cross_low_frac"].item() == 0.5  # row 2 (s low, A < 0)
    assert "clip/cross_lower" not in metrics and "omega/cross_mean" not in metrics


def test_kl_applies_to_own_responses_only():
    cfg = replace(get_preset("hacpo"), kl_coef=0.1, kl_estimator="k1")
    logp, _ = rows(NEW_MEANS, LENGTHS, 4)
    ref = logp - 0.2  # k1 = .2 on every own token
    ref[2:] = 5.0  # partners' rows: a huge KL that must be ignored
    base, _, _ = run(get_preset("hacpo"))
    loss, metrics, _ = run(cfg, ref_logp=ref)
    # seq-mean-token-mean over the 4 sequences of the mini-batch: (.2 + .2) / 4 = .1
    assert metrics["loss/kl"].item() == pytest.approx(0.1)
    assert loss.item() == pytest.approx(base.item() + 0.1 * 0.1)
    with pytest.raises(ValueError, match="needs ref_logp"):
        run(cfg)


def test_micro_batches_with_totals_sum_to_the_mini_batch():
    cfg = get_preset("hacpo")
    whole, _, grad = run(cfg)
    logp, mask = rows(NEW_MEANS, LENGTHS, 4)
    logp.requires_grad_(True)
    total = 0.0
    for part in (slice(0, 2), slice(2, 4)):
        loss, _ = hacpo_loss(
            logp_new=logp[part], loss_mask=mask[part], advantages=ADV[part], is_own=IS_OWN[part],
            old_logp_mean=OLD_MEANS[part], omega_factor=OMEGA[part], **preset_loss(cfg, 1), total_seqs=4, total_tokens=10,
        )
        total = total + loss
    (micro_grad,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(whole.item())
    torch.testing.assert_close(torch.where(mask, micro_grad, torch.zeros_like(micro_grad)), grad)


def test_grpo_token_level_by_hand():
    cfg = get_preset("grpo")  # token ratios, clip .2 / .28, token-mean
    old = torch.full((2, 2), -1.0, dtype=D)
    logp = (old + torch.tensor([[0.0, math.log(1.5)], [math.log(0.5), 0.0]], dtype=D)).requires_grad_(True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, metrics = hacpo_loss(
        logp_new=logp, loss_mask=mask, advantages=torch.tensor([1.0, -1.0], dtype=D),
        is_own=torch.tensor([True, True]), old_logp=old, **preset_loss(cfg),
    )
    # ratios [[1, 1.5], [.5, 1]]; A = +1 row 0, -1 row 1
    # terms: min(1, 1) = 1 | min(1.5, 1.28) = 1.28 | min(-.5, -.8) = -.8 | min(-1, -1) = -1
    assert loss.item() == pytest.approx(-(1 + 1.28 - 0.8 - 1) / 4)  # token-mean -> -.12
    (grad,) = torch.autograd.grad(loss, logp)
    # d/dlogp of -(r · A)/4 = -r · A / 4 where not clipped: [[-.25, 0], [0, .25]]
    torch.testing.assert_close(grad, torch.tensor([[-0.25, 0.0], [0.0, 0.25]], dtype=D))
    assert metrics["clip/self_high_frac"].item() == 0.25 and metrics["clip/self_low_frac"].item() == 0.25


def grpo_dual_clip_batch(cfg):
    """GRPO's loss and gradient on ratios [[1, 4], [4, .5]] with A = +1 (row 0), -1 (row 1)."""
    old = torch.full((2, 2), -1.0, dtype=D)
    logp = (old + torch.log(torch.tensor([[1.0, 4.0], [4.0, 0.5]], dtype=D))).requires_grad_(True)
    loss, metrics = hacpo_loss(
        logp_new=logp, loss_mask=torch.ones(2, 2, dtype=torch.bool), advantages=torch.tensor([1.0, -1.0], dtype=D),
        is_own=torch.tensor([True, True]), old_logp=old, **preset_loss(cfg),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), metrics, grad


def test_grpo_dual_clip_by_hand():
    # verl's default c = 3: the A < 0 token with r = 4 is held at 3·A = -3 (plain PPO: r·A = -4)
    # terms: 1 | min(4, 1.28) = 1.28 | max(min(-4, -1.28), -3) = -3 | min(-.5, -.8) = -.8
    loss, metrics, grad = grpo_dual_clip_batch(get_preset("grpo"))
    assert get_preset("grpo").dual_clip_c == 3.0
    assert loss.item() == pytest.approx(-(1 + 1.28 - 3 - 0.8) / 4)  # token-mean -> .38
    torch.testing.assert_close(grad, torch.tensor([[-0.25, 0.0], [0.0, 0.0]], dtype=D))
    assert metrics["clip/self_dual_frac"].item() == 0.25
    # switched off: the r = 4 token keeps its gradient -r·A/4 = 1
    loss, metrics, grad = grpo_dual_clip_batch(replace(get_preset("grpo"), dual_clip_c=0.0))
    assert loss.item() == pytest.approx(-(1 + 1.28 - 4 - 0.8) / 4)  # .63
    torch.testing.assert_close(grad, torch.tensor([[-0.25, 0.0], [1.0, 0.0]], dtype=D))
    assert "clip/self_dual_frac" not in metrics


def test_sequence_level_ignores_dual_clip_as_verl_gspo():
    # verl's GSPO loss has no dual-clip: the own row with s = e^3.1 > 3 and A = -2 keeps the PPO min
    kw = dict(means=[-1.0, 2.0, -2.0, -2.0], advantages=torch.tensor([-1.0, -2.0, -1.0, 1.0], dtype=D))
    on = run(get_preset("hacpo"), **kw)
    off = run(replace(get_preset("hacpo"), dual_clip_c=0.0), **kw)
    assert on[0].item() == pytest.approx(off[0].item()) and on[2][1, 0].item() != 0.0
    torch.testing.assert_close(on[0], off[0])
    torch.testing.assert_close(on[2], off[2])


@pytest.mark.slow
@pytest.mark.parametrize("value", [1.0, 0.5, -3.0])
def test_dual_clip_c_at_most_one_is_a_config_error(value, tmp_path):
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.errors import ConfigError
    from hacrl_lightning.preflight import validate

    with pytest.raises(ConfigError, match=r"algorithm.dual_clip_c.*0 or null \(off\), or a bound c > 1"):
        validate(compose_config([f"algorithm.dual_clip_c={value}", f"run_dir={tmp_path / 'run'}"])[0])
    for off in ("0", "null", "3"):
        validate(compose_config([f"algorithm.dual_clip_c={off}", f"run_dir={tmp_path / 'run'}"])[0])


def test_token_level_refuses_cross_responses():
    with pytest.raises(ValueError, match="own responses only"):
        run(get_preset("grpo"), old_logp=torch.zeros(4, 4, dtype=D))


def test_missing_inputs_are_named():
    with pytest.raises(ValueError, match="omega_factor"):
        run(get_preset("hacpo"), omega_factor=None)
    run(get_preset("hacpo_no_omega"), omega_factor=None)  # not needed without the factor
    with pytest.raises(ValueError, match="old_logp_mean"):
        run(get_preset("hacpo"), old_logp_mean=None)
    with pytest.raises(ValueError, match=r"advantages must have shape \[4\]"):
        run(get_preset("hacpo"), advantages=ADV[:3])


def test_own_only_batch_has_no_cross_metrics():
    logp, mask = rows([-1.0, -1.0], [2, 2], 2)
    _, metrics = hacpo_loss(
        logp_new=logp, loss_mask=mask, advantages=ADV[:2], is_own=IS_OWN[:2], old_logp_mean=OLD_MEANS[:2],
        **preset_loss(get_preset("hacpo")),
    )
    assert "ratio/self_mean" in metrics and not any(key.startswith(("ratio/cross", "clip/cross")) for key in metrics)


def test_sequence_level_accepts_per_token_old_log_probs_for_own_responses():
    logp, mask = rows([-1.0, -1.2], [2, 3], 3)
    old_tokens = torch.full((2, 3), -1.0, dtype=D)
    kw = dict(logp_new=logp, loss_mask=mask, advantages=ADV[:2], is_own=IS_OWN[:2], **preset_loss(get_preset("gspo")))
    from_tokens, _ = hacpo_loss(old_logp=old_tokens, **kw)
    from_means, _ = hacpo_loss(old_logp_mean=torch.tensor([-1.0, -1.0], dtype=D), **kw)
    assert from_tokens.item() == pytest.approx(from_means.item())


def test_minus_infinity_padding_never_reaches_the_gradient():
    # GRPO (token ratios) and k3 KL both exponentiate per token: padding must be masked out first
    cfg = replace(get_preset("grpo"), kl_coef=0.1, kl_estimator="k3")
    logp, mask = rows([-1.0, -2.0], [1, 3], 3)
    logp.requires_grad_(True)
    old, _ = rows([-1.1, -1.9], [1, 3], 3)
    loss, _ = hacpo_loss(
        logp_new=logp, loss_mask=mask, advantages=ADV[:2], is_own=IS_OWN[:2], old_logp=old, ref_logp=old - 0.1, **preset_loss(cfg),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and bool(torch.isfinite(grad).all())
    assert bool((grad[~mask] == 0).all())


def test_cross_lower_from_a_schedule_replaces_eq_14():
    # m = 1 gives lower .825; passing it explicitly changes nothing, passing .6 keeps row 3 (s = .6065)
    base = run(get_preset("hacpo"), m=1)
    same = run(get_preset("hacpo"), m=1, cross_lower=0.825)
    torch.testing.assert_close(base[0], same[0])
    loss, metrics, grad = run(get_preset("hacpo"), m=1, cross_lower=0.6)
    assert metrics["clip/cross_lower"].item() == pytest.approx(0.6)
    assert grad[3, 0].item() != 0.0 and metrics["clip/cross_low_frac"].item() == 0.0


def test_unknown_setting_or_mode_is_refused_naming_the_known_ones():
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['use_omgea'\]: known \[.*'use_omega'"):
        run(get_preset("hacpo"), use_omgea=False)
    for key, known in (("ratio_level", "['sequence', 'token']"), ("cross_loss", "['hacpo', 'self']"),
                       ("loss_agg_mode", "'token-mean'"), ("kl_estimator", "['k1', 'k2', 'k3']")):
        with pytest.raises(ValueError, match=rf"unknown {key} 'nope': known .*{re.escape(known)}"):
            run(get_preset("hacpo"), **{key: "nope"})


def test_every_algorithm_setting_reaching_the_loss_is_a_hacpo_loss_keyword():
    # AlgorithmConfig.loss_settings() gives exactly LossSettings' fields, each a keyword the loss takes
    settings = get_preset("hacpo").loss_settings()
    assert sorted(settings) == sorted(SETTINGS)
    assert LossSettings(**settings).ratio_level == "sequence"
    for name in PRESETS:
        LossSettings(**get_preset(name).loss_settings())  # every preset's modes are registered


def test_a_registered_cross_loss_is_one_function(monkeypatch):
    # a new mode is a registered function hacpo_loss finds by name: here the hacpo term without omega
    monkeypatch.setitem(CROSS_TERMS, "no_omega_test", lambda x, s, ratio, own: CROSS_TERMS["hacpo"](
        x, replace(s, use_omega=False), ratio, own))
    loss, metrics, grad = run(get_preset("hacpo"), cross_loss="no_omega_test")
    expected = run(get_preset("hacpo_no_omega"))
    assert torch.equal(loss, expected[0]) and torch.equal(grad, expected[2])
    assert metrics["omega/cross_mean"].item() == 1.0


def test_rows_present_by_hand():
    from hacrl_lightning.algorithms.objective import rows_present

    mask = torch.tensor([[True, False], [False, False], [True, True]])  # row 1 has no token
    is_own = torch.tensor([True, False, False])
    assert rows_present(mask, is_own) == {"self": True, "cross": True}
    rewards = torch.tensor([0.0, 1.0, 1.0])  # the empty partner row's reward counts for nothing
    assert rows_present(mask, is_own, rewards) == {"self": True, "cross": True, "self_correct": False,
                                                   "self_wrong": True, "cross_correct": True, "cross_wrong": False}
    assert rows_present(mask, torch.ones(3, dtype=torch.bool))["cross"] is False


LOSS_CASES = {"hacpo": ("hacpo", {}), "naive": ("naive", {}), "grpo dual-clip": ("grpo", {"dual_clip_c": 3.0}),
              "hacpo kl": ("hacpo", {"kl_coef": 0.1}), "gspo rollout-is": ("gspo", {"rollout_is_cap": 2.0})}


@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_with_the_host_s_presence_the_loss_reads_nothing_back(case):
    """On the meta device a tensor has a shape and no values: a read to the host (`bool`, `.item()`) or a mask
    index (whose size a GPU reports back first) fails there. With `present=` from the host's copies the whole loss,
    metrics included, runs on it; on the CPU it equals the loss that computes its presence itself."""
    from hacrl_lightning.algorithms.objective import rows_present

    name, changes = LOSS_CASES[case]
    cfg = replace(get_preset(name), **changes)
    is_own = torch.ones(4, dtype=torch.bool) if cfg.loss_settings()["ratio_level"] == "token" else IS_OWN
    logp, mask = rows(NEW_MEANS, LENGTHS, 4)
    old = torch.where(mask, logp - 0.05, torch.zeros_like(logp))
    inputs = dict(loss_mask=mask, advantages=ADV, is_own=is_own, old_logp_mean=OLD_MEANS, omega_factor=OMEGA,
                  old_logp=old, ref_logp=old - 0.1, engine_logp=old + 0.01,
                  rewards=torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D))
    present = rows_present(mask, is_own, inputs["rewards"])
    settings = preset_loss(cfg, 1)
    loss, metrics = hacpo_loss(**settings, logp_new=logp.clone().requires_grad_(True), **inputs)
    given, given_metrics = hacpo_loss(**settings, logp_new=logp.clone().requires_grad_(True), present=present, **inputs)
    assert torch.equal(loss, given) and given_metrics.keys() == metrics.keys()
    assert all(torch.equal(metrics[key], given_metrics[key]) for key in metrics)
    with pytest.raises(ValueError, match="rows_present"):  # given rewards, a presence computed without them
        hacpo_loss(**settings, logp_new=logp, present=rows_present(mask, is_own), **inputs)
    meta = {key: value.to("meta") if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}
    meta_loss, meta_metrics = hacpo_loss(**settings, logp_new=logp.to("meta").requires_grad_(True), present=present,
                                         **meta)
    meta_loss.backward()
    assert meta_loss.device.type == "meta" and meta_metrics.keys() == metrics.keys()
