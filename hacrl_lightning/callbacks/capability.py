"""Capability window callback: the one owner of each agent's accuracy window (docs/spec.md §2-3).

At `on_train_batch_start`, before the module trains on the step, it adds the step's accuracy over the
*global* batch (`step_accuracy` of the `StepBatch`'s rewards, phase 5 of docs/spec.md §7) to its window and
hands the step's omega forward on the batch (`StepBatch.omega`); the module reads it there and never calls
back. Its state is its own `state_dict` (Lightning checkpoints it; a resumed run continues the window),
and it reports `{agent}/capability` once per step. The math lives in `hacrl_lightning.algorithms.capability`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.capability import CapabilityWindow, step_accuracy
from hacrl_lightning.step import StepBatch


class CapabilityCallback(Callback):
    def __init__(self, window: CapabilityWindow, agent_names: list[str]):
        if window.n_agents != len(agent_names):
            raise ValueError(f"a window of {window.n_agents} agents for {len(agent_names)} agent names")
        self.window = window
        self.agent_names = list(agent_names)

    def on_train_batch_start(self, trainer, pl_module, batch: StepBatch, batch_idx) -> None:
        self.window.update(step_accuracy(batch.rewards))                                    # [n]
        batch.omega = self.window.omega()                                                   # [n, n]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        caps = self.window.capabilities().tolist()
        pl_module.report({f"{name}/capability": cap for name, cap in zip(self.agent_names, caps)})

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window.state_dict(), "agents": self.agent_names}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["agents"] != self.agent_names:
            raise ValueError(f"the checkpoint's agents {state_dict['agents']} differ from this run's "
                             f"{self.agent_names}: resume with the same agents, in the same order")
        self.window.load_state_dict(state_dict["window"])
