"""Where partners' rows sit against the stepwise bounds: the sequence-level cross ratio of every partner row a
learner trains on, per learner and source, beside the bounds [lower_m, 1] of the mini-batch it trains in.

HACPO's cross term clamps s = π_learner(y) / π_source(y) (length-normalised, docs/spec.md §6) to [lower_m, 1], so a
row with s < lower_m (`below`) or s > 1 (`above`) carries no gradient; `{agent}/diag/cross_nograd_frac_*` counts
them, this shows the ratios themselves. `CrossRatioLog` records, on the steps the diagnostics run
(`trainer.diagnostics_every`), each update pass's partner rows (`add`: their log s as the loss computes it, kept on
the device), and at the step's end (`end_step`) moves them to the host in one copy, gathers every rank's (and every
group's, under `split`), writes TensorBoard histograms and returns the step's shares below, inside and above the
bounds as `{learner}/diag/cross_ratio/{source}/*` scalars (summary.json: their mean over the diagnostics steps).
Algorithms that share rollouts without HACPO's clamp (naive, hacpo_no_clip) log the same against bounds they do not
clamp to.
`pair_ratios.score_pair` measures the same ratios before any run, without training (`scripts/pair_ratios.py`).

Deliberately not here: the ratio's math and the clamp (`algorithms/`: this records the value `hacpo_loss` clamps,
recomputed from its own inputs), the clip schedule (`callbacks/clip_schedule.py`), the loss's metrics
(`loss_stats.py`) and which step is a diagnostics step beyond `trainer.diagnostics_every` (the same steps as the
gradient share, `grad_share.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor

from hacrl_lightning.algorithms import sequence_mean_logp
from hacrl_lightning.algorithms.losses import log_ratio_from_means

__all__ = ["POSITIONS", "CrossRatioLog", "RatioRecords", "positions", "ratio_metrics", "shares", "write_histograms"]

POSITIONS = ("below", "inside", "above")
"""A row's place against its mini-batch's bounds: s < lower_m, lower_m <= s <= 1, s > 1 (HACPO clamps outside)."""


@dataclass(frozen=True)
class RatioRecords:
    """One learner's partner rows of one step, on the host (N rows, sorted by `row`)."""

    row: Tensor        # [N] long  the row's place in the step's flat (prompt, source, sample) order
    source: Tensor     # [N] long  the source's index among the run's agents
    log_ratio: Tensor  # [N] float32  log s, as `hacpo_loss` computed it (clamped at ±MAX_ABS_LOG_RATIO)
    lower: Tensor      # [N] float32  lower_m of the mini-batch the row trained in
    correct: Tensor    # [N] bool  reward > 0

    def where(self, keep: Tensor) -> "RatioRecords":
        return RatioRecords(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})

    @staticmethod
    def cat(parts: Sequence["RatioRecords"]) -> "RatioRecords":
        """The rows of `parts` together, sorted by `row` (the same order on 1 rank or 8)."""
        whole = RatioRecords(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(RatioRecords)})
        return whole.where(torch.argsort(whole.row, stable=True))


def positions(log_ratio: Tensor, lower: Tensor) -> Tensor:
    """[N] long: 0 below (s < lower), 1 inside, 2 above (s > 1); s = exp(log_ratio) compared as the clamp does
    (in the ratio's float32, `objective._hacpo_cross`). log_ratio, lower: [N]."""
    ratio = log_ratio.float().exp()
    lower = lower.to(ratio.dtype)
    return torch.where(ratio < lower, 0, torch.where(ratio > 1.0, 2, 1))


def shares(log_ratio: Tensor, lower: Tensor) -> dict[str, float]:
    """The share of rows below, inside and above their bounds (`POSITIONS`); empty without rows."""
    if not len(log_ratio):
        return {}
    counts = torch.bincount(positions(log_ratio, lower), minlength=3).double() / len(log_ratio)
    return dict(zip(POSITIONS, counts.tolist()))


def ratio_metrics(names: Sequence[str], records: Mapping[str, RatioRecords]) -> dict[str, float]:
    """`{learner}/diag/cross_ratio/{source}/{below,inside,above}` over a step's partner rows from that source, and
    `..._correct` over its correct ones (the rows behind `diag/cross_nograd_frac_correct`)."""
    metrics = {}
    for learner, rec in records.items():
        for j, source in enumerate(names):
            for suffix, keep in (("", rec.source == j), ("_correct", (rec.source == j) & rec.correct)):
                for position, share in shares(rec.log_ratio[keep], rec.lower[keep]).items():
                    metrics[f"{learner}/diag/cross_ratio/{source}/{position}{suffix}"] = share
    return metrics


def write_histograms(loggers: Sequence[Any], names: Sequence[str], records: Mapping[str, RatioRecords],
                     step: int) -> None:
    """TensorBoard histograms at `step`: `ratios/{learner}/from_{source}` of log s (natural log; the upper bound
    is 0), `.../correct` of the correct rows' log s, `.../log_lower` of each row's log lower_m."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in loggers:
        if not isinstance(logger, TensorBoardLogger):
            continue
        for learner, rec in records.items():
            for j, source in enumerate(names):
                keep = rec.source == j
                if not bool(keep.any()):
                    continue
                tag = f"ratios/{learner}/from_{source}"
                logger.experiment.add_histogram(tag, rec.log_ratio[keep].double().numpy(), step)
                if bool((keep & rec.correct).any()):
                    logger.experiment.add_histogram(f"{tag}/correct", rec.log_ratio[keep & rec.correct].double().numpy(),
                                                    step)
                logger.experiment.add_histogram(f"{tag}/log_lower", rec.lower[keep].double().log().numpy(), step)


class CrossRatioLog:
    """The update loop's partner rows on diagnostics steps. `add` once per update pass (no value leaves the
    device), `end_step` once per step on every rank (a collective under data parallelism)."""

    def __init__(self, names: Sequence[str], *, every: int):
        self.names = list(names)
        self.every = every
        """`trainer.diagnostics_every` (0: never, as for an algorithm whose learners train on their own rows only)."""
        self._parts: list[tuple[str, Tensor, Tensor, Tensor, float, Tensor, Tensor]] = []
        self.last: dict[str, RatioRecords] = {}
        """The last diagnostics step's records of every learner, gathered over ranks (host tensors)."""

    def measures(self, step: int) -> bool:
        """Whether training step `step` (0-based) records: the every-th, counting from 1, as the gradient share."""
        return self.every > 0 and (step + 1) % self.every == 0

    def add(self, learner: str, step: int, micro_batch: Any, view: Any, inputs: Mapping[str, Any],
            part: Optional[str] = None) -> None:
        """One update pass of `learner` (`micro_batch`: its `plan.MicroBatch`; `view`: the learner's whole
        `AgentView`, on the host; `inputs`: `update.loss_inputs`' keywords for the pass). Skips other steps, the
        gradient-share passes (`part`) and zero-weight passes. Its log s is `hacpo_loss`'s own, from the same
        inputs; it stays on the device until `end_step`."""
        if part is not None or not micro_batch.counts or not self.measures(step):
            return
        rows = micro_batch.rows
        new_mean = sequence_mean_logp(inputs["logp_new"].detach(), inputs["loss_mask"])       # [b]
        log_ratio = log_ratio_from_means(new_mean, inputs["old_logp_mean"])                    # [b]
        partner = ~view.is_own[rows] & view.loss_mask[rows].any(-1)                           # [b] host
        self._parts.append((learner, view.row_idx[rows], view.source_idx[rows], partner, float(inputs["cross_lower"]),
                            log_ratio.float(), inputs["rewards"] > 0))

    def end_step(self, module: Any, step: int) -> dict[str, float]:
        """Training step `step`'s records, gathered over every rank and kept in `last`; on the first rank, their
        histograms written at the step's logging step (the module's steps done, the scalars' axis). Returns the
        step's shares (`ratio_metrics`), {} on a step that records nothing."""
        if not self.measures(step):
            return {}
        self.last = self._gather(self._host())
        if module.trainer.is_global_zero:
            write_histograms(module.loggers, self.names, self.last, module.steps_done)
        return ratio_metrics(self.names, self.last)

    def _host(self) -> dict[str, list[RatioRecords]]:
        """This rank's records on the host: one copy of every pass's device values."""
        parts, self._parts = self._parts, []
        if not parts:
            return {}
        values = torch.cat([torch.stack([log_ratio, correct.to(log_ratio.dtype)]) for *_, log_ratio, correct in parts],
                           dim=1).cpu()                                                        # [2, rows]
        out: dict[str, list[RatioRecords]] = {}
        start = 0
        for learner, row, source, partner, lower, log_ratio, _ in parts:
            stop = start + len(row)
            rec = RatioRecords(row=row, source=source, log_ratio=values[0, start:stop],
                               lower=torch.full((len(row),), lower, dtype=torch.float32), correct=values[1, start:stop] > 0)
            out.setdefault(learner, []).append(rec.where(partner))
            start = stop
        return out

    def _gather(self, mine: dict[str, list[RatioRecords]]) -> dict[str, RatioRecords]:
        """Every rank's records (under `split` each learner's come from its own group's ranks), merged per learner."""
        shares_ = [mine]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            shares_ = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(shares_, mine)
        merged: dict[str, list[RatioRecords]] = {}
        for share in shares_:
            for learner, parts in share.items():
                merged.setdefault(learner, []).extend(parts)
        return {learner: RatioRecords.cat(merged[learner]) for learner in self.names if learner in merged}
