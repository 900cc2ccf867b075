"""Partners' cross ratios against the stepwise bounds (`hacrl_lightning/cross_ratios.py`): the shares below, inside and
above on planted ratios and bounds, counted by hand; that they are the rows `hacpo_loss` leaves without gradient; the
TensorBoard histograms; and `scripts/pair_ratios.py` on the tiny pair, in this process (the real-tokenizer pair:
tests/test_real_tokenizers.py, with its agents loaded once).
The run-level check (a training's diagnostics steps) rides on tests/test_diagnostics.py's run with the diagnostics on.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.config import AlgorithmConfig
from hacrl_lightning.cross_ratios import CrossRatioLog, positions, ratio_metrics
from hacrl_lightning.plan import MicroBatch

NAMES = ["a", "b", "c"]
# learner "a"'s view: (source, ratio s, reward, tokens); rows 0-1 its own, row 6 a partner's without tokens
VIEW = [(0, 1.00, 1.0, 2), (0, 1.00, 0.0, 2),
        (1, 0.50, 1.0, 2), (1, 0.85, 1.0, 3), (1, 0.95, 0.0, 2), (1, 1.20, 1.0, 2), (1, 0.88, 0.0, 1),
        (2, 1.01, 0.0, 2), (2, 0.75, 0.0, 2), (2, 0.60, 0.0, 0)]
# the passes of its update: (rows, weight, mini-batch lower bound, part)
PASSES = [([0, 1], 1.0, 0.80, None),           # own rows: not recorded
          ([2, 3, 7], 1.0, 0.80, None),        # b 0.5 < 0.8 below, b 0.85 inside, c 1.01 > 1 above
          ([2, 3], 1.0, 0.80, "cross"),        # a gradient-share pass: not recorded
          ([4, 5, 6, 8, 9], 1.0, 0.90, None),  # b 0.95 inside, 1.2 above, 0.88 < 0.9 below; c 0.75 < 0.9 below; no tokens
          ([4], 0.0, 0.90, None)]              # a zero-weight stand-in: not recorded
HAND = {"b": {"below": 2 / 5, "inside": 2 / 5, "above": 1 / 5,                       # rows 2, 6 / 3, 4 / 5
              "below_correct": 1 / 3, "inside_correct": 1 / 3, "above_correct": 1 / 3},  # rows 2 / 3 / 5
        "c": {"below": 1 / 2, "inside": 0.0, "above": 1 / 2}}                       # rows 8 / 7; none correct


def planted_view():
    width = 3
    mask = torch.tensor([[t < tokens for t in range(width)] for *_, tokens in VIEW])             # [B, T]
    return SimpleNamespace(is_own=torch.tensor([source == 0 for source, *_ in VIEW]), loss_mask=mask,
                           source_idx=torch.tensor([source for source, *_ in VIEW]),
                           row_idx=torch.arange(len(VIEW)) * 3 + 1)  # the step's flat order, not the view's


def pass_inputs(view, rows, lower):
    """`loss_inputs`' keywords for `rows`: every token's log-prob is log s, the source's mean 0."""
    log_s = torch.tensor([math.log(VIEW[r][1]) for r in rows])
    mask = view.loss_mask[rows]
    return dict(logp_new=torch.where(mask, log_s[:, None], torch.zeros(())), loss_mask=mask,
                old_logp_mean=torch.zeros(len(rows)), cross_lower=lower,
                rewards=torch.tensor([VIEW[r][2] for r in rows]), is_own=view.is_own[rows],
                advantages=torch.tensor([1.0, -1.0] * len(rows))[: len(rows)])


def test_shares_below_inside_and_above_of_planted_ratios_and_bounds_match_hand_counts(tmp_path):
    log, view = CrossRatioLog(NAMES, every=2), planted_view()
    for step in (0, 1):  # step 0 is not a diagnostics step (the every-th, counting from 1): nothing is kept
        for rows, weight, lower, part in PASSES:
            log.add("a", step, MicroBatch(torch.tensor(rows), weight), view, pass_inputs(view, rows, lower), part)
    assert log.end_step(None, 0) == {}  # no collective, no histogram
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="", default_hp_metric=False)
    module = SimpleNamespace(trainer=SimpleNamespace(is_global_zero=True), loggers=[logger], steps_done=2)
    metrics = log.end_step(module, 1)
    expected = {f"a/diag/cross_ratio/{source}/{key}": share for source, keys in HAND.items() for key, share in keys.items()}
    assert metrics == pytest.approx(expected, abs=1e-12) and metrics.keys() == expected.keys()
    records = log.last["a"]
    assert records.row.tolist() == [7, 10, 13, 16, 19, 22, 25]  # rows 2-8, sorted by their place in the step
    assert records.lower.tolist() == pytest.approx([0.8, 0.8, 0.9, 0.9, 0.9, 0.8, 0.9])
    assert positions(records.log_ratio, records.lower).tolist() == [0, 1, 1, 2, 0, 2, 0]
    assert not log._parts  # the step's passes are gone: the next step starts empty
    logger.experiment.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0}).Reload()
    assert set(events.Tags()["histograms"]) == {"ratios/a/from_b", "ratios/a/from_b/correct", "ratios/a/from_b/log_lower",
                                                "ratios/a/from_c", "ratios/a/from_c/log_lower"}
    (from_b,) = events.Histograms("ratios/a/from_b")
    assert from_b.step == 2 and from_b.histogram_value.num == 5
    assert from_b.histogram_value.min == pytest.approx(math.log(0.5)) and from_b.histogram_value.max == pytest.approx(
        math.log(1.2))
    (bounds,) = events.Histograms("ratios/a/from_c/log_lower")
    assert (bounds.histogram_value.min, bounds.histogram_value.max) == pytest.approx((math.log(0.8), math.log(0.9)))


def test_the_rows_outside_their_bounds_are_those_hacpo_loss_leaves_without_gradient():
    """One mini-batch through `hacpo_loss` and through the log: the correct and the wrong partner rows outside
    [lower, 1] are the loss's `diag/cross_nograd_frac_{correct,wrong}`, row for row."""
    view, rows, lower = planted_view(), [0, 2, 3, 4, 5, 6, 7, 8], 0.9
    inputs = pass_inputs(view, rows, lower)
    _, loss_metrics = hacpo_loss(**inputs, **AlgorithmConfig().loss_settings(), omega_factor=torch.ones(len(rows)))
    log = CrossRatioLog(NAMES, every=1)
    log.add("a", 0, MicroBatch(torch.tensor(rows), 1.0), view, inputs)
    records = log._gather(log._host())["a"]
    outside = positions(records.log_ratio, records.lower) != 1
    for answer, keep in (("correct", records.correct), ("wrong", ~records.correct)):
        assert float(outside[keep].float().mean()) == pytest.approx(float(loss_metrics[f"diag/cross_nograd_frac_{answer}"]))
    assert ratio_metrics(NAMES, {"a": records})["a/diag/cross_ratio/b/below"] == pytest.approx(3 / 5)  # .5 .85 .88


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_pair_ratios_scores_a_pair_without_training(tmp_path, zoo_cache, script_main, capsys):
    """scripts/pair_ratios.py on the tiny pair: each agent answers 2 prompts twice, the other scores them; every
    response is one row of its learner's table, the quantiles are ordered, the shares of each row set sum to 1,
    printed as written (the real-tokenizer pair: tests/test_real_tokenizers.py)."""
    pair, out = ("tiny_a", "tiny_b"), tmp_path / "ratios.json"
    status = script_main("pair_ratios")([f"agents=[{','.join(pair)}]", "data.prompts_per_step=2", "rollout.group_size=2",
                                         "trainer.mini_batch_prompts=2", f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}", "--json", str(out)])
    printed, errors = capsys.readouterr()
    assert status == 0, errors
    report = json.loads(out.read_text())
    assert report["agents"] == list(pair) and (report["prompts"], report["samples_per_prompt"]) == (2, 2)
    assert report["bounds"]["lower"] == pytest.approx(1 - AlgorithmConfig().delta)
    for learner, source in (pair, pair[::-1]):
        row = report["pairs"][learner][source]
        assert row["rows"] == 2 * 2 and 0 <= row["correct"] <= 4
        quantiles = [row["log_ratio"][key] for key in ("min", "q05", "q25", "q50", "q75", "q95", "max")]
        assert quantiles == sorted(quantiles) and all(math.isfinite(q) for q in quantiles)
        assert sum(row["shares"].values()) == pytest.approx(1.0)
        assert sum(row["shares_correct"].values()) == pytest.approx(1.0 if row["correct"] else 0.0)
        line = next(line for line in printed.splitlines() if line.split()[:2] == [learner, source])
        assert line.split()[2] == "4" and float(line.split()[5]) == pytest.approx(row["log_ratio"]["q50"], abs=1e-3)
    assert f"pair ratios: {out}" in printed
    assert script_main("pair_ratios")(["agents=[tiny_a]", "algorithm=gspo", f"zoo_cache={zoo_cache}"]) == 2
    assert "agents: got ['tiny_a']; allowed: two agents or more" in capsys.readouterr().err
