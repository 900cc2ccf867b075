"""Stepwise clip schedule callback: the one source of the cross-ratio lower bound of each mini-batch.

HACPO's lower bound rises with the mini-batch index m inside a step, `lower_m = min(1, 1 - delta +
m * delta_step)` (Eq. 14, `algorithms.losses.cross_clip_lower`), and resets every step. The module
asks `lower(m)` for every mini-batch and hands the number to the loss, which knows neither delta
nor m; so a different schedule (for example one that also moves with the training step) is a
different callback, not a change to the update loop. Each step it reports the first and the last
bound it gave (`clip/cross_lower_first`, `clip/cross_lower_last`).
"""

from __future__ import annotations

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.losses import cross_clip_lower


class StepwiseClipCallback(Callback):
    def __init__(self, *, delta: float, delta_step: float):
        self.delta = delta
        self.delta_step = delta_step
        self._last_m = -1

    def lower(self, m: int) -> float:
        """The cross lower bound of mini-batch m of this step (Eq. 14)."""
        self._last_m = max(self._last_m, m)
        return cross_clip_lower(m, self.delta, self.delta_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._last_m = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._last_m >= 0:
            pl_module.report({"clip/cross_lower_first": cross_clip_lower(0, self.delta, self.delta_step),
                              "clip/cross_lower_last": cross_clip_lower(self._last_m, self.delta, self.delta_step)})
