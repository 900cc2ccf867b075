"""Capability window callback: owns each agent's accuracy window, saves it in checkpoints, logs it.

The module feeds it this step's accuracy over the *global* batch (all ranks) between scoring and
advantages (HACPO_SPEC §7 step 4) through `pl_module.capability`; this callback only holds the
window, restores it on resume and logs `{agent}/capability`. The math lives in
`hacrl_lightning.algorithms.capability`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.capability import CapabilityWindow
from hacrl_lightning.config import AlgorithmConfig


class CapabilityCallback(Callback):
    def __init__(self, agent_names: list[str], cfg: AlgorithmConfig):
        self.agent_names = list(agent_names)
        self.window = CapabilityWindow.from_config(len(agent_names), cfg)

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.capability = self.window

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        caps = self.window.capabilities().tolist()
        pl_module.step_metrics.update({f"{name}/capability": cap for name, cap in zip(self.agent_names, caps)})

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window.state_dict(), "agents": self.agent_names}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["agents"] != self.agent_names:
            raise ValueError(f"the checkpoint's agents {state_dict['agents']} differ from this run's "
                             f"{self.agent_names}: resume with the same agents, in the same order")
        self.window.load_state_dict(state_dict["window"])
