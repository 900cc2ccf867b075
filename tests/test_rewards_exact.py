"""Exact-match reward: the last \\boxed{...} (nested braces) against the gold answer; the registry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hacrl_lightning.rewards import REWARDS, exact_match_reward, extract_boxed, get_reward, register_reward


@pytest.mark.parametrize("text,expected", [
    ("\\boxed{42}", "42"),
    ("so \\boxed{1} then \\boxed{-7}.", "-7"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{{a}{b}} tail", "{a}{b}"),
    ("\\boxed {5}", "5"),
    ("\\boxed{3} and \\boxed{4", "3"),
    ("\\boxed{}", ""),
    ("no box 42", None),
    ("\\boxed", None),
    ("", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("response,gold,reward", [
    ("\\boxed{42}", "42", 1.0),
    ("The answer is \\boxed{ 4 2 }", "42", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("42", "42", 0.0),
    ("\\boxed{42} \\boxed{43}", "42", 0.0),
    ("\\boxed{-5}", "-5", 1.0),
    ("\\boxed{042}", "42", 0.0),
])
def test_exact_match_reward(response, gold, reward):
    assert exact_match_reward(response, gold) == reward


@given(st.integers(-10**6, 10**6), st.text(alphabet="abc 123+-={}.", max_size=30))
def test_a_boxed_gold_after_any_text_scores_one(value, prefix):
    assert exact_match_reward(f"{prefix}\\boxed{{{value}}}", str(value)) == 1.0
    assert exact_match_reward(f"{prefix}\\boxed{{{value + 1}}}", str(value)) == 0.0


def test_registry_by_name_fails_loudly():
    assert get_reward("exact_match") is exact_match_reward
    with pytest.raises(KeyError, match=r"did you mean 'exact_match'.*known: \['exact_match'"):
        get_reward("exact_mach")
    register_reward("exact_match")(exact_match_reward)  # the same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_reward("exact_match")(lambda response, gold: 0.0)
    assert REWARDS["exact_match"] is exact_match_reward


def _extract_boxed_by_scanning(text: str) -> str | None:
    """The former definition (scan from each `\\boxed`, last first): the reference the linear one must equal."""
    start = text.rfind("\\boxed")
    while start != -1:
        pos = start + len("\\boxed")
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] == "{":
            depth = 0
            for end in range(pos, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    return text[pos + 1 : end]
        start = text.rfind("\\boxed", 0, start)
    return None


@given(st.lists(st.sampled_from(["\\boxed", "{", "}", " ", "7", "x"]), max_size=40).map("".join))
def test_linear_extract_boxed_equals_the_scanning_definition(text):
    assert extract_boxed(text) == _extract_boxed_by_scanning(text)


@pytest.mark.timeout(60)  # a hang guard, not a timing: linear is milliseconds, the scanning definition ~40 min
def test_thousands_of_unclosed_boxes_are_read_once():
    """4,000 unclosed `\\boxed{` used to take ~6 s (each scanned to the end, quadratic); 80,000 would take
    most of an hour. The answer among them is still found."""
    text = "\\boxed{" * 4000 + "\\boxed{42}" + "\\boxed{" * 4000
    assert extract_boxed(text) == "42" and exact_match_reward(text, "42") == 1.0
    assert extract_boxed(text * 10) == "42"
