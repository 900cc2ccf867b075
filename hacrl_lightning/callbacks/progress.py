"""Plain progress lines for a console that is not a terminal (`> log`, nohup, a scheduler's log file).

Lightning's progress bar redraws one line in place: on a terminal that is what a user wants, but
written to a file or a pipe it shows nothing until the run ends. When stdout is not a terminal the
run turns the bar off (`training.build_trainer`) and this callback prints, every
`trainer.progress_every` training steps (rank zero), one line flushed at once:

    step 3/150 | train reward (sampled): tiny_a 0.250  tiny_b 0.188 | 0.84 s/step

The reward is each agent's mean reward over its sampled training rollouts of that step
(`{agent}/reward` in TensorBoard); the step time is the mean wall time of the training steps since
the last line, evaluation excluded (`StepTimer`). Deliberately not here: held-out accuracy (greedy,
printed by `HeldOutEvalCallback` after each evaluation) and anything on a terminal (the bar).
"""

from __future__ import annotations

import sys

from lightning.pytorch import Callback

from hacrl_lightning.callbacks.timing import StepTimer


def interactive() -> bool:
    """Is stdout a terminal (then Lightning's progress bar shows progress, and this callback is not used)?"""
    return sys.stdout.isatty()


class PlainProgress(Callback):
    def __init__(self, *, every: int, steps: int, timer: StepTimer):
        self.every = every
        self.steps = steps
        self.timer = timer
        self._last = (0.0, 0)  # the timer's (train_s, steps) at the last line

    def on_train_start(self, trainer, pl_module) -> None:
        self._last = (self.timer.train_s, self.timer.steps)  # a resumed run's timer holds the earlier steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.steps_done
        if not self.every or (step % self.every and step != self.steps) or not trainer.is_global_zero:
            return
        metrics = pl_module.last_metrics
        rewards = "  ".join(f"{name} {metrics[f'{name}/reward']:.3f}" for name in pl_module.names)
        seconds, steps = self.timer.train_s - self._last[0], self.timer.steps - self._last[1]
        self._last = (self.timer.train_s, self.timer.steps)
        timing = f" | {seconds / steps:.2f} s/step" if steps else ""
        print(f"step {step}/{self.steps} | train reward (sampled): {rewards}{timing}", flush=True)
