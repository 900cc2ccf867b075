"""The run's clocks: wall time in training steps (rollout through update: from `StepBatch.started`) apart
from evaluation, and
the run's whole wall time across sessions (start-up included; a resumed run adds the time of the
sessions before, up to their checkpoint), with the run's first start.

Held-out evaluation runs inside `on_train_batch_end` callbacks, so a step's wall time measured
from `on_train_batch_start` to the *start* of the evaluation would need ordering guarantees;
instead this callback is placed before the evaluation callback and stops its clock at
`on_train_batch_end`, which Lightning calls on callbacks in list order. Its state is checkpointed,
so the totals survive a resume. Under `trainer.compile` or `rollout.hf_compile` the seconds torch spends compiling
during a step, its rollout included (`compiling.compile_seconds` from `StepBatch.compile_started`: the first steps
and each recompile) are kept out of the step's clock, in `compile_s`,
and each step reports `time/compile` and `compile/graphs` (`compiling.compile_metrics`). Deliberately not here:
per-phase timings (the module logs `time/*` per step) and evaluation time (not measured: the run clock includes it).
"""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback


class StepTimer(Callback):
    def __init__(self, *, started: float | None = None, compiled: bool = False) -> None:
        """`started`: when this session began (epoch seconds; default now), e.g. the process start; `compiled`: the
        agents' passes are compiled (`trainer.compile`)."""
        self.train_s = 0.0
        self.compile_s = 0.0
        """Seconds spent compiling inside steps, kept out of `train_s`."""
        self.compiled = compiled
        self._compile_start = 0.0
        self.steps = 0
        self._start: float | None = None
        self.session_start = time.time() if started is None else started
        self.started_at = self.session_start
        """When the run's first session began (epoch seconds)."""
        self.earlier_wall_s = 0.0
        """Wall seconds of the sessions before this one, up to the checkpoint this one resumed."""
        self.sessions = 1

    @property
    def wall_s(self) -> float:
        """The run's wall seconds so far, start-up included, over all its sessions."""
        return self.earlier_wall_s + time.time() - self.session_start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the step began when the DataModule started making it (its rollouts), before this hook
        self._start = getattr(batch, "started", None) or time.perf_counter()
        if self.compiled:  # from the step's start: the rollout's compile (rollout.hf_compile) is not the step's
            from hacrl_lightning.compiling import compile_seconds

            self._compile_start = getattr(batch, "compile_started", None)
            if self._compile_start is None:
                self._compile_start = compile_seconds()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._start is not None:
            elapsed, compiling = time.perf_counter() - self._start, 0.0
            if self.compiled:
                from hacrl_lightning.compiling import compile_metrics

                metrics = compile_metrics()
                # at most the step: torch's timers of a first step with two agents summed to 66 s in a 59 s step
                compiling = min(metrics["time/compile"] - self._compile_start, elapsed)
                self.compile_s += compiling
                pl_module.report({**metrics, "time/compile": compiling})
            self.train_s += elapsed - compiling
            self.steps += 1
            self._start = None

    @property
    def step_s(self) -> float:
        """Mean wall seconds per training step (0.0 before the first step)."""
        return self.train_s / self.steps if self.steps else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"train_s": self.train_s, "steps": self.steps, "wall_s": self.wall_s, "started_at": self.started_at,
                "sessions": self.sessions, "compile_s": self.compile_s}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_s = float(state_dict["train_s"])
        self.steps = int(state_dict["steps"])
        self.earlier_wall_s = float(state_dict.get("wall_s", 0.0))  # checkpoints from before these fields: 0
        self.started_at = float(state_dict.get("started_at", self.session_start))
        self.sessions = int(state_dict.get("sessions", 1)) + 1
        self.compile_s = float(state_dict.get("compile_s", 0.0))
