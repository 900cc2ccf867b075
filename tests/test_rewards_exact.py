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
