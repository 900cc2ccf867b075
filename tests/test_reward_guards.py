"""math_verify_reward bounds itself: hostile answers are refused before sympy sees them, real ones still verify.

The timeout marks are hang guards (measured figures are milliseconds; on main several of these ran
for minutes or never finished), not timings; that an answer is refused before parsing is asserted
through `guard_problem`.
"""

from __future__ import annotations

import pytest

from hacrl_lightning.rewards import math_verify_reward
from hacrl_lightning.rewards.math_verify import (
    MAX_ANSWER_CHARS, MAX_ARGUMENT_NESTING, MAX_BOXED_SPAN, MAX_NESTING, boxed_answer, guard_problem,
)

HOSTILE = {  # answer in the box -> the limit that refuses it
    "power_tower": ("9^{9^{9^9}}", "MAX_POWER_DIGITS"),
    "tower_of_three": ("9^{9^{9}}", "MAX_POWER_DIGITS"),
    "unbraced_tower": ("2^2^2^2^2", "MAX_POWER_DIGITS"),
    "tall_exponent": ("10^{10^{10}}", "MAX_POWER_DIGITS"),
    "huge_exponent": ("123456789^{987654321}", "MAX_POWER_DIGITS"),
    "stacked_powers": ("(((10^{100})^{100})^{100})^{100}", "MAX_POWER_DIGITS"),
    "huge_factorial": ("100000000!", "MAX_FACTORIAL"),
    "factorial_of_power": ("(10^{9})!", "MAX_FACTORIAL"),
    "nested_factorials": ("((3!)!)!", "MAX_FACTORIAL"),
    "nested_parentheses": ("(" * 3000 + "1" + ")" * 3000, "MAX_ANSWER_CHARS"),
    "nested_braces": ("{" * 20 + "1" + "}" * 20, "MAX_NESTING"),
    "long_sum": ("1+" * 50_000 + "1", "MAX_ANSWER_CHARS"),
}


@pytest.mark.timeout(300, method="thread")  # a hang in C (big-int power) ignores signals: end the session
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_answers_score_zero_without_running_sympy(name):
    answer, limit = HOSTILE[name]
    assert limit in guard_problem(answer)
    assert math_verify_reward(f"so \\boxed{{{answer}}}", "1") == 0.0
    assert math_verify_reward("so \\boxed{1}", answer) == 0.0  # as gold: unscorable, never correct


@pytest.mark.timeout(300, method="thread")
def test_unclosed_boxes_and_a_megabyte_response_return_at_once():
    assert math_verify_reward("\\boxed{" * 4000, "1") == 0.0
    assert math_verify_reward("x" * 1_000_000 + "\\boxed{" + "7" * 1_000_000 + "}", "7") == 0.0
    assert guard_problem("7" * 1_000_000)  # the megabyte answer is refused by length, before parsing


# (gold, answer in the box): real MATH-500 / GSM8K / fixture answers, each equal; identical verdicts on main
REAL = [
    ("\\frac{14}{3}", "\\dfrac{14}{3}"), ("\\frac{3}{56}", "3/56"), ("5\\sqrt{2}", "\\sqrt{50}"),
    ("2\\pi", "2\\pi"), ("\\frac{\\pi}{4}", "\\pi/4"), ("[-2,7]", "[-2, 7]"),
    ("(-\\infty, 1) \\cup (1, \\infty)", "(-\\infty,1)\\cup(1,\\infty)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
    ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix} \\frac{1}{5} \\\\ -\\frac{18}{5} \\end{pmatrix}"),
    ("1024", "2^{10}"), ("2^{10}", "1024"), ("3628800", "10!"), ("10!", "3628800"), ("9900", "\\frac{100!}{98!}"),
    ("10,\\!000", "10000"), ("6 - 5i", "6-5i"), ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("x^2+2x+1", "(x+1)^2"), ("256", "2^{2^{3}}"), ("6.02\\times 10^{23}", "6.02 \\cdot 10^{23}"),
    ("2^{100}", "2^{100}"), ("\\frac{1}{2^{10}}", "2^{-10}"), ("\\sqrt[3]{2}", "2^{1/3}"),
    ("e^{-x^2}", "e^{-x^{2}}"), ("48", "48"), ("1500", "1,500"), ("0.6", "\\frac{3}{5}"), ("3,-3", "-3, 3"),
]


@pytest.mark.parametrize("gold,answer", REAL)
def test_real_answers_pass_the_guards_and_still_verify(gold, answer):
    assert guard_problem(gold) is None and guard_problem(answer) is None
    assert math_verify_reward(f"so \\boxed{{{answer}}}", gold) == 1.0


def test_the_limits_sit_just_past_what_they_allow():
    assert guard_problem("1" * MAX_ANSWER_CHARS) is None
    assert "MAX_ANSWER_CHARS" in guard_problem("1" * (MAX_ANSWER_CHARS + 1))
    assert guard_problem("(" * MAX_NESTING + ")" * MAX_NESTING) is None
    assert "MAX_NESTING" in guard_problem("(" * (MAX_NESTING + 1) + ")" * (MAX_NESTING + 1))
    assert guard_problem("x^{100000}") is None and "MAX_POWER_DIGITS" in guard_problem("x^{100001}")
    assert guard_problem("10000!") is None and "MAX_FACTORIAL" in guard_problem("10001!")
    assert guard_problem("[0,1) \\cup [2,3) \\cup [4,5) \\cup [6,7)") is None  # open intervals leave `[` unmatched
    assert guard_problem("\\sqrt{" * MAX_ARGUMENT_NESTING + "2" + "}" * MAX_ARGUMENT_NESTING) is None
    deeper = "\\sqrt{" * (MAX_ARGUMENT_NESTING + 1) + "2" + "}" * (MAX_ARGUMENT_NESTING + 1)
    assert "MAX_ARGUMENT_NESTING" in guard_problem(deeper)
    assert "MAX_NESTING" in guard_problem("\\frac{1}{" + "{" * (MAX_NESTING + 1) + "2" + "}" * (MAX_NESTING + 2))


# small real answers the first guards refused: estimates now evaluate small exponents and factorials
SMALL = {
    "fermat_number": "2^{2^{6}}+1",  # 20 digits (was estimated at a million)
    "factorial_exponent": "2^{3!}",
    "symbolic_factorial_exponent": "(-1)^{n!}",
    "factorial_of_power": "(2^{3})!",
    "large_power_of_two": "2^{300000}",  # 90,309 digits: log10(2) x 300000
    "continued_fraction_depth_9": "1+\\cfrac{1}{" * 9 + "1" + "}" * 9,
    "nested_root_depth_9": "\\sqrt{2+" * 9 + "2" + "}" * 9,
    "dfrac_matrix_8x8": "\\begin{pmatrix} " + " \\\\ ".join(
        " & ".join(f"-\\dfrac{{{i}}}{{{j + 10}}}" for j in range(8)) for i in range(1, 9)) + " \\end{pmatrix}",
    "symbolic_power_for_the_pool": "(x+1)^{99999}",  # passes: the pool's timeout is its guard
}


@pytest.mark.parametrize("name", list(SMALL))
def test_small_real_answers_pass_the_guards(name):
    assert guard_problem(SMALL[name]) is None


def test_what_the_tighter_estimates_still_refuse():
    assert "MAX_POWER_DIGITS" in guard_problem("2^{400000}")  # 120,412 digits
    assert "MAX_POWER_DIGITS" in guard_problem("2^{100!}")
    assert "double superscript" in guard_problem("2^3^2")  # LaTeX rejects it; a tower or (2^3)^2?
    assert "factorial of a factorial" in guard_problem("(3!)!")
    assert "MAX_FACTORIAL" in guard_problem("(2^{14})!")


@pytest.mark.timeout(300, method="thread")
def test_box_spam_is_refused_and_a_long_last_box_is_not_joined():
    assert boxed_answer("\\boxed{1}, " * 100) == "1"  # math-verify drops repeats
    assert len("\\boxed{1}, \\boxed{2}, " * 500) > MAX_BOXED_SPAN
    assert boxed_answer("\\boxed{1}, \\boxed{2}, " * 500) == ""  # chained past MAX_BOXED_SPAN: no answer
    assert math_verify_reward("\\boxed{1}, \\boxed{2}, " * 50_000, "\\{1, 2\\}") == 0.0
    assert boxed_answer("\\boxed{1}, \\boxed{" + "7" * 10**6 + "}") == "7" * 10**6  # refused by length next
