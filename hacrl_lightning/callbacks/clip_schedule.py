"""Stepwise clip schedule callback: the cross-ratio lower bound for each mini-batch of a step.

HACPO's lower bound rises with the mini-batch index m inside a step, `lower_m = min(1, 1 - delta +
m * delta_step)` (Eq. 13, `algorithms.losses.cross_clip_lower`), and resets every step. Before each
step this callback writes the bounds into `pl_module.cross_clip_bounds` (one per mini-batch) and
logs the first and last, so a different schedule (for example one that also moves with the
training step) is a different callback, not a change to the update loop. It holds no state.
"""

from __future__ import annotations

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.losses import cross_clip_lower
from hacrl_lightning.config import AlgorithmConfig


class StepwiseClipCallback(Callback):
    def __init__(self, cfg: AlgorithmConfig):
        self.delta = cfg.delta
        self.delta_step = cfg.delta_step

    def bounds(self, num_mini_batches: int) -> list[float]:
        return [cross_clip_lower(m, self.delta, self.delta_step) for m in range(num_mini_batches)]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        bounds = self.bounds(pl_module.max_mini_batches())
        pl_module.cross_clip_bounds = bounds
        pl_module.step_metrics.update({"clip/cross_lower_first": bounds[0], "clip/cross_lower_last": bounds[-1]})
