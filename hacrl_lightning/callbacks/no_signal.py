"""NoSignalWarning: says when an agent has had nothing to learn from for several steps in a row.

When every reward an agent's responses earned in a step is the same value (all 0: it never writes the answer
format the reward reads; all 1: the task is too easy), its group-relative advantages are all zero and its own
responses carry no gradient. After `trainer.no_signal_steps` such steps in a row the run warns once (until the
agent's rewards differ again), naming the agent, the value and what usually fixes it, and the summary lists each
such stretch (`no_signal`). Deliberately not here: stopping the run (a partner may still teach it) and anything
about the partners' responses (their gradient share is `{agent}/diag/cross_grad_share`).
"""

from __future__ import annotations

import warnings
from typing import Any

from lightning.pytorch import Callback


def no_signal_message(name: str, value: float, steps: int) -> str:
    """The warning for agent `name` whose every reward was `value` in `steps` steps in a row."""
    if value <= 0:
        hint = ("its answers may lack the form the reward reads (a final \\boxed{}: see evaluate.py "
                "save_responses=true), worked examples in front of each question may show it (data.few_shot=2), or "
                f"its answers may be cut short (agents.{name}.max_response_len)")
    else:
        hint = "the task may be too easy for it: harder problems (data settings) give it something to learn"
    return (f"agent {name!r}: every reward of its responses was {value:g} in the last {steps} steps: its own "
            f"responses carry no learning signal (all advantages 0). Usually: {hint}")


class NoSignalWarning(Callback):
    """names: every agent of the run, in config order (the rewards' second axis); steps: the streak that warns
    (`trainer.no_signal_steps`, 0: never)."""

    def __init__(self, names: list[str], *, steps: int):
        self.names = list(names)
        self.steps = steps
        self.streaks: dict[str, dict[str, Any]] = {}
        """Per agent: the current streak of equal-reward steps (`value`, `start` step, `length`)."""
        self.stretches: list[dict[str, Any]] = []
        """Every streak that reached `steps`: agent, value, first and last step (1-based), for the summary."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.steps:
            return
        step = pl_module.steps_done                                                # 1-based: this step's number
        rewards = batch.rewards                                                    # [P, n, G]
        for j, name in enumerate(self.names):
            mine = rewards[:, j]
            low, high = float(mine.min()), float(mine.max())
            streak = self.streaks.get(name)
            if low != high:
                self.streaks.pop(name, None)
                continue
            if streak is None or streak["value"] != low:
                streak = self.streaks[name] = {"value": low, "start": step, "length": 0, "stretch": None}
            streak["length"] += 1
            if streak["length"] == self.steps:  # once per streak
                streak["stretch"] = len(self.stretches)
                self.stretches.append({"agent": name, "value": low, "first_step": streak["start"], "last_step": step})
                if trainer.is_global_zero:
                    warnings.warn(no_signal_message(name, low, self.steps), UserWarning, stacklevel=1)
            elif streak["stretch"] is not None:
                self.stretches[streak["stretch"]]["last_step"] = step

    def state_dict(self) -> dict[str, Any]:
        return {"streaks": self.streaks, "stretches": self.stretches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.streaks = dict(state_dict.get("streaks", {}))
        self.stretches = list(state_dict.get("stretches", []))
