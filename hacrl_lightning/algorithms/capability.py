"""Capability estimates and capability ratios (docs/spec.md §2-3; paper Eqs. 8-9).

Each agent's capability is the mean of its per-step accuracy over the last K steps, including the
current one (Eq. 9). The ratio matrix `omega[k, j] = clamp(cap[k] / cap[j], 0.1, 10)` (Eq. 8) weights
partner rewards in the learner's baseline (`advantages.py`) and, read as `omega[j, k]`, scales the
cross term of the loss (`losses.py`).

Deliberately not here: collecting rewards across ranks (every rank holds the whole step's rewards,
gathered by the DataModule, so the accuracy handed to `CapabilityWindow.update` is the global
batch's), persistence and logging (the capability callback does both).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

__all__ = ["CapabilityWindow", "capability_ratios", "step_accuracy"]

DEFAULT_CLAMP: Tuple[float, float] = (0.1, 10.0)


def step_accuracy(rewards: Tensor) -> Tensor:
    """Fraction of each source's responses with reward > 0 in this step (the P_τ of Eq. 9).

    rewards: [P, n, G] (prompt, source, sample). Returns [n]. Under data parallelism compute
    `(rewards > 0).sum((0, 2))` and the response count per rank, all-reduce both, then divide.
    """
    if rewards.ndim != 3:
        raise ValueError(f"rewards must have shape [P, n, G], got {tuple(rewards.shape)}")
    return (rewards > 0).to(torch.get_default_dtype()).mean(dim=(0, 2))  # [n]


def capability_ratios(cap: Tensor, clamp: Tuple[float, float] = DEFAULT_CLAMP) -> Tensor:
    """Capability ratio matrix, Eq. 8: `omega[k, j] = clamp(cap[k] / cap[j], lo, hi)`, diagonal 1.

    Row k is the learner, column j the source. `omega[k, j] > 1` when k is stronger than j.
    The cross-term factor of learner k on a response of source j is the transposed entry
    `omega[j, k]` (docs/spec.md §6). cap: [n], positive. Returns [n, n].
    """
    if cap.ndim != 1:
        raise ValueError(f"cap must have shape [n], got {tuple(cap.shape)}")
    if not bool(torch.isfinite(cap).all()) or bool((cap <= 0).any()):
        raise ValueError(f"capabilities must be finite and positive, got {cap.tolist()}")
    low, high = clamp
    omega = (cap[:, None] / cap[None, :]).clamp(low, high)  # [n, n]
    omega.fill_diagonal_(1.0)
    return omega


class CapabilityWindow:
    """The last `window` step accuracies of each agent, and the capabilities and ratios they give.

    - `cap_j = max(mean of agent j's last K accuracies, floor)`; before any update every cap is 1.
    - During the first `warmup_steps` updates `omega()` returns all ones (docs/spec.md §2).
    - State is plain Python (lists of floats), so `state_dict()` can go into any checkpoint.
    """

    def __init__(
        self,
        n_agents: int,
        *,
        window: int = 5,
        floor: float = 1e-8,
        warmup_steps: int = 0,
        clamp: Tuple[float, float] = DEFAULT_CLAMP,
    ) -> None:
        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if floor <= 0:
            raise ValueError(f"floor must be > 0, got {floor}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not 0 < clamp[0] <= 1 <= clamp[1]:
            raise ValueError(f"clamp must satisfy 0 < low <= 1 <= high, got {clamp}")
        self.n_agents = n_agents
        self.window = window
        self.floor = float(floor)
        self.warmup_steps = warmup_steps
        self.clamp = (float(clamp[0]), float(clamp[1]))
        self.steps = 0
        self.history: List[List[float]] = [[] for _ in range(n_agents)]

    def update(self, acc: Tensor) -> None:
        """Append this step's accuracy of every agent (acc: [n], in [0, 1]) and drop the oldest."""
        values = torch.as_tensor(acc, dtype=torch.float64).detach().cpu()
        if values.shape != (self.n_agents,):
            raise ValueError(f"acc must have shape [{self.n_agents}], got {tuple(values.shape)}")
        if not bool(torch.isfinite(values).all()) or bool((values < 0).any() or (values > 1).any()):
            raise ValueError(f"accuracies must lie in [0, 1], got {values.tolist()}")
        for agent, value in enumerate(values.tolist()):
            self.history[agent] = (self.history[agent] + [value])[-self.window :]
        self.steps += 1

    def capabilities(self) -> Tensor:
        """cap: [n]; 1 for an agent with no history yet, else the floored window mean (Eq. 9)."""
        caps = [max(sum(h) / len(h), self.floor) if h else 1.0 for h in self.history]
        return torch.tensor(caps, dtype=torch.get_default_dtype())

    def omega(self) -> Tensor:
        """omega: [n, n], `capability_ratios(capabilities())`, or ones while warming up."""
        if self.steps <= self.warmup_steps:
            return torch.ones(self.n_agents, self.n_agents)
        return capability_ratios(self.capabilities(), self.clamp)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "n_agents": self.n_agents,
            "window": self.window,
            "floor": self.floor,
            "warmup_steps": self.warmup_steps,
            "clamp": list(self.clamp),
            "steps": self.steps,
            "history": [list(h) for h in self.history],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore steps and history. The agent count and window must match this run's."""
        saved = (int(state["n_agents"]), int(state["window"]))
        if saved != (self.n_agents, self.window):
            raise ValueError(
                f"capability window state is for n_agents={saved[0]}, window={saved[1]}, but this run "
                f"has n_agents={self.n_agents}, window={self.window}: resume with the same agents and "
                "algorithm.capability_window"
            )
        self.steps = int(state["steps"])
        self.history = [[float(v) for v in h][-self.window :] for h in state["history"]]
