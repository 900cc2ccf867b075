"""The project's table of reward cases, each checked against the project's verdict and plain math-verify.

Every row is (name, gold, response, ours, plain, why): `ours` is what `math_verify_reward` must return;
`plain` what plain math-verify returns on the same text, `verify(parse(gold), parse(response))` with
its defaults, a bare gold put in a `\\boxed{}` (None: not run, it hangs or takes seconds); `why` names
the reason, explained in docs/rewards.md ("Where the verdict differs from plain math-verify"), for
every row whose verdicts differ or where plain math-verify is not run, and is None elsewhere.

The rows cover the wrong answers that scored 1.0 before (a leading number of a box, hedged boxes),
sets written as several boxes, towers, deep fractions and roots, trailing punctuation, long matrices
and the hostile answers of tests/test_reward_guards.py.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import pytest
from math_verify import parse, verify

from hacrl_lightning.rewards import math_verify_reward
from hacrl_lightning.rewards.math_verify import guard_problem

DOCS = Path(__file__).resolve().parents[1] / "docs" / "rewards.md"


def continued_fraction(depth: int) -> tuple[str, str]:
    """`1+\\cfrac{1}{1+\\cfrac{1}{...}}` nested `depth` deep, and its value as a `\\frac`."""
    text, value = "1", Fraction(1)
    for _ in range(depth):
        text, value = f"1+\\cfrac{{1}}{{{text}}}", 1 + 1 / value
    return text, f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def nested_root(depth: int) -> str:
    """`\\sqrt{2+\\sqrt{2+...\\sqrt{2+2}}}` nested `depth` deep: 2 at every level."""
    text = "2"
    for _ in range(depth):
        text = f"\\sqrt{{2+{text}}}"
    return text


def nested_frac(depth: int) -> str:
    """`\\frac{\\frac{1}{2}}{2}` nested `depth` deep: 2^-depth."""
    text = "1"
    for _ in range(depth):
        text = f"\\frac{{{text}}}{{2}}"
    return text


def matrix(n: int, frac: str, off: int = 0) -> str:
    """An n x n pmatrix of -i/(j+10) written with `frac` (`\\dfrac`, `\\frac`); `off` added to the last entry."""
    rows = [" & ".join(f"-{frac}{{{i + 1 + off * (i == j == n - 1)}}}{{{j + 10}}}" for j in range(n)) for i in range(n)]
    return "\\begin{pmatrix} " + " \\\\ ".join(rows) + " \\end{pmatrix}"


def box(answer: str) -> str:
    return f"Reasoning ... so the answer is \\boxed{{{answer}}}"


FAR = " and then we check the working once more" * 2  # 80 characters: boxes this far apart are never one answer
CF9, CF9_VALUE = continued_fraction(9)
DFRAC_8X8 = matrix(8, "\\dfrac")

# name, gold, response, ours, plain (None: not run), why (docs/rewards.md)
CASES = [
    # a wrong answer with a trailing period: once read as its leading number (scored 1.0)
    ("power_period_vs_base", "2", box("2^{10}."), 0.0, 0.0, None),
    ("power_period_vs_base_10", "10", box("10^{3}."), 0.0, 0.0, None),
    ("pi_period_vs_coefficient", "2", box("2\\pi."), 0.0, 0.0, None),
    ("square_period_vs_base", "5", box("5^{2}."), 0.0, 0.0, None),
    ("spaced_pi_period_vs_coefficient", "2", box(" 2\\pi."), 0.0, 1.0, "leading piece"),
    ("fraction_pi_period_vs_fraction", "\\frac{1}{2}", box("\\frac{1}{2}\\pi."), 0.0, 1.0, "leading piece"),
    ("equation_period", "3", box("x=3."), 1.0, 1.0, None),
    # trailing punctuation on a right answer
    ("integer_period", "42", box("42."), 1.0, 0.0, "trailing period"),
    ("power_period_vs_value", "1024", box("2^{10}."), 1.0, 0.0, "trailing period"),
    ("pi_period", "2\\pi", box("2\\pi."), 1.0, 0.0, "trailing period"),
    ("fraction_period", "\\frac{1}{2}", box("\\frac{1}{2}."), 1.0, 1.0, None),
    ("period_after_box", "42", "so the answer is \\boxed{42}.", 1.0, 1.0, None),
    ("box_in_dollars", "42", "so the answer is $\\boxed{42.}$.", 1.0, 0.0, "trailing period"),
    # percent signs
    ("percent_answer", "10", box("10\\%"), 1.0, 0.0, "percent"),
    ("percent_gold", "10\\%", box("10"), 1.0, 0.0, "percent"),
    ("percent_is_not_a_fraction", "0.1", box("10\\%"), 0.0, 0.0, None),
    # several boxes: math-verify's one answer
    ("set_as_three_boxes", "\\{1,2,3\\}", "\\boxed{1}, \\boxed{2}, \\boxed{3}", 1.0, 1.0, None),
    ("set_as_boxes_with_and", "\\{1,2,3\\}", "\\boxed{1}, \\boxed{2} and \\boxed{3}", 1.0, 1.0, None),
    ("set_as_boxes_any_order", "\\{1,2,3\\}", "\\boxed{3}, \\boxed{1}, \\boxed{2}", 1.0, 1.0, None),
    ("set_missing_a_box", "\\{1,2,3\\}", "\\boxed{1}, \\boxed{2}", 0.0, 0.0, None),
    ("hedge_and", "5", "\\boxed{4} and \\boxed{5}", 0.0, 0.0, None),
    ("hedge_or", "5", "it is \\boxed{4} or \\boxed{5}", 0.0, 0.0, None),
    ("correction_far_apart", "5", "\\boxed{4}" + FAR + " \\boxed{5}", 1.0, 1.0, None),
    ("gold_boxes_answer_set", "\\boxed{1}, \\boxed{2}", box("1,2"), 1.0, 1.0, None),
    ("gold_boxes_answer_boxes", "\\boxed{1}, \\boxed{2}", "\\boxed{2}, \\boxed{1}", 1.0, 1.0, None),
    ("gold_boxes_answer_last_only", "\\boxed{1}, \\boxed{2}", box("2"), 0.0, 0.0, None),
    ("named_value", "45", box("k = 45"), 1.0, 1.0, None),
    ("named_values_as_boxes", "\\boxed{k = 45}, \\boxed{n = 2}", "\\boxed{k = 45}, \\boxed{n = 2}", 1.0, 1.0, None),
    ("named_values_one_missing", "\\boxed{k = 45}, \\boxed{n = 2}", box("n = 2"), 0.0, 0.0, None),
    ("unclosed_last_box", "5", "\\boxed{5} then \\boxed{6", 1.0, 1.0, None),
    # towers, factorials in exponents
    ("fermat_number", "18446744073709551617", box("2^{2^{6}}+1"), 1.0, 1.0, None),
    ("braced_tower", "65536", box("2^{2^{2^{2}}}"), 1.0, 1.0, None),
    ("factorial_exponent", "64", box("2^{3!}"), 1.0, 1.0, None),
    ("symbolic_factorial_exponent", "(-1)^{n!}", box("(-1)^{n!}"), 1.0, 1.0, None),
    ("power_of_two_hundred", "2^{100}", box("1267650600228229401496703205376"), 1.0, 1.0, None),
    ("double_superscript", "65536", box("2^2^2^2^2"), 0.0, 1.0, "double superscript"),
    ("factorial_of_factorial", "6!", box("(3!)!"), 0.0, 1.0, "nested factorial"),
    # deep fractions and roots
    ("continued_fraction_depth_9", CF9_VALUE, box(CF9), 1.0, 1.0, None),
    ("nested_root_depth_9", "2", box(nested_root(9)), 1.0, 1.0, None),
    ("nested_frac_depth_9", "\\frac{1}{512}", box(nested_frac(9)), 1.0, 1.0, None),
    ("continued_fraction_off_by_one", CF9_VALUE, box(continued_fraction(8)[0]), 0.0, 0.0, None),
    # long matrices
    ("dfrac_matrix_8x8", matrix(8, "\\frac"), box(DFRAC_8X8), 1.0, 1.0, None),
    ("dfrac_matrix_8x8_one_entry_off", matrix(8, "\\frac"), box(matrix(8, "\\dfrac", off=1)), 0.0, 0.0, None),
    # wrong answers stay wrong, right ones right
    ("three_decimals_of_a_third", "\\frac{1}{3}", box("0.333"), 0.0, 0.0, None),
    ("hedge_in_text", "2", box("1 \\text{ or } 2"), 0.0, 0.0, None),
    ("interval_ends", "(1,2]", box("(1,2)"), 0.0, 0.0, None),
    ("polynomial_sign", "x^2+1", box("x^2-1"), 0.0, 0.0, None),
    ("units", "5", box("5\\text{ cm}"), 1.0, 1.0, None),
    ("decimal_and_fraction", "\\frac{1}{2}", box("0.5"), 1.0, 1.0, None),
    ("thousands_spacing", "10,\\!000", box("10000"), 1.0, 1.0, None),
    ("gold_in_dollars", "$\\frac{1}{2}$", box("0.5"), 1.0, 1.0, None),
    ("no_box", "5", "The answer is 5.", 0.0, 1.0, "box required"),
    # hostile answers: refused before parsing (tests/test_reward_guards.py)
    ("power_tower", "1", box("9^{9^{9^9}}"), 0.0, None, "hostile"),
    ("huge_exponent", "1", box("123456789^{987654321}"), 0.0, None, "hostile"),
    ("stacked_powers", "1", box("(((10^{100})^{100})^{100})^{100}"), 0.0, None, "hostile"),
    ("huge_factorial", "1", box("100000000!"), 0.0, None, "hostile"),
    ("factorial_of_power", "1", box("(10^{9})!"), 0.0, None, "hostile"),
    ("nested_factorials", "1", box("((3!)!)!"), 0.0, 0.0, None),
    ("nested_braces", "1", box("{" * 20 + "1" + "}" * 20), 0.0, None, "hostile"),
    ("nested_parentheses", "1", box("(" * 3000 + "1" + ")" * 3000), 0.0, None, "hostile"),
    ("long_sum", "1", box("1+" * 50_000 + "1"), 0.0, None, "hostile"),
    ("deep_fractions_read_as_a_half", "\\frac{1}{2}", box(nested_frac(150)), 0.0, 1.0, "hostile"),
    ("unclosed_boxes", "1", "\\boxed{" * 4000, 0.0, 0.0, None),
]
HOSTILE = {name for name, *_, why in CASES if why == "hostile"} | {"nested_factorials"}
WHY = ("leading piece", "trailing period", "percent", "double superscript", "nested factorial", "box required", "hostile")


PLAIN_TIME_LIMIT_S = 120
"""Plain math-verify's own limits are 5 s a parse and 5 s a comparison; on 150 nested fractions a loaded 2-core
machine exceeded them (a fresh-clone `make test`, 2026-11-28: 0.0 where it reads 1.0 alone). The table records
its rules' verdict, not the clock, so the limits are raised; every other setting is its default."""


def plain_math_verify(gold: str, response: str) -> float:
    """Plain math-verify on the same text: its defaults (time limits raised), gold first, a bare gold boxed."""
    gold_text = gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"
    return float(verify(parse(gold_text, parsing_timeout=PLAIN_TIME_LIMIT_S),
                        parse(response, parsing_timeout=PLAIN_TIME_LIMIT_S), timeout_seconds=PLAIN_TIME_LIMIT_S))


@pytest.fixture(autouse=True)
def _quiet_math_verify():
    logging.disable(logging.WARNING)  # plain math-verify logs each unparsed text
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.timeout(300, method="thread")  # hang guard: the hostile rows run in milliseconds
@pytest.mark.parametrize("name,gold,response,ours,plain,why", CASES, ids=[case[0] for case in CASES])
def test_project_verdict(name, gold, response, ours, plain, why):
    assert math_verify_reward(response, gold) == ours


@pytest.mark.parametrize("name,gold,response,ours,plain,why", [case for case in CASES if case[4] is not None],
                         ids=[case[0] for case in CASES if case[4] is not None])
def test_plain_math_verify_verdict(name, gold, response, ours, plain, why):
    assert plain_math_verify(gold, response) == plain


def test_every_difference_has_a_documented_reason():
    documented = DOCS.read_text()
    for name, _, _, ours, plain, why in CASES:
        assert (why is not None) == (plain != ours), name  # a reason exactly where the verdicts part
        assert why is None or (why in WHY and f"**{why}**" in documented), (name, why)
    assert len(CASES) >= 40 and len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_rows_are_refused_before_parsing(name):
    from hacrl_lightning.rewards.math_verify import boxed_answer  # imported here: the table also runs on older code

    _, gold, response, *_ = next(case for case in CASES if case[0] == name)
    answer = boxed_answer(response)
    assert answer is not None and guard_problem(answer) is not None


def test_the_long_and_deep_rows_exercise_the_old_limits():
    assert len(DFRAC_8X8) > 1_000  # the old MAX_ANSWER_CHARS
    depth = deepest = 0
    for char in CF9:
        depth += (char == "{") - (char == "}")
        deepest = max(deepest, depth)
    assert deepest == 9  # past the old MAX_NESTING of 8
