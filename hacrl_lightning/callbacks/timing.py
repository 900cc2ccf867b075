"""Step timer: wall time spent in training steps (rollout through update), apart from evaluation.

Held-out evaluation runs inside `on_train_batch_end` callbacks, so a step's wall time measured
from `on_train_batch_start` to the *start* of the evaluation would need ordering guarantees;
instead this callback is placed before the evaluation callback and stops its clock at
`on_train_batch_end`, which Lightning calls on callbacks in list order. Its state is checkpointed,
so the total survives a resume. Deliberately not here: per-phase timings (the module logs
`time/*` per step) and evaluation time (`HeldOutEvalCallback.eval_s`).
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback


class StepTimer(Callback):
    def __init__(self) -> None:
        self.train_s = 0.0
        self.steps = 0
        self._start: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._start is not None:
            self.train_s += time.perf_counter() - self._start
            self.steps += 1
            self._start = None

    @property
    def step_s(self) -> float:
        """Mean wall seconds per training step (0.0 before the first step)."""
        return self.train_s / self.steps if self.steps else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"train_s": self.train_s, "steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_s = float(state_dict["train_s"])
        self.steps = int(state_dict["steps"])
