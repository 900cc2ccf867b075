"""math_verify_reward on a hand-written table of equivalent and non-equivalent answers; unscorable gold."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from hacrl_lightning.config import DataConfig, TrainConfig
from hacrl_lightning.training import make_datamodule
from hacrl_lightning.rewards import exclude_unscorable, get_reward, gold_parses, math_verify_reward, scorable_golds


def boxed(answer: str) -> str:
    return f"Reasoning step by step ... so the answer is $\\boxed{{{answer}}}$."


# (gold, answer in the response's box, reward): what math-verify 0.9.0 really decides
TABLE = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", 1.0),
    ("0.5", "\\frac{1}{2}", 1.0),
    ("1/2", "\\frac12", 1.0),
    ("\\frac{1}{2}", "1/2", 1.0),
    ("\\dfrac{3}{4}", "0.75", 1.0),
    ("0.5", "0.50", 1.0),
    ("\\frac{1}{2}", "0.51", 0.0),
    ("\\frac{1}{3}", "0.333", 0.0),            # 3 decimals are not 1/3 ...
    ("\\frac13", "0.3333333", 1.0),            # ... 7 are (float_rounding=6)
    ("1,000", "1000", 1.0),
    # LaTeX vs plain
    ("\\sqrt{2}", "2^{1/2}", 1.0),
    ("\\sqrt{2}", "1.41421356", 1.0),
    ("x^2+1", "1+x^2", 1.0),
    ("x^2+1", "x^2-1", 0.0),
    ("2\\pi", "6.283185", 1.0),
    ("x=3", "3", 1.0),
    ("\\infty", "\\infty", 1.0),
    # units: stripped on both sides
    ("5", "5\\text{ cm}", 1.0),
    ("5", "5 cm", 1.0),
    ("5\\text{ cm}", "5", 1.0),
    ("5", "6 cm", 0.0),
    # percent: a bare gold `10\%` parses as the plain number 10
    ("10\\%", "10", 1.0),
    ("10\\%", "0.1", 0.0),
    ("10", "10\\%", 1.0),
    # hedged answers are not answers
    ("2", "1 \\text{ or } 2", 0.0),
    ("2", "1,2,3", 0.0),
    # sets and intervals
    ("\\{1,2\\}", "\\{2,1\\}", 1.0),
    ("\\{1,2\\}", "\\{1,3\\}", 0.0),
    ("(1,2]", "(1,2]", 1.0),
    ("(1,2]", "(1,2)", 0.0),
    ("[0,1)", "[0, 1)", 1.0),
    # negative numbers
    ("-3", "-3", 1.0),
    ("-3", "3", 0.0),
    ("3", "-3", 0.0),
    ("-\\frac{1}{2}", "-0.5", 1.0),
]


@pytest.mark.parametrize("gold,answer,reward", TABLE)
def test_math_verify_table(gold, answer, reward):
    assert gold_parses(gold)
    assert math_verify_reward(boxed(answer), gold) == reward
    # the gold may come boxed or in $...$ (verl's ground truths, dataset solutions): same verdict
    assert math_verify_reward(boxed(answer), f"\\boxed{{{gold}}}") == reward
    assert math_verify_reward(boxed(answer), f"${gold}$") == reward


@pytest.mark.parametrize("response,reward", [
    ("The answer is 5.", 0.0),                          # no box: not an answer
    ("$5$", 0.0),
    ("\\boxed{4} after checking, \\boxed{5}", 0.0),     # boxes close together are one answer, {4, 5}, as in math-verify
    ("\\boxed{4}" + " and so on" * 8 + "\\boxed{5}", 1.0),  # far apart: the last box counts
    ("\\boxed{5}" + " and so on" * 8 + "\\boxed{4}", 0.0),
    ("\\boxed{5} then \\boxed{6", 1.0),                 # an unclosed last box does not
    ("\\boxed{}", 0.0),
    ("\\boxed{five}", 0.0),
])
def test_the_last_complete_boxes_are_the_answer(response, reward):
    assert math_verify_reward(response, "5") == reward


@pytest.mark.parametrize("gold", ["", "   ", "}{", "\\frac{", "???", "abc def??"])
def test_unparseable_gold_is_excluded_never_correct(gold):
    assert not gold_parses(gold)
    for response in (boxed(gold), boxed("1"), "\\boxed{}"):
        assert math_verify_reward(response, gold) == 0.0


def test_registered_and_safe_off_the_main_thread():
    assert get_reward("math_verify") is math_verify_reward
    out = []
    thread = threading.Thread(target=lambda: out.append(math_verify_reward(boxed("0.25"), "\\frac{1}{4}")))
    thread.start()
    thread.join()
    assert out == [1.0]  # math-verify's signal-based timeouts would raise here; they are disabled


def test_unscorable_golds_are_excluded_at_load_and_reported(tmp_path, caplog):
    """A MATH file with two unparseable gold answers: train and held-out sets keep the other three."""
    rows = [{"problem": f"Q{i}?", "solution": f"so \\boxed{{{answer}}}", "answer": answer, "unique_id": f"t/{i}"}
            for i, answer in enumerate(["\\frac{1}{2}", "???", "7", "abc def??", "x^2"])]
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = DataConfig(name="math", train_files=[str(path)], eval_files=[str(path)], reward="math_verify")
    data = make_datamodule(TrainConfig(data=cfg, run_dir=str(tmp_path / "run")), agents={})
    with caplog.at_level(logging.WARNING):
        data.setup()
    assert [ex.gold for ex in data.eval_set] == ["\\frac{1}{2}", "7", "x^2"]
    assert len(data.train_set) == 3
    assert "excluded 2 of 5 problems" in caplog.text and "'???'" in caplog.text
    # a reward without a gold check keeps everything
    assert scorable_golds("exact_match", ["???", "7"]) == [True, True]
    assert [ex.gold for ex in exclude_unscorable(data.eval_set, "exact_match", what="x")] == ["\\frac{1}{2}", "7", "x^2"]


def test_a_gold_solution_with_several_boxes_is_one_answer(tmp_path):
    """A MATH solution that boxes each of its answers: the gold is all of them, as the response's boxes are read."""
    from hacrl_lightning.data.benchmarks import load_benchmark

    rows = [{"problem": "Solve $x^2 = 4$.", "solution": "So $x = \\boxed{2}$ or $x = \\boxed{-2}$."},
            {"problem": "Solve $x = 3$.", "solution": "So $x = \\boxed{3}$. Then, much later in the solution, the check "
             "of the working gives $\\boxed{3}$ again."}]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    both, single = [ex.gold for ex in load_benchmark("math", [path])]
    assert (both, single) == ("2,-2", "3")
    assert math_verify_reward("the roots are \\boxed{-2} and \\boxed{2}", both) == 1.0
    assert math_verify_reward("the roots are \\boxed{-2, 2}", both) == 1.0
    assert math_verify_reward("so \\boxed{-2}", both) == 0.0  # one of two roots is not the answer
    assert math_verify_reward("so \\boxed{3}", single) == 1.0
