"""Capability window callback: saves each agent's accuracy window in checkpoints and logs it.

`train()` builds one `CapabilityWindow` and hands it to both the module (which feeds it each step's
accuracy over the *global* batch, between scoring and advantages, docs/spec.md §7 step 4) and this
callback, which owns its persistence: it restores the window on resume and reports
`{agent}/capability` once per step. The math lives in `hacrl_lightning.algorithms.capability`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from hacrl_lightning.algorithms.capability import CapabilityWindow


class CapabilityCallback(Callback):
    def __init__(self, window: CapabilityWindow, agent_names: list[str]):
        if window.n_agents != len(agent_names):
            raise ValueError(f"a window of {window.n_agents} agents for {len(agent_names)} agent names")
        self.window = window
        self.agent_names = list(agent_names)

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
