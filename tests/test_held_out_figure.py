"""The held-out figure is named for what it measures (the fourth round of hostile inputs, 2026-11-28): `acc` is
the verifier's accuracy (the first reward term), never a weighted `data.rewards` sum, which is reported beside it
as `reward` with each term's mean (`reward/<term>`)."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_lightning.callbacks.evaluation import held_out_figures
from hacrl_lightning.cli import compose_config


def test_one_unweighted_term_is_its_own_accuracy_and_adds_no_figure():
    totals = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    scores, figures = held_out_figures(totals, [(1.0,), (0.0,)], [("exact_match", "exact_match", 1.0)])
    assert scores is totals and figures == {}
    assert held_out_figures(totals, [None, None], None) == (totals, {})  # a plain function: no terms


def test_a_weighted_sum_is_reported_beside_the_verifier_accuracy_not_as_it():
    """Two terms at weight 1 (the 1.125 that was printed as `acc`): acc 0.5 is the first term's, the sum's mean
    is `reward`; an item that failed whole counts 0 for every term; [P, k] shapes are kept."""
    terms = [("math_verify", "math_verify", 1.0), ("fmt", "my.py:fmt", 1.0)]
    parts = [(1.0, 1.0), (1.0, 0.5), (0.0, 1.0), None]
    totals = torch.tensor([sum(p) if p else 0.0 for p in parts], dtype=torch.float64).view(2, 2)
    scores, figures = held_out_figures(totals, parts, terms)
    assert scores.shape == (2, 2) and scores.flatten().tolist() == [1.0, 1.0, 0.0, 0.0]
    assert float(scores.mean()) == 0.5
    assert figures == {"reward": pytest.approx(4.5 / 4), "reward/math_verify": 0.5, "reward/fmt": pytest.approx(2.5 / 4)}
    one_weighted = held_out_figures(torch.tensor([[2.0]]), [(1.0,)], [("exact_match", "exact_match", 2.0)])
    assert one_weighted[0].tolist() == [[1.0]] and one_weighted[1] == {"reward": 2.0, "reward/exact_match": 1.0}
    empty = held_out_figures(torch.zeros(0, 1, dtype=torch.float64), [], terms)
    assert empty[0].shape == (0, 1) and empty[1]["reward"] == 0.0


@pytest.mark.slow
def test_the_datamodule_reports_the_verifiers_accuracy_and_the_weighted_reward_beside_it(zoo_cache):
    """A real evaluation of tiny_a with `data.rewards` = exact_match twice at weight 1: `acc` equals that of
    `data.reward=exact_match` on the same answers (at most 1), `reward` is twice it, each term its own mean; and
    avg@k / pass@k stay the verifier's (<= 1)."""
    from hacrl_lightning.training import load_agents, make_datamodule

    def scores(*overrides):
        cfg, _ = compose_config(["agents=[tiny_a]", "algorithm=grpo", "data.reward_workers=0", f"zoo_cache={zoo_cache}",
                                 *overrides])
        dm = make_datamodule(cfg, load_agents(cfg))
        dm.setup("fit")
        try:
            row = dm.evaluate(limit=8, samples=2)["tiny_a"]
            greedy = dm.greedy_answers["tiny_a"]  # what the group's figures read: the verifier's scores, too
            assert len(greedy["answers"]) == 8 and sum(greedy["correct"]) / 8 == pytest.approx(row["acc"])
            return row
        finally:
            dm.teardown("fit")

    single = scores()
    double = scores("data.rewards=[{reward: exact_match, weight: 1.0}, {reward: exact_match, weight: 1.0}]")
    assert set(single) == {"acc", "avg@2", "pass@2"}
    assert double["acc"] == single["acc"] and 0.0 <= double["acc"] <= 1.0
    assert double["reward"] == pytest.approx(2 * single["acc"])
    assert double["reward/exact_match_0"] == double["reward/exact_match_1"] == single["acc"]
    assert double["avg@2"] == single["avg@2"] <= 1.0 and double["pass@2"] == single["pass@2"] <= 1.0
    assert not any(math.isnan(v) for v in double.values())
