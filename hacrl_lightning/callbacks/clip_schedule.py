"""Stepwise clip schedule callback: the one source of the cross-ratio lower bound of each mini-batch.

HACPO's lower bound rises with the mini-batch index m inside a step, `lower_m = min(1, 1 - delta +
m * delta_step)` (Eq. 14, `algorithms.losses.cross_clip_lower`), and resets every step. At
`on_train_batch_start` this callback hands the step's bounds forward on the batch
(`StepBatch.cross_lower`: one per mini-batch index, as many as the longest learner plan of the step can
have, `ceil(rows / mini_batch_size)`); the module gives mini-batch m its `cross_lower[m]`, and the loss
knows neither delta nor m. So a different schedule (for example one that also moves with the training
step, `StepBatch.step`) is a different callback, not a change to the update loop. Deliberately stateless
across steps: the bound restarts each step, so there is nothing to checkpoint.
"""

from __future__ import annotations

import math

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.losses import cross_clip_lower
from hacrl_lightning.step import StepBatch


class StepwiseClipCallback(Callback):
    """delta, delta_step: Eq. 14's schedule; mini_batch_size: responses per mini-batch (`UpdateSettings`)."""

    def __init__(self, *, delta: float, delta_step: float, mini_batch_size: int):
        self.delta = delta
        self.delta_step = delta_step
        self.mini_batch_size = mini_batch_size

    def bounds(self, count: int) -> tuple[float, ...]:
        """The lower bounds of mini-batches m = 0 .. count - 1 (Eq. 14)."""
        return tuple(cross_clip_lower(m, self.delta, self.delta_step) for m in range(count))

    def on_train_batch_start(self, trainer, pl_module, batch: StepBatch, batch_idx) -> None:
        rows = max((len(view.row_idx) for view in batch.views.values()), default=0)
        batch.cross_lower = self.bounds(math.ceil(rows / self.mini_batch_size))
