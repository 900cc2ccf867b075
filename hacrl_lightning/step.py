"""The contract of one training step between its producer (the DataModule) and its consumer (the module).

`StepBatch` is the step whole (rollouts, rewards, each learner's token view), `RolloutSource` what
hands it to the module (`RolloutDataModule.rollout`; the module is given its source the way it is
given its clip schedule), and `step_seed` the seeds every part of a step draws from (run seed,
training step, salt), so a resumed run and every rank draw the same ones.
Deliberately not here: producing a step (datamodule.py) or training on it (module.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from hacrl_lightning.agents.exchange import AgentView, Rollout
from hacrl_lightning.data.records import Example

__all__ = ["RolloutSource", "StepBatch", "step_seed"]


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A reproducible seed for (run seed, training step, salt) that stays within 63 bits."""
    return (seed * 1_000_003 + step * 10_007 + salt * 101 + 17) % (2**63 - 1)


@dataclass
class StepBatch:
    """One training step over the global batch (every rank's prompts, in rank order), whole:
    `rollouts[(p * n + j) * G + i]` is sample i of agent j on prompt p, `rewards[p, j, i]` its reward,
    and `views[learner]` the learner's token view of the responses it trains on (all of them when
    rollouts are shared, its own otherwise); a view's `row_idx` indexes this flat order."""

    examples: list[Example]
    rollouts: list[Rollout]
    rewards: torch.Tensor                      # [P, n, G]
    views: dict[str, AgentView]
    reward_stats: dict[str, int] = field(default_factory=dict)
    """The reward pool's counters (timeouts, crashes) summed over ranks."""
    timings: dict[str, float] = field(default_factory=dict)
    """This rank's seconds of generation (`rollout`), scoring (`reward`) and retokenization (`exchange`)."""

    @property
    def group_size(self) -> int:
        return self.rewards.shape[2]


class RolloutSource(Protocol):
    """Where the module's training steps come from (`datamodule.RolloutDataModule`)."""

    def rollout(self, examples: Sequence[Example], *, step: int) -> StepBatch:
        """Training step `step` (0-based) on this rank's prompt batch `examples`, gathered over ranks."""
        ...
