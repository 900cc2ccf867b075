"""Verifiable rewards by name: `get_reward("exact_match")(response, gold) -> float` in [0, 1].

A reward function takes the decoded response text and the gold answer and returns a float. The
registry fails loudly: an unknown name lists the valid ones, and registering a different function
under a taken name raises. `exact_match` (synthetic task) and `math_verify` (math benchmarks) are
registered. Batching, timeouts and crash isolation live in `RewardPool` (pool.py).
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Sequence, TypeVar

from hacrl_lightning.errors import suggest
from hacrl_lightning.rewards.exact_match import exact_match_reward, extract_boxed
from hacrl_lightning.rewards.math_verify import gold_parses, math_verify_reward
from hacrl_lightning.rewards.pool import RewardPool

log = logging.getLogger(__name__)
T = TypeVar("T")
RewardFn = Callable[[str, str], float]
GoldCheck = Callable[[str], bool]
REWARDS: Dict[str, RewardFn] = {}
GOLD_CHECKS: Dict[str, GoldCheck] = {}


def register_reward(name: str, *, gold_check: GoldCheck | None = None) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make `fn(response, gold) -> float` available as `name`.

    `gold_check(gold) -> bool` says whether the reward can score a gold answer at all; problems whose
    gold fails it are excluded at load time (`scorable_golds`) instead of scoring 0 for every answer.
    """

    def add(fn: RewardFn) -> RewardFn:
        if REWARDS.get(name, fn) is not fn:
            raise ValueError(f"reward {name!r} is already registered to {REWARDS[name].__qualname__}; "
                             "pick another name")
        REWARDS[name] = fn
        if gold_check is not None:
            GOLD_CHECKS[name] = gold_check
        return fn

    return add


def reward_names() -> list[str]:
    return sorted(REWARDS)


def get_reward(name: str) -> RewardFn:
    """The reward function registered as `name`; an unknown name raises KeyError listing the valid ones."""
    if name not in REWARDS:
        raise KeyError(f"data.reward={name!r} is unknown: {suggest(name, REWARDS)}; set data.reward to one of them")
    return REWARDS[name]


def scorable_golds(name: str, golds: list[str]) -> list[bool]:
    """For each gold answer, whether reward `name` can score it (True for rewards without a gold check)."""
    get_reward(name)
    check = GOLD_CHECKS.get(name)
    return [True] * len(golds) if check is None else [bool(check(gold)) for gold in golds]


def exclude_unscorable(examples: Sequence[T], name: str, *, what: str) -> list[T]:
    """`examples` (anything with a `.gold`) without those whose gold reward `name` cannot score.

    Each exclusion is reported (a warning naming `what`, the count and the first few golds): a
    problem whose gold does not parse would score 0 for every answer and silently look unsolvable.
    """
    examples = list(examples)
    keep = scorable_golds(name, [ex.gold for ex in examples])
    dropped = [ex.gold for ex, ok in zip(examples, keep) if not ok]
    if dropped:
        shown = ", ".join(repr(gold[:60]) for gold in dropped[:3]) + (", ..." if len(dropped) > 3 else "")
        log.warning("%s: excluded %d of %d problems whose gold answer the reward %r cannot parse: %s",
                    what, len(dropped), len(examples), name, shown)
    return [ex for ex, ok in zip(examples, keep) if ok]


register_reward("exact_match")(exact_match_reward)
register_reward("math_verify", gold_check=gold_parses)(math_verify_reward)

__all__ = [
    "GOLD_CHECKS", "REWARDS", "RewardFn", "RewardPool", "exact_match_reward", "extract_boxed", "get_reward", "gold_parses", "math_verify_reward",
    "exclude_unscorable", "register_reward", "reward_names", "scorable_golds",
]
