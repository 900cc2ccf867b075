"""Capability window callback: the one owner of each agent's accuracy window (docs/spec.md §2-3).

At `on_train_batch_start`, before the module trains on the step, it adds the step's accuracy over the
*global* batch (`step_accuracy` of the `StepBatch`'s rewards, phase 5 of docs/spec.md §7) to its window and
hands the step's omega forward on the batch (`StepBatch.omega`); the module reads it there and never calls
back. Its state is its own `state_dict` (Lightning checkpoints it; a resumed run continues the window),
kept per agent by name, with the step from which each agent is in the run (`joined`) and at which each dropped
one left (`left`): a resume with another agent set (`resume_agents=change`) continues each kept agent's window
and starts a new agent's empty, so its first step's accuracy is its capability (docs/spec.md §2). It reports
`{agent}/capability` once per step, and in a session whose agent set changed, each agent's
`{agent}/present_from_step` (and a dropped one's `{agent}/left_at_step`) at its start. The math lives in
`hacrl_lightning.algorithms.capability`.
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
        self.joined = {name: 0 for name in self.agent_names}
        """The step (steps done) from which each agent is in the run: 0, or the step at which a resume added it."""
        self.left: dict[str, int] = {}
        """The step at which a resume dropped each agent no longer in the run."""
        self._changed = False

    def on_train_batch_start(self, trainer, pl_module, batch: StepBatch, batch_idx) -> None:
        self.window.update(step_accuracy(batch.rewards))                                    # [n]
        batch.omega = self.window.omega()                                                   # [n, n]

    def on_train_start(self, trainer, pl_module) -> None:
        if self._changed:  # the session that added or dropped agents says from when each is in the run
            pl_module.report({**{f"{name}/present_from_step": float(step) for name, step in self.joined.items()},
                              **{f"{name}/left_at_step": float(step) for name, step in self.left.items()}},
                             step=pl_module.steps_done)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        caps = self.window.capabilities().tolist()
        pl_module.report({f"{name}/capability": cap for name, cap in zip(self.agent_names, caps)})

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window.state_dict(), "agents": self.agent_names, "joined": self.joined,
                "left": self.left}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The saved window; for another agent set (`training.train` has checked that `resume_agents=change`
        allows it) each kept agent's history by name, a new agent's empty (it joins at the saved step)."""
        saved, window = list(state_dict["agents"]), dict(state_dict["window"])
        joined, left = state_dict.get("joined", {name: 0 for name in saved}), dict(state_dict.get("left", {}))
        if saved != self.agent_names:
            step = int(window["steps"])
            history = dict(zip(saved, window["history"]))
            window.update(n_agents=len(self.agent_names), history=[history.get(name, []) for name in self.agent_names])
            left.update({name: step for name in saved if name not in self.agent_names})
            joined = {name: joined[name] if name in saved else step for name in self.agent_names}
            self._changed = True
        self.window.load_state_dict(window)
        self.joined = {name: int(step) for name, step in joined.items()}
        self.left = {name: int(step) for name, step in left.items() if name not in self.joined}
