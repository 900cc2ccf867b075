"""Training state that follows the phase (`trainer.offload_idle`): an idle agent's state lives in host memory.

An agent's training state is its weights (the fp32 master shards under FSDP2), their gradients, its AdamW
moments and its frozen KL reference. With `offload_idle` each part is on the accelerator only while a phase
of that agent needs it, and in host memory otherwise, as the paper authors' recipe does for its two policies
(docs/training.md#placement):

| phase (this agent's)                  | weights | AdamW moments | reference |
| rollout (transformers engine)         | device  | host          | host      |
| old log-probs                         | device  | host          | device    |
| update                                | device  | device        | host      |
| weight sync (vLLM engine)             | device  | host          | host      |
| held-out evaluation (transformers)    | device  | host          | host      |

Gradients are dropped once the agent's update is done (the next update starts from zero anyway). A move is
`Module.to` (FSDP2 re-registers its sharded parameters, the `Parameter` objects the optimizer holds stay the
same) and `Tensor.to` for the optimizer's state, so an update after a round trip is the same update; on a
CPU run host and device are one, and every move is an identity. `Residency.log` records the moves (tests
check the table above with it). Deliberately not here: which phase runs when (the module, the DataModule
and the weight-sync callback open `resident(...)` around their phases) and engine memory (`rollout.sleep`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

__all__ = ["Residency"]

HOST = torch.device("cpu")


class Residency:
    """Where each agent's training state is. `enabled`: `trainer.offload_idle` (off: every part stays where
    Lightning put it and `resident` does nothing). The module registers each agent's weights, reference and
    optimizer (`register`) and tells the device once it is known (`device`)."""

    def __init__(self, *, enabled: bool):
        self.enabled = enabled
        self.device: torch.device = HOST
        self.models: dict[str, nn.Module] = {}
        self.references: dict[str, nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.log: list[tuple[str, str, str]] = []
        """(where: "device"/"host", agent, part) of every move, in order."""

    def register(self, name: str, model: nn.Module, *, reference: Optional[nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        self.models[name] = model
        if reference is not None:
            self.references[name] = reference
        if optimizer is not None:
            self.optimizers[name] = optimizer

    def offload_all(self) -> None:
        """Every registered agent's state to the host (the run starts idle)."""
        if self.enabled:
            for name in self.models:
                self._move(name, ("weights", "optimizer", "reference"), "host")

    def restore_all(self) -> None:
        """Every agent's state back on the device (the end of training: exports and the summary read it)."""
        if self.enabled:
            for name in self.models:
                self._move(name, ("weights", "optimizer", "reference"), "device")

    @contextmanager
    def resident(self, name: str, *, optimizer: bool = False, reference: bool = False) -> Iterator[None]:
        """`name`'s weights (and its optimizer state, its reference) on the device for the phase inside; back on
        the host after it, the gradients dropped with the optimizer state."""
        if not self.enabled or name not in self.models:
            yield
            return
        parts = ("weights",) + (("optimizer",) if optimizer else ()) + (("reference",) if reference else ())
        self._move(name, parts, "device")
        try:
            yield
        finally:
            if optimizer and name in self.optimizers:
                self.optimizers[name].zero_grad(set_to_none=True)
            self._move(name, parts, "host")

    def _move(self, name: str, parts: tuple[str, ...], where: str) -> None:
        device = self.device if where == "device" else HOST
        for part in parts if where == "device" else reversed(parts):  # the weights first in, last out
            if part == "weights":
                self.models[name].to(device)
            elif part == "reference" and name in self.references:
                self.references[name].to(device)
            elif part == "optimizer" and name in self.optimizers:
                move_optimizer_state(self.optimizers[name], device)
            else:
                continue
            self.log.append((where, name, part))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every state tensor of `optimizer` to `device` (AdamW's `step` counters stay where AdamW keeps them)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.device != device:
                state[key] = value.to(device, non_blocking=True)
