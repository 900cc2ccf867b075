"""The contract of one training step, which flows one way: DataModule -> callbacks -> module.

`PromptBatch` is what the loader serves (the step's index and this rank's prompts); `StepBatch` the
step whole, made from it by the DataModule (`RolloutDataModule.on_after_batch_transfer`: rollouts,
rewards, each learner's token view), to which the callbacks add the step's values at
`on_train_batch_start` (`CapabilityCallback`: omega; `StepwiseClipCallback`: the cross lower bound of
each mini-batch) before the module trains on it; and `step_seed` the seeds every part of a step draws
from (run seed, training step, salt), so a resumed run and every rank draw the same ones.
Deliberately not here: producing a step (datamodule.py), its values (callbacks/) or training on it
(module.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from hacrl_lightning.exchange import AgentView, Rollout
from hacrl_lightning.data.records import Example

__all__ = ["PromptBatch", "StepBatch", "step_seed"]


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A reproducible seed for (run seed, training step, salt) that stays within 63 bits."""
    return (seed * 1_000_003 + step * 10_007 + salt * 101 + 17) % (2**63 - 1)


@dataclass
class PromptBatch:
    """Batch `step` of the train loader: this rank's share of the step's prompts (`StepBatchSampler`)."""

    step: int
    """The training step (0-based) these prompts are for."""
    examples: list[Example]

    def __len__(self) -> int:
        return len(self.examples)


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
    step: int = 0
    """The training step (0-based)."""
    started: float = 0.0
    """`time.perf_counter()` when the DataModule began making this step: where its clock starts (`StepTimer`)."""
    compile_started: Optional[float] = None
    """torch's compile seconds so far (`compiling.compile_seconds`) when the DataModule began making this step: what
    `StepTimer` keeps out of the step's clock counts from here, the rollout's compile (`rollout.hf_compile`) too."""
    omega: Optional[torch.Tensor] = None                                             # [n, n]
    """The step's capability ratios omega[i, j], handed forward by `CapabilityCallback` (None until then)."""
    cross_lower: Optional[tuple[float, ...]] = None
    """The cross-ratio lower bound of mini-batch m = 0, 1, ... of any learner this step (Eq. 14), handed
    forward by `StepwiseClipCallback` (None until then); as many as the longest plan can have."""

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def group_size(self) -> int:
        return self.rewards.shape[2]
