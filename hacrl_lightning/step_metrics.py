"""A training step's scalars, from what the step holds: each agent's rewards, accuracy, lengths and omega over
the global batch, what each learner's view had to cut, the cross lower bounds the step's mini-batches used, and
how far the engine's log-probs were from the trainer's. Pure functions of their arguments (Python and tensors on
the CPU), named `<agent>/<metric>` as TensorBoard shows them.

Deliberately not here: reducing over ranks (the module sums a step's partial figures first, then calls these), the
loss's own metrics (`loss_stats.py`) and logging (`HACRLModule.report`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from hacrl_lightning.exchange import AgentView
from hacrl_lightning.step import StepBatch


def rollout_metrics(names: Sequence[str], data: StepBatch, acc: torch.Tensor, omega: torch.Tensor, *,
                    share_rollouts: bool) -> dict[str, float]:
    """Rewards, accuracy, lengths and omega of the global batch (every rank holds all of it). `acc`: [n] each
    agent's step accuracy; `omega`: [n, n], omega[i, j] the factor on learner j's cross term from source i."""
    metrics = {}
    for j, name in enumerate(names):
        own = [r for r in data.rollouts if r.source == name]
        lengths = [len(r.token_ids) for r in own]
        truncated = [r.finish_reason == "length" for r in own]
        metrics[f"{name}/reward"] = float(data.rewards[:, j].mean())
        metrics[f"{name}/acc"] = float(acc[j])
        metrics[f"{name}/resp_len"] = sum(lengths) / max(1, len(lengths))
        metrics[f"{name}/truncated_frac"] = sum(truncated) / max(1, len(truncated))
        metrics[f"{name}/degenerate/empty_frac"] = sum(not r.response for r in own) / max(1, len(own))
        for term in (own[0].reward_parts or {}) if own else ():  # a sum of rewards: each term (`data.rewards`)
            metrics[f"{name}/reward/{term}"] = sum(r.reward_parts[term] for r in own) / len(own)
        for i, partner in enumerate(names):
            if i != j and share_rollouts:
                metrics[f"{name}/omega/{partner}"] = float(omega[i, j])
    tokens = sum(len(r.token_ids) for r in data.rollouts)
    metrics["throughput/rollout_tokens_per_s"] = tokens / max(data.timings["rollout"], 1e-9)
    joint = data.rewards.flatten(1)                                                     # [P, n*G]
    metrics["rollout/equal_reward_frac"] = float((joint == joint[:, :1]).all(-1).float().mean())  # A = 0 there
    return metrics


def view_metrics(views: Mapping[str, AgentView]) -> dict[str, float]:
    """What each learner's view had to cut or could not represent (counts of rows, this step)."""
    metrics = {}
    for name, view in views.items():
        metrics[f"{name}/degenerate/prompt_truncated"] = float(view.prompt_truncated.sum())
        metrics[f"{name}/degenerate/response_truncated"] = float(view.response_truncated.sum())
        metrics[f"{name}/degenerate/unrepresentable"] = float(view.unrepresentable.sum())
    return metrics


def clip_metrics(lowers: Sequence[float], mini_batches: Mapping[str, int]) -> dict[str, float]:
    """The first and the last cross lower bound a mini-batch of this step trained with (`mini_batches`: every
    learner's count, from every group under `split`)."""
    used = max(mini_batches.values(), default=0)
    return {"clip/cross_lower_first": lowers[0], "clip/cross_lower_last": lowers[used - 1]} if used else {}


def mismatch_metrics(names: Sequence[str], sums: torch.Tensor, maxima: torch.Tensor) -> dict[str, float]:
    """Rollout/trainer mismatch per agent over the step's sampled tokens: mean and max of
    |log p_engine - log p_trainer| (as verl logs its rollout-probs difference), from `sums` [n, 2] (sum, count)
    and `maxima` [n], each already reduced over ranks. The engine's log-probs are processed (temperature applied)
    as the trainer's are; fp32 on CPU reads ~1e-6, a bf16 engine on GPU shows how far the sampler is from the
    policy. Agents whose engine reported none (count 0) are left out."""
    return {key: value for k, name in enumerate(names) if sums[k, 1] > 0
            for key, value in ((f"{name}/rollout/logp_diff_mean", float(sums[k, 0] / sums[k, 1])),
                               (f"{name}/rollout/logp_diff_max", float(maxima[k])))}
