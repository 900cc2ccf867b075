"""Verifiable rewards by name: `get_reward("exact_match")(response, gold) -> float` in [0, 1].

A reward function takes the decoded response text and the gold answer and returns a float. The
registry fails loudly: an unknown name lists the valid ones, and registering a different function
under a taken name raises. `exact_match` (synthetic task) and `math_verify` (math benchmarks) are
registered. Batching, timeouts and crash isolation live in `RewardPool` (pool.py).
"""

from __future__ import annotations

from typing import Callable, Dict

from hacrl_lightning.config import suggest
from hacrl_lightning.rewards.exact_match import exact_match_reward, extract_boxed
from hacrl_lightning.rewards.math_verify import gold_parses, math_verify_reward
from hacrl_lightning.rewards.pool import RewardPool

RewardFn = Callable[[str, str], float]
REWARDS: Dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make `fn(response, gold) -> float` available as `name`."""

    def add(fn: RewardFn) -> RewardFn:
        if REWARDS.get(name, fn) is not fn:
            raise ValueError(f"reward {name!r} is already registered to {REWARDS[name].__qualname__}; "
                             "pick another name")
        REWARDS[name] = fn
        return fn

    return add


def reward_names() -> list[str]:
    return sorted(REWARDS)


def get_reward(name: str) -> RewardFn:
    """The reward function registered as `name`; an unknown name raises KeyError listing the valid ones."""
    if name not in REWARDS:
        raise KeyError(f"data.reward={name!r} is unknown: {suggest(name, REWARDS)}; set data.reward to one of them")
    return REWARDS[name]


register_reward("exact_match")(exact_match_reward)
register_reward("math_verify")(math_verify_reward)

__all__ = [
    "REWARDS", "RewardFn", "RewardPool", "exact_match_reward", "extract_boxed", "get_reward", "gold_parses", "math_verify_reward",
    "register_reward", "reward_names",
]
