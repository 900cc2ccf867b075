"""The registry of verifiable rewards by name: `get_reward("exact_match")(response, gold) -> float` in [0, 1].

The registry fails loudly: an unknown name lists the valid ones, and registering a different function under a
taken name raises. Deliberately not here: the rewards themselves (registered in `rewards/__init__.py`), the pool
(pool.py) and the user's own rewards (custom.py).
"""

from __future__ import annotations

from typing import Callable, Dict

from hacrl_lightning.errors import suggest

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


