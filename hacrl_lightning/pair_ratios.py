"""A pair's (or a group's) cross ratios before a run is spent on it, without training (`scripts/pair_ratios.py`):
every agent answers the run's first step's prompts as the run would, every other agent scores the answers, and the
sequence-level cross ratios are summarised per learner and source against the clip schedule's first bounds.

It reuses a run's pieces: the agents (`training.load_agents`), the DataModule's rollout (engines, rewards and the
exchange, `RolloutDataModule.rollout`), the old log-probs' pass (`update.score_own_rows`) and the records and shares
of the training's diagnostics (`cross_ratios.py`). Deliberately not here: the command line (the script), and any
update: no weight moves.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import torch

from hacrl_lightning.algorithms.losses import cross_clip_lower, log_ratio_from_means
from hacrl_lightning.cross_ratios import RatioRecords, shares
from hacrl_lightning.data.tasks import load_task
from hacrl_lightning.datamodule import StepBatchSampler
from hacrl_lightning.plan import MicroBatch, split_even
from hacrl_lightning.training import load_agents, make_datamodule, update_settings
from hacrl_lightning.update import score_own_rows

__all__ = ["QUANTILES", "pair_report", "score_pair"]

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
"""The quantiles of log s a report gives (beside its min and max)."""


def pair_report(names: Sequence[str], records: Mapping[str, RatioRecords], lower: float) -> dict[str, Any]:
    """Per learner and source: rows, quantiles of log s (`QUANTILES`, with min and max), and the shares below,
    inside and above [lower, 1] (`shares`), of every row and of the correct ones."""
    out: dict[str, Any] = {}
    for learner, rec in records.items():
        for j, source in enumerate(names):
            keep = rec.source == j
            if not bool(keep.any()):
                continue
            log_ratio = rec.log_ratio[keep].double()
            correct = rec.correct[keep]
            bounds = torch.full_like(log_ratio, lower)
            out.setdefault(learner, {})[source] = {
                "rows": int(keep.sum()), "correct": int(correct.sum()),
                "log_ratio": {"min": float(log_ratio.min()), "max": float(log_ratio.max()),
                              **{f"q{round(q * 100):02d}": float(torch.quantile(log_ratio, q)) for q in QUANTILES}},
                "shares": shares(log_ratio, bounds),
                "shares_correct": shares(log_ratio[correct], bounds[correct]),
            }
    return out


def score_pair(cfg: Any, *, agents: Optional[Mapping[str, Any]] = None, device: Optional[str] = None) -> dict[str, Any]:
    """A pair's (or a group's) cross ratios before any training (`scripts/pair_ratios.py`): every agent answers the
    run's first step's prompts (`data.prompts_per_step` of them, `rollout.group_size` times each, as the run would:
    the same engines, rewards and exchange, `RolloutDataModule.rollout`), each response is scored by its source
    and by every other agent in its own tokens (`update.score_own_rows`), and log s = the learner's mean log-prob
    minus the source's, as the first update of a run's first step sees it. The shares are against the bounds of
    the clip schedule's first mini-batch, [1 - delta, 1], the widest of the step (later ones are narrower).
    `cfg`: a `TrainConfig`; `agents`: its agents already loaded (default: loaded here, `training.load_agents`).
    Returns the report (`pair_report`, with the setting it ran) and the records."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    task = load_task(cfg.data)
    agents = dict(agents) if agents is not None else load_agents(cfg, task)
    if list(agents) != list(cfg.agents):
        raise ValueError(f"score_pair: agents {list(agents)} are not the config's {list(cfg.agents)}")
    for agent in agents.values():
        agent.model.to(device).eval()
    datamodule = make_datamodule(cfg, agents, task)
    datamodule.share_rollouts = True  # every learner's view holds every response, whatever the algorithm
    datamodule.setup("fit")
    try:
        sampler = StepBatchSampler(len(datamodule.train_set), cfg.data.prompts_per_step, 1, seed=cfg.seed)
        batch = datamodule.rollout([datamodule.train_set[i] for i in sampler.indices(0)], step=0)
    finally:
        datamodule.teardown()
    names, lower = list(agents), cross_clip_lower(0, cfg.algorithm.delta, cfg.algorithm.delta_step)
    means, old = {}, torch.zeros(batch.rewards.numel())                                 # [P·n·G] the sources'
    for name, view in batch.views.items():
        chunks = split_even(torch.arange(len(view)), math.ceil(len(view) / cfg.trainer.micro_batch_size))
        scores = score_own_rows(agents[name], view, [MicroBatch(rows, 1.0) for rows in chunks], device=device)
        means[name] = scores.mean                                                           # [B] in its own tokens
        old[view.row_idx[view.is_own]] = scores.mean[view.is_own]
    correct = batch.rewards.flatten() > 0                                                   # [P·n·G]
    records = {}
    for name, view in batch.views.items():
        partner = ~view.is_own
        rows = view.row_idx[partner]
        records[name] = RatioRecords.cat([RatioRecords(
            row=rows, source=view.source_idx[partner], log_ratio=log_ratio_from_means(means[name][partner], old[rows]),
            lower=torch.full((len(rows),), lower, dtype=torch.float32), correct=correct[rows])])
    mini_batch_size = update_settings(cfg).mini_batch_size
    count = math.ceil(max(len(view) for view in batch.views.values()) / mini_batch_size)
    report = {"agents": names, "prompts": len(batch.examples), "samples_per_prompt": batch.rewards.shape[-1],
              "data": cfg.data.name, "seed": cfg.seed,
              "bounds": {"lower": lower, "upper": 1.0,
                         "schedule": [cross_clip_lower(m, cfg.algorithm.delta, cfg.algorithm.delta_step)
                                      for m in range(count)]},
              "accuracy": {name: float(batch.rewards[:, j].gt(0).double().mean()) for j, name in enumerate(names)},
              "pairs": pair_report(names, records, lower)}
    return {"report": report, "records": records}
