"""The studies' diagnostics: which responses the clip leaves without gradient (by correctness), how much of
an update comes from partners' responses, and what a run's summary says about them.

The loss-level tests use one hand-built batch whose ratios, advantages and rewards decide, by the rules
of docs/spec.md §6, which terms are constant; they check the metrics against those hand counts and against
autograd (those rows get exactly zero gradient, the others do not). The run-level tests use real tiny zoo
agents: the gradient-share diagnostic must not change the update (bit for bit), lies in [0, 1], and is 0
for a learner without partners' responses.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.config import AlgorithmConfig
from hacrl_lightning.loss_stats import LossStats
from hacrl_lightning.training import train
from test_training import config

# row: (own?, ratio s, advantage A, reward)            clip_low = 0.1, clip_high = 0.05, cross_lower = 0.85
ROWS = [
    (True, 1.20, +1.0, 1.0),   # 0  own, s > 1.05 and A > 0: the min picks the clipped side -> no gradient
    (True, 1.20, -1.0, 0.0),   # 1  own, s > 1.05 but A < 0: unclipped side -> gradient
    (True, 0.80, -1.0, 0.0),   # 2  own, s < 0.9 and A < 0 -> no gradient
    (True, 1.00, +1.0, 1.0),   # 3  own, inside -> gradient
    (False, 1.10, +1.0, 1.0),  # 4  cross, s > 1 (HACPO) / s > 1.05 with A > 0 (naive) -> no gradient in both
    (False, 0.95, +1.0, 1.0),  # 5  cross, inside [0.85, 1] -> gradient
    (False, 0.70, -1.0, 0.0),  # 6  cross, s < 0.85 / s < 0.9 with A < 0 -> no gradient in both
    (False, 0.92, -1.0, 0.0),  # 7  cross, inside -> gradient
    (False, 1.30, -0.5, 0.0),  # 8  cross, s > 1: HACPO's hard clamp -> none whatever A; naive (A < 0) -> gradient
    (False, 0.50, -0.2, 1.0),  # 9  cross, correct below its baseline (A < 0), s < 0.85 / < 0.9 -> no gradient
    (False, 0.99, +0.3, 0.5),  # 10 cross, partial credit counts as correct (reward > 0) -> gradient
]
CLIP = {**AlgorithmConfig().loss_settings(), "clip_low": 0.1, "clip_high": 0.05}
"""The paper's HACPO settings with a wider own clip; a case changes what it is about."""
LOWER = 0.85
OWN_NOGRAD = {0, 2}
CROSS_NOGRAD = {"hacpo": {4, 6, 8, 9}, "naive": {4, 6, 9}, "no_clip": set()}
SETTINGS = {"hacpo": dict(cross_loss="hacpo"), "naive": dict(cross_loss="self"),
            "no_clip": dict(cross_loss="hacpo", cross_clip=False)}


def batch(rows=ROWS):
    """The rows as hacpo_loss inputs: two tokens per response, each with log-prob log s, old mean 0."""
    log_s = torch.tensor([math.log(s) for _, s, _, _ in rows], dtype=torch.float64)
    logp = log_s[:, None].repeat(1, 2).requires_grad_(True)                               # [B, 2]
    return dict(logp_new=logp, loss_mask=torch.ones(len(rows), 2, dtype=torch.bool),
                advantages=torch.tensor([a for _, _, a, _ in rows], dtype=torch.float64),
                is_own=torch.tensor([own for own, _, _, _ in rows]),
                rewards=torch.tensor([r for _, _, _, r in rows]),
                old_logp_mean=torch.zeros(len(rows), dtype=torch.float64),
                omega_factor=torch.full((len(rows),), 1.5, dtype=torch.float64))


def hand_fractions(nograd: set[int], own: bool, rows=ROWS) -> dict[str, float]:
    out = {}
    for answer, correct in (("correct", True), ("wrong", False)):
        picked = [b for b, (is_own, _, _, r) in enumerate(rows) if is_own == own and (r > 0) == correct]
        out[answer] = sum(b in nograd for b in picked) / len(picked)
    return out


@pytest.mark.parametrize("variant", sorted(SETTINGS))
def test_nograd_fractions_match_hand_counts_and_autograd(variant):
    inputs = batch()
    loss, metrics = hacpo_loss(**inputs, **{**CLIP, **SETTINGS[variant], "alpha": 1.0}, cross_lower=LOWER)
    # hand counts: own correct {0, 3}, own wrong {1, 2}; cross correct {4, 5, 9, 10}, cross wrong {6, 7, 8}
    assert (metrics["count/self_correct"], metrics["count/self_wrong"]) == (2, 2)
    assert (metrics["count/cross_correct"], metrics["count/cross_wrong"]) == (4, 3)
    for part, own, nograd in (("self", True, OWN_NOGRAD), ("cross", False, CROSS_NOGRAD[variant])):
        expected = hand_fractions(nograd, own)
        for answer in ("correct", "wrong"):
            assert float(metrics[f"diag/{part}_nograd_frac_{answer}"]) == pytest.approx(expected[answer])
    # hacpo: cross correct 2/4, wrong 2/3; naive: 2/4, 1/3; no clip: 0, 0
    loss.backward()
    grad = inputs["logp_new"].grad.abs().sum(dim=1)                                         # [B]
    nograd = OWN_NOGRAD | CROSS_NOGRAD[variant]
    for b in range(len(ROWS)):
        assert (grad[b] == 0) == (b in nograd), f"row {b}: gradient {float(grad[b])}"


def test_no_diagnostics_without_rewards_and_none_for_an_empty_answer():
    _, metrics = hacpo_loss(**{**batch(), "rewards": None}, **CLIP, cross_lower=LOWER)
    assert not any(key.startswith("diag/") or key.endswith(("_correct", "_wrong")) for key in metrics)
    rows = [row for row in ROWS if row[3] > 0]  # no wrong answers: the count is 0 and its fraction left out
    _, metrics = hacpo_loss(**batch(rows), **CLIP, cross_lower=LOWER)
    assert metrics["count/cross_wrong"] == 0 and "diag/cross_nograd_frac_wrong" not in metrics
    assert float(metrics["diag/cross_nograd_frac_correct"]) == pytest.approx(0.5)


def test_two_micro_batches_of_different_sizes_reduce_to_the_count_weighted_fraction():
    """Rows 0-4 and 5-10 as two micro-batches: cross correct 1/1 and 1/3 no-gradient; the step's figure
    is (1 + 1) / 4 = 0.5, not the mean of the two fractions (2/3)."""
    stats = LossStats(["a"])
    whole = batch()
    totals = dict(total_seqs=torch.tensor(float(len(ROWS))), total_tokens=torch.tensor(2.0 * len(ROWS)))
    parts = []
    for rows in (slice(0, 5), slice(5, None)):
        micro = {key: value[rows].detach() for key, value in whole.items()}
        _, metrics = hacpo_loss(**micro, **CLIP, cross_lower=LOWER, **totals)
        parts.append(float(metrics["diag/cross_nograd_frac_correct"]))
        stats.update("a", metrics)
    assert parts == pytest.approx([1.0, 1 / 3])
    out = stats.compute({"a": 1})
    assert out["a/diag/cross_nograd_frac_correct"] == pytest.approx(2 / 4)
    assert out["a/diag/cross_nograd_frac_wrong"] == pytest.approx(2 / 3)
    assert out["a/diag/self_nograd_frac_correct"] == pytest.approx(1 / 2)
    assert out["a/count/cross_correct"] == 4 and out["a/count/cross_wrong"] == 3


class KeepModule:
    """A Lightning callback that keeps the fitted module (to read its final weights)."""

    def __new__(cls, captured: dict):
        from lightning.pytorch import Callback

        class Keep(Callback):
            def on_train_end(self, trainer, pl_module):
                captured["module"] = pl_module

        return Keep()


def run(tmp_path, zoo_cache, *overrides):
    captured: dict = {}
    summary = train(config(tmp_path, zoo_cache, *overrides), extra_callbacks=[KeepModule(captured)])
    return summary, captured["module"]


@pytest.mark.slow
def test_grad_share_leaves_the_update_unchanged_and_lies_in_0_1(tmp_path, zoo_cache):
    three = ("agents=[tiny_a,tiny_b,tiny_c]", "algorithm=hacpo")
    _, plain = run(tmp_path / "off", zoo_cache, *three, "trainer.diagnostics_every=0")
    summary, measured = run(tmp_path / "on", zoo_cache, *three, "trainer.diagnostics_every=1")
    for name in plain.names:
        for before, after in zip(plain.agents[name].parameters(), measured.agents[name].parameters()):
            assert torch.equal(before, after), f"{name}: the diagnostic changed the update"
        assert plain.counters[name] == measured.counters[name]
        history = measured.diagnostics[f"{name}/diag/cross_grad_share"]
        assert [step for step, _ in history] == [0, 1]
        assert all(0.0 <= share <= 1.0 for _, share in history)  # 0 where every partner response is clipped
        assert all(-1.0 <= cos <= 1.0 for _, cos in measured.diagnostics[f"{name}/diag/grad_cos_self_cross"])
        assert not any("/diag/grad" in key or "cross_grad_share" in key for key in plain.diagnostics)
        diag = summary["agents"][name]["diagnostics"]
        assert diag["steps_measured"]["cross_grad_share"] == 2
        assert diag["cross_grad_share"] == pytest.approx(sum(v for _, v in history) / 2)
        assert diag["steps_measured"]["cross_nograd_frac_wrong"] == 2 and 0.0 <= diag["cross_nograd_frac_wrong"] <= 1.0
        partners = [p for p in plain.names if p != name]
        assert sorted(diag["omega"]) == partners
        for partner in partners:
            omega = [v for _, v in measured.diagnostics[f"{name}/omega/{partner}"]]
            assert diag["omega"][partner] == pytest.approx(
                {"first": omega[0], "last": omega[-1], "mean": sum(omega) / len(omega)})
        assert_cross_ratios(tmp_path / "on" / "run", name, partners, summary, measured)
    assert not any("/cross_ratio/" in key for key in plain.diagnostics)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert not EventAccumulator(str(tmp_path / "off" / "run" / "tensorboard")).Reload().Tags()["histograms"]


def assert_cross_ratios(run_dir, name, partners, summary, module) -> None:
    """The partners' cross ratios of a run measured at every step (`cross_ratios.py`): histograms of log s and of
    the bounds per partner at both steps, the shares in the summary (means over the 2 steps), and the last step's
    records are the ratios the clamp read: its correct (wrong) rows outside their bounds are the step's
    `diag/cross_nograd_frac_correct` (`_wrong`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hacrl_lightning.cross_ratios import positions

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"histograms": 0}).Reload()
    records = module.cross_ratios.last[name]
    for j, partner in enumerate(module.names):
        if partner == name:
            assert not bool((records.source == j).any())
            continue
        tag = f"ratios/{name}/from_{partner}"
        assert [h.step for h in events.Histograms(tag)] == [1, 2]
        assert [h.step for h in events.Histograms(f"{tag}/log_lower")] == [1, 2]
        assert events.Histograms(tag)[-1].histogram_value.num == int((records.source == j).sum()) == 4 * 2  # P·G
        diag = summary["agents"][name]["diagnostics"]
        shares = [diag[f"cross_ratio/{partner}/{position}"] for position in ("below", "inside", "above")]
        assert sum(shares) == pytest.approx(1.0) and diag["steps_measured"][f"cross_ratio/{partner}/inside"] == 2
    outside = positions(records.log_ratio, records.lower) != 1
    for answer, rows in (("correct", records.correct), ("wrong", ~records.correct)):
        last = dict(module.diagnostics.get(f"{name}/diag/cross_nograd_frac_{answer}", [])).get(1)
        if bool(rows.any()):
            assert float(outside[rows].float().mean()) == pytest.approx(last, abs=1e-6), answer


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_grad_share_is_not_measured_without_partners_responses(tmp_path, zoo_cache):
    """gspo_x2's learners train on their own responses only: the diagnostic pass (about 5 % of a step) would
    measure a share of 0 every time, so it does not run."""
    summary, module = run(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "algorithm=gspo_x2",
                          "trainer.diagnostics_every=1")
    assert "time/diagnostics" not in module.last_metrics
    for name in module.names:
        assert not any("/diag/grad" in key or "cross_grad_share" in key for key in module.diagnostics)
        diag = summary["agents"][name]["diagnostics"]
        assert diag["cross_grad_share"] is None and diag["cross_nograd_frac_correct"] is None
        assert diag["omega"] == {} and not any(key.startswith("cross_ratio/") for key in diag)
    assert module.cross_ratios.last == {}  # no partner rows: no ratios recorded, no histograms
