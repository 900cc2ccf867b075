"""Weight sync callback: after each training step, push every agent to its rollout engine.

Runs once per step, after all learners have stepped, so the next step's rollouts come from the new
weights (strictly on-policy). For the HF backend the engine holds the training module and the push
is a no-op; for vLLM it copies the weights. The time it takes is logged as `time/weight_sync`.
"""

from __future__ import annotations

import time
from typing import Mapping, Protocol

from lightning.pytorch import Callback

from hacrl_lightning.offload import Residency
from hacrl_lightning.rollout import RolloutEngine


class HasEngines(Protocol):
    """Who holds the run's rollout engines, by agent name, once set up (`datamodule.RolloutDataModule`)."""

    engines: Mapping[str, RolloutEngine]


class WeightSyncCallback(Callback):
    """source: the holder of the engines to push the weights to; residency: brings an offloaded agent's weights
    to the device for its push to an engine with weights of its own (`trainer.offload_idle`)."""

    def __init__(self, source: HasEngines, residency: Residency | None = None):
        self.source = source
        self.residency = residency or Residency(enabled=False)
        self.last_seconds = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        engines = self.source.engines
        start = time.perf_counter()
        for name, agent in pl_module.agents.items():
            if not getattr(engines[name], "holds_own_weights", False):
                engines[name].sync_weights(agent.model)  # it generates with the training model: nothing to move
                continue
            with self.residency.resident(name):
                engines[name].sync_weights(agent.model)
        self.last_seconds = time.perf_counter() - start
        pl_module.report({"time/weight_sync": self.last_seconds})
