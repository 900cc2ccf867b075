"""What the agents know together (collective.py, algorithms.metrics.collective_accuracy): union and majority-vote
accuracy, their gains over the best single agent and the pairwise complementarity, by hand on a planted table of
answers; the same figures in the training's held-out evaluation callback, evaluate.py's results and compare.py's
means over seeds. Real runs: tests/test_training.py (TensorBoard, summary.json), tests/test_evaluation.py and
tests/test_compare.py (their module's runs) assert the figures there."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from types import SimpleNamespace

import pytest
import torch

from hacrl_lightning import experiments as ex
from hacrl_lightning.algorithms.metrics import collective_accuracy
from hacrl_lightning.collective import (answer_key, collective_figures, collective_scalars, figures_line,
                                        markdown_lines)

# Three agents, seven problems: each agent's response and whether the reward scored it right.
#   p0: a 4 R, b 4 R, c 5 W        -> majority 4 (2 votes): right
#   p1: a 7 W, b " 8 " R, c 8 R    -> b and c written differently, the same boxed answer: majority 8, right
#   p2: a 1 R, b 2 W, c 3 W        -> three answers, one vote each: tied, no majority (wrong); union right
#   p3: a 9 W, b 6 R, c 6 R        -> majority 6: right
#   p4: a -, b 0 W, c -            -> the only answer given is the plurality: 0, wrong; union wrong
#   p5: a 3 R, b -, c -            -> 3, right
#   p6: a 5 R, b 6 W, c 5 R        -> 5: right
RESPONSES = {
    "a": ["so \\boxed{4}", "\\boxed{7}", "\\boxed{1}", "\\boxed{9}", "I do not know", "\\boxed{3}", "\\boxed{5}"],
    "b": ["\\boxed{4}.", "8 apples, so \\boxed{ 8 }", "\\boxed{2}", "\\boxed {6}", "\\boxed{0}", "\\boxed{", "\\boxed{6}"],
    "c": ["\\boxed{5}", "The answer is $\\boxed{8}$.", "\\boxed{3}", "\\boxed{6}", "", "no box", "\\boxed{5}"],
}
CORRECT = {"a": [1, 0, 1, 0, 0, 1, 1], "b": [1, 1, 0, 1, 0, 0, 0], "c": [0, 1, 0, 1, 0, 0, 1]}
# a right on {0,2,5,6} (4/7), b on {0,1,3} (3/7), c on {1,3,6} (3/7); some agent right on all but p4
RIGHT_WRONG = {"a": {"b": 3 / 7, "c": 3 / 7}, "b": {"a": 2 / 7, "c": 1 / 7}, "c": {"a": 2 / 7, "b": 1 / 7}}


def planted() -> dict:
    return collective_figures({name: [answer_key(r) for r in rows] for name, rows in RESPONSES.items()}, CORRECT)


def test_answers_are_compared_as_the_reward_reads_them():
    assert answer_key("8 apples, so \\boxed{ 8 }") == answer_key("The answer is $\\boxed{8}$.") == "8"
    assert answer_key("\\boxed {6}") == "6" and answer_key("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert answer_key("\\boxed{") is None and answer_key("no box") is None


def test_union_majority_ties_gains_and_complementarity_by_hand():
    figures = planted()
    assert figures["agents"] == ["a", "b", "c"] and figures["problems"] == 7
    assert figures["best_single"] == "a" and figures["best_single_acc"] == pytest.approx(4 / 7)
    assert figures["union_acc"] == pytest.approx(6 / 7)           # all but p4
    assert figures["majority_acc"] == pytest.approx(5 / 7)        # p0 p1 p3 p5 p6; p2 tied, p4 the wrong 0
    assert figures["majority_tied"] == pytest.approx(1 / 7)       # p2
    assert figures["union_gain"] == pytest.approx(2 / 7) and figures["majority_gain"] == pytest.approx(1 / 7)
    assert figures["right_wrong"] == {i: pytest.approx(row) for i, row in RIGHT_WRONG.items()}
    # the identity of any pair: right_wrong[i][j] - right_wrong[j][i] = acc_i - acc_j
    assert RIGHT_WRONG["a"]["b"] - RIGHT_WRONG["b"]["a"] == pytest.approx(4 / 7 - 3 / 7)


def test_answers_written_differently_match_only_by_extraction():
    """p1's b and c agree only once their boxed answers are read out (whitespace, `$`, text around): compared as
    whole responses they would split the vote three ways (a tie: no majority)."""
    whole = collective_figures(RESPONSES, CORRECT)  # the raw texts as keys
    assert whole["majority_acc"] == pytest.approx(1 / 7) and planted()["majority_acc"] == pytest.approx(5 / 7)


def test_a_tie_of_two_agents_is_no_majority_and_one_answer_against_none_is():
    figures = collective_figures({"x": ["1", "2", None, None], "y": ["1", "3", "4", None]},
                                 {"x": [1.0, 1.0, 0.0, 0.0], "y": [1.0, 0.0, 1.0, 0.0]})
    # p0 agree right; p1 differ: tied (x was right, but a tie counts wrong); p2 only y answers, right; p3 none
    assert figures["majority_acc"] == pytest.approx(2 / 4) and figures["majority_tied"] == pytest.approx(1 / 4)
    assert figures["union_acc"] == pytest.approx(3 / 4) and figures["best_single"] == "x"
    assert figures["right_wrong"] == {"x": {"y": 0.25}, "y": {"x": 0.25}}


def test_the_tensor_function_and_its_edges():
    correct = torch.tensor([[True, False], [True, True]])
    out = collective_accuracy(correct, torch.tensor([[0, 0], [0, 1]]))
    assert out["union"] == 1.0 and out["majority"] == 0.5 and out["tied"] == 0.5 and out["best"] == 1.0
    assert out["right_wrong"].tolist() == [[0.0, 0.0], [0.5, 0.0]]
    assert collective_figures({"x": ["1"]}, {"x": [1.0]}) is None       # one agent: no group
    assert collective_figures({"x": [], "y": []}, {"x": [], "y": []}) is None  # no problem
    with pytest.raises(ValueError, match="same 2 problems"):
        collective_figures({"x": ["1", "2"], "y": ["1"]}, {"x": [1, 1], "y": [1]})


def test_scalars_line_and_markdown_carry_the_figures():
    figures = planted()
    scalars = collective_scalars(figures)
    assert scalars["collective/eval/union_acc"] == pytest.approx(6 / 7)
    assert scalars["collective/eval/majority_tied"] == pytest.approx(1 / 7)
    assert scalars["collective/eval/right_wrong/b/c"] == pytest.approx(1 / 7) and len(scalars) == 6 + 6
    assert collective_scalars(None) == {} and figures_line(None) == ""
    assert figures_line(figures) == "together: union 0.857 (+0.286) | majority 0.714 (+0.143, 14% tied)"
    text = "\n".join(markdown_lines({"synthetic": figures}, titles={"synthetic": "Synthetic"}))
    assert "| Synthetic | a 0.571 | 0.857 | +0.286 | 0.714 | +0.143 | 0.143 |" in text
    assert "| Synthetic: right \\ wrong | a | b | c |" in text and "| b | 0.286 | – | 0.143 |" in text


def test_the_held_out_callback_logs_and_keeps_the_figures_of_the_greedy_answers(capsys):
    """HeldOutEvalCallback with an evaluator holding greedy answers: the console line, the TensorBoard scalars
    (`collective/eval/*`, at the evaluation's step) and the history entry (summary.json's `eval_history`)."""
    from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback

    class Evaluator:
        greedy_answers = {name: {"answers": [answer_key(r) for r in rows], "correct": [float(c) for c in CORRECT[name]]}
                          for name, rows in RESPONSES.items()}

        def evaluate(self, *, samples=1, limit=None, step=0):
            return {name: {"acc": sum(c) / 7} for name, c in CORRECT.items()}

    reported = []
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext),
                              is_global_zero=True, should_stop=False)
    module = SimpleNamespace(steps_done=3, counters={name: {"rollouts_generated": 8} for name in CORRECT},
                             report=lambda metrics, step: reported.append((step, metrics)))
    callback = HeldOutEvalCallback(Evaluator(), every=0)
    callback.on_train_end(trainer, module)
    (step, metrics), = reported
    assert step == 3 and metrics["collective/eval/majority_acc"] == pytest.approx(5 / 7)
    assert metrics["a/eval/acc"] == pytest.approx(4 / 7) and metrics["collective/eval/right_wrong/a/b"] == pytest.approx(3 / 7)
    assert callback.history[-1]["collective"] == planted()
    assert "| together: union 0.857 (+0.286) | majority 0.714" in capsys.readouterr().out


def test_evaluate_results_md_has_the_agents_together(tmp_path):
    from hacrl_lightning.evaluation import write_results

    results = {"protocol": "paper", "benchmarks": {"synthetic": {"title": "Synthetic", "samples": 1,
                                                                 "headline": "avg@1", "problems": 7}},
               "agents": {name: {"source": name, "average": sum(c) / 7,
                                 "scores": {"synthetic": {"headline": sum(c) / 7}}} for name, c in CORRECT.items()},
               "collective": {"synthetic": planted()}}
    json_path, md_path = write_results(results, tmp_path)
    assert json.loads(json_path.read_text())["collective"]["synthetic"]["union_acc"] == pytest.approx(6 / 7)
    text = md_path.read_text()
    assert "## The agents together" in text and "a tie for the most votes is no majority" in text
    assert "| Synthetic | a 0.571 | 0.857 | +0.286 | 0.714 | +0.143 | 0.143 |" in text


def _summary(union, majority, best, tied, right_wrong):
    history = [{"collective": {"union_acc": 0.5, "majority_acc": 0.25}},
               {"collective": {"union_acc": union, "union_gain": union - best, "majority_acc": majority,
                               "majority_gain": majority - best, "majority_tied": tied, "right_wrong": right_wrong}}]
    agent = {"initial": {"acc": 0.25}, "final": {"acc": best}, "rollouts_generated": 8, "responses_trained": 8,
             "optimizer_updates": 1}
    return {"agents": {"x": agent, "y": {**agent, "final": {"acc": best - 0.25}}}, "wall_s": 1.0, "steps": 2,
            "eval_history": history}


def test_compare_means_the_group_figures_over_seeds_with_intervals(tmp_path):
    """Two seeds of one arm: union 0.5 and 0.7 (mean 0.6, the t interval of two values), majority 0.5 both, tied
    0.25 and 0.5; each row carries its run's figures, the csv its agent's complementarity as JSON."""
    rows = []
    for seed, (union, tied, xy) in enumerate([(0.5, 0.25, 0.25), (0.7, 0.5, 0.5)]):
        spec = ex.RunSpec(ex.Arm("hacpo", ()), seed, tmp_path / f"seed{seed}")
        summary = _summary(union, 0.5, 0.5, tied, {"x": {"y": xy}, "y": {"x": 0.0}})
        rows += [{**row, "arm_runs": 2, "arm_runs_planned": 2} for row in ex.result_rows(spec, summary)]
    assert rows[0]["initial_union_acc"] == 0.5 and rows[0]["final_union_gain"] == 0.0
    assert rows[1]["final_union_acc"] == 0.5 and json.loads(rows[1]["final_right_partner_wrong"]) == {"x": 0.0}
    with ex.write_csv(rows, tmp_path / "results.csv").open() as handle:
        written = list(csv.DictReader(handle))
    assert written[2]["final_union_acc"] == "0.7" and json.loads(written[2]["final_right_partner_wrong"]) == {"y": 0.5}
    (arm,) = ex.summarize_collective(rows)
    half = 12.7062 * math.sqrt(0.02) / math.sqrt(2)  # t_{0.975, 1} x sd / sqrt(2), sd of (0.5, 0.7) = sqrt(0.02)
    assert arm["final_union_acc"] == pytest.approx(0.6) and arm["final_union_acc_ci"] == pytest.approx(half, rel=1e-4)
    assert arm["final_union_gain"] == pytest.approx(0.1) and arm["final_majority_acc_ci"] == 0.0
    assert arm["final_best_acc"] == pytest.approx(0.5) and arm["final_majority_tied"] == pytest.approx(0.375)
    assert arm["right_wrong"][0] == {"agent": "x", "partner": "y", "mean": pytest.approx(0.375),
                                     "ci": pytest.approx(12.7062 * math.sqrt(0.03125) / math.sqrt(2), rel=1e-4)}
    report = ex.markdown_report(ex.summarize(rows), [], title="t", collective=[arm])
    assert "## The agents together (held-out, last evaluation)" in report
    assert f"| hacpo | 2 of 2 | 0.500 ± 0.000 | 0.600 ± {half:.3f} | 0.100 ± {half:.3f} | 0.500 ± 0.000 |" in report
    assert "| hacpo | x | y | 0.375 ± " in report
    # an arm short of its planned runs shows no mean unless allowed; a run of one agent (or older) has none
    short = [{**row, "arm_runs_planned": 3} for row in rows]
    assert math.isnan(ex.summarize_collective(short)[0]["final_union_acc"])
    assert ex.summarize_collective(short, allow_partial=True)[0]["final_union_acc"] == pytest.approx(0.6)
    old = ex.result_rows(ex.RunSpec(ex.Arm("grpo", ()), 0, tmp_path / "old"), {**_summary(0.5, 0.5, 0.5, 0.0, {}),
                                                                              "eval_history": [{"scores": {}}]})
    assert math.isnan(old[0]["final_union_acc"]) and ex.summarize_collective(old) == []
