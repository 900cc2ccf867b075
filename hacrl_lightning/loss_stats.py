"""LossStats: one step's loss metrics, reduced exactly over micro-batches and data-parallel ranks.

A learner's mini-batch is split into micro-batches and, under data parallelism, over ranks; the
metrics `hacpo_loss` returns per micro-batch are reduced here into the step's figures, the same on
1 rank or 8: a rate (clip fraction, mean ratio, mean omega) is the mean over the responses (or
tokens) it describes, weighted by their count (a no-gradient fraction of correct or wrong responses,
`diag/*_nograd_frac_{correct,wrong}`, by the count of those, `count/*_{correct,wrong}`); `_min`/`_max` reduce by min/max; counts add up; a
loss is the mean over the learner's mini-batches of the mini-batch loss (the sum of its micro-batch
and rank parts). It is a torchmetrics `Metric` with fixed-size states (one slot per agent and metric
name), so torchmetrics syncs it across ranks in `compute()`.

Deliberately not here: rollout statistics (reward, accuracy, lengths, capability). Every rank
holds the whole step's rollouts (the DataModule gathers them for the global plan), so those are
global by construction and need no reduction.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torchmetrics import Metric

from hacrl_lightning.algorithms.objective import ANSWERS, METRIC_NAMES


def _kind(name: str) -> str:
    if name.startswith(("loss/", "count/")):
        return "sum"
    if name.endswith(("_min", "_max")):
        return name[-3:]
    return "mean"


class LossStats(Metric):
    """`update(agent, metrics, own_weight=None)` per micro-batch; `compute(mini_batches)` once per step
    (a collective under data parallelism: every rank calls it), then `reset()`."""

    full_state_update = False

    def __init__(self, agents: Sequence[str]):
        super().__init__(sync_on_compute=True, compute_with_cache=False)
        self.keys = [f"{agent}/{name}" for agent in agents for name in METRIC_NAMES]
        self.index = {key: i for i, key in enumerate(self.keys)}
        self.kinds = [_kind(key.split("/", 1)[1]) for key in self.keys]
        size = len(self.keys)
        self.add_state("total", torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("low", torch.full((size,), float("inf"), dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("high", torch.full((size,), float("-inf"), dtype=torch.float64), dist_reduce_fx="max")

    def update(self, agent: str, metrics: Mapping[str, torch.Tensor], own_weight: float | None = None) -> None:
        """One micro-batch's `hacpo_loss` metrics of `agent`; `own_weight` counts the tokens own-response
        rates were taken over (token-level ratios), else they are per own response (`count/self`)."""
        weights = {"self": float(metrics["count/self"] if own_weight is None else own_weight),
                   "cross": float(metrics["count/cross"])}
        size = len(self.keys)
        total, weight = torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64)
        low = torch.full((size,), float("inf"), dtype=torch.float64)
        high = torch.full((size,), float("-inf"), dtype=torch.float64)
        for name, value in metrics.items():  # built on the CPU, added to the states in one go (no per-key sync)
            i = self.index[f"{agent}/{name}"]
            value = float(value)
            kind = self.kinds[i]
            if kind == "mean":
                part = "cross" if "cross" in name else "self"
                answer = name.rsplit("_", 1)[-1]
                weight[i] = float(metrics[f"count/{part}_{answer}"]) if answer in ANSWERS else weights[part]
                total[i] = value * weight[i]
            else:
                weight[i] = 1.0
                if kind == "min":
                    low[i] = value
                elif kind == "max":
                    high[i] = value
                else:
                    total[i] = value
        device = self.total.device
        self.total += total.to(device)
        self.weight += weight.to(device)
        self.low = torch.minimum(self.low, low.to(device))
        self.high = torch.maximum(self.high, high.to(device))

    def compute(self, mini_batches: Mapping[str, int] | None = None) -> dict[str, float]:
        """The step's metrics over every rank: keys no rank reported are left out. `mini_batches[agent]`
        divides that agent's summed losses into the mean over its mini-batches."""
        out = {}
        for i, key in enumerate(self.keys):
            weight = float(self.weight[i])
            if weight == 0:
                continue
            kind = self.kinds[i]
            agent = key.split("/", 1)[0]
            if kind == "min":
                out[key] = float(self.low[i])
            elif kind == "max":
                out[key] = float(self.high[i])
            elif kind == "mean":
                out[key] = float(self.total[i]) / weight
            elif key.startswith(f"{agent}/loss/"):
                out[key] = float(self.total[i]) / max(1, (mini_batches or {}).get(agent, 1))
            else:
                out[key] = float(self.total[i])
        return out
