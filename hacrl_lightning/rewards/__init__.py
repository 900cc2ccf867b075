"""Verifiable rewards: `get_reward("exact_match")(response, gold) -> float` in [0, 1], and your own.

A reward function takes the decoded response text and the gold answer and returns a float. The
registry (registry.py) fails loudly: an unknown name lists the valid ones, and registering a different
function under a taken name raises. `exact_match` (synthetic task) and `math_verify` (math benchmarks) are
registered here. A run's reward is a `Reward` (custom.py): a registered name, your own function by module
or file, or a weighted sum of them. Batching, timeouts and crash isolation live in `RewardPool` (pool.py).
"""

from __future__ import annotations

import logging
from typing import Sequence, TypeVar

from hacrl_lightning.rewards.registry import (GOLD_CHECKS, REWARDS, GoldCheck, RewardFn, get_reward,
                                              register_reward, reward_names)
from hacrl_lightning.rewards.exact_match import exact_match_reward, extract_boxed
from hacrl_lightning.rewards.math_verify import gold_parses, math_verify_reward
from hacrl_lightning.rewards.custom import Reward, RewardError, Scored, is_code, load_function
from hacrl_lightning.rewards.pool import RewardPool

log = logging.getLogger(__name__)
T = TypeVar("T")


def scorable_golds(name: str, golds: list[str]) -> list[bool]:
    """For each gold answer, whether reward `name` can score it (True for rewards without a gold check)."""
    get_reward(name)
    check = GOLD_CHECKS.get(name)
    return [True] * len(golds) if check is None else [bool(check(gold)) for gold in golds]


def exclude_unscorable(examples: Sequence[T], name: "str | Reward", *, what: str) -> list[T]:
    """`examples` (anything with a `.gold`) without those whose gold reward `name` cannot score.

    Each exclusion is reported (a warning naming `what`, the count and the first few golds): a
    problem whose gold does not parse would score 0 for every answer and silently look unsolvable.
    """
    examples = list(examples)
    names = list(name.registered) if isinstance(name, Reward) else ([] if is_code(name) else [name])  # code: no gold check
    golds = [ex.gold for ex in examples]
    keep = [all(ok) for ok in zip(*(scorable_golds(n, golds) for n in names))] if names else [True] * len(golds)
    name = "+".join(names)
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
    "exclude_unscorable", "register_reward", "reward_names", "scorable_golds", "Reward", "RewardError", "Scored",
    "is_code", "load_function",
]
