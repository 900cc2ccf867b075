"""The global plan of one training step: each learner's mini-batches, their order and index m, and each rank's share.

docs/spec.md §6-7: a learner trains on its own responses first, then each partner's in agent order,
split into mini-batches of `mini_batch_size` responses; m is the index of the mini-batch (the
stepwise clip reads it). All of that is a property of the *global* batch: every rank holds the
whole step's rollouts (the DataModule gathers them), builds the same plan from the same seed, and
trains on its slice of every mini-batch. So the number of updates, the m sequence and the members
of each mini-batch are the same on 1 rank or 8 (docs/training.md, "The global step plan").

The plan also hands out each rank's passes (`StepPlan.passes`, `StepPlan.passes_where`): the rows of
one forward/backward pass, its weight and the pass count the loss normalises by. Given each row's length
(`lengths`), a rank's rows of a mini-batch run longest first, so rows of like length share a pass and pad
less (never across mini-batches: their order is the stepwise clip's; the loss of a mini-batch is normalised
by its global counts, so which of its rows share a pass changes only the float summation order), and
`padding` says what share of the tokens the passes compute is padding. With a token budget (`tokens`,
`trainer.micro_batch_tokens`) a pass also holds at most that many padded tokens: short rows share a pass,
long ones run with fewer, and every rank still runs as many passes per mini-batch (the most any rank needs). Under FSDP every
forward pass is a collective, so every rank must run the same number of passes for each mini-batch
even when the slices differ by a row: a shorter rank's list ends with zero-weight passes over a
stand-in row, which keep the ranks in step and add nothing to the loss or the gradients
(docs/training.md). The old log-probs, the update and the gradient-share diagnostic all run the
plan's passes.

Deliberately not here: forward passes, losses and optimizer steps (the module and `update.py`), and which
rows a learner sees (the exchange builds its view).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from hacrl_lightning.algorithms import select_cross_samples

__all__ = ["MicroBatch", "StepPlan", "learner_order", "split_even"]


@dataclass(frozen=True)
class MicroBatch:
    """The view rows of one forward/backward pass and its weight: 1.0, or 0.0 for a zero-weight pass
    that only keeps this rank in step with the others (its rows are a stand-in). `passes`: the
    mini-batch's pass count over every rank that the loss normalises by (this rank's passes with rows,
    at least 1, times the ranks: the paper code's KL mean over micro-batches)."""

    rows: Tensor
    weight: float
    passes: int = 1

    @property
    def counts(self) -> bool:
        """Whether the pass's loss and metrics count (False: a zero-weight pass)."""
        return self.weight != 0.0


def learner_order(is_own: Tensor, source_idx: Tensor, prompt_idx: Tensor, *, learner: int,
                  cross_cap: Optional[int], generator: torch.Generator, partners_first: bool = False) -> Tensor:
    """Row order of one learner's view: own rows first, then partners' in agent order (docs/spec.md §6
    Decision), each part shuffled with `generator`; with `cross_cap`, at most that many partner rows
    per prompt (`select_cross_samples`); `partners_first`: the partners' rows first, then its own (the paper
    code's second learner, `algorithm.learner_order=paper_main`, docs/spec.md §11). is_own, source_idx,
    prompt_idx: [B]. Returns row indices [R]."""
    own = torch.nonzero(is_own).flatten()
    cross_mask = ~is_own
    if cross_cap is not None:
        cross_mask = cross_mask & select_cross_samples(source_idx, prompt_idx, learner=learner,
                                                       per_prompt=cross_cap, generator=generator)
    cross = torch.nonzero(cross_mask).flatten()
    own = own[torch.randperm(len(own), generator=generator)]
    cross = cross[torch.randperm(len(cross), generator=generator)]
    cross = cross[torch.argsort(source_idx[cross], stable=True)]  # partners in agent order
    return torch.cat([cross, own] if partners_first else [own, cross])


def split_even(rows: Tensor, parts: int) -> list[Tensor]:
    """`rows` in `parts` contiguous pieces whose sizes differ by at most one (the first ones larger)."""
    return list(torch.tensor_split(rows, parts))


@dataclass(frozen=True)
class StepPlan:
    """One learner's mini-batches over the global batch (`mini_batches[m]`: global row indices, in
    training order), seen from `rank` of `world` data-parallel ranks."""

    mini_batches: tuple[Tensor, ...]
    rank: int = 0
    world: int = 1
    lengths: Optional[Tensor] = None
    """[B] each view row's tokens (its attention mask's sum: a pass computes its longest row's width), or None."""
    by_length: bool = True
    """With `lengths`: each rank's rows of a mini-batch (of the old log-probs' pass: all of them) run longest first.
    Off where which rows share a pass is part of the loss (the paper code's KL mean per pass)."""
    tokens: int = 0
    """> 0 (`trainer.micro_batch_tokens`, needs `lengths`): a pass also holds at most this many tokens, counted
    padded (its rows x its longest row); a row longer than that runs alone. 0: passes by row count only."""

    @classmethod
    def build(cls, order: Tensor, *, mini_batch_size: int, rank: int = 0, world: int = 1,
              lengths: Optional[Tensor] = None, by_length: bool = True, tokens: int = 0) -> "StepPlan":
        if mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in [0, {world})")
        if tokens and lengths is None:
            raise ValueError("a token budget per pass (tokens > 0) needs the rows' lengths")
        return cls(tuple(order.split(mini_batch_size)), rank, world, lengths, by_length, tokens)

    def __len__(self) -> int:
        return len(self.mini_batches)

    @property
    def rows(self) -> Tensor:
        """Every row the learner trains on this step, in order (all ranks)."""
        return torch.cat(self.mini_batches) if self.mini_batches else torch.zeros(0, dtype=torch.long)

    def share(self, m: int, rank: Optional[int] = None) -> Tensor:
        """The rows of mini-batch m that `rank` (default: this rank) trains on."""
        return split_even(self.mini_batches[m], self.world)[self.rank if rank is None else rank]

    def _pieces(self, rows: Tensor, size: int) -> list[Tensor]:
        """`rows` (one rank's) in passes of at most `size` rows, longest first where `by_length`, and of at most
        `tokens` padded tokens where set (consecutive rows, a pass closed when the next row would pass either)."""
        if self.lengths is not None and self.by_length and len(rows) > 1:
            rows = rows[torch.argsort(self.lengths[rows], descending=True, stable=True)]
        if not self.tokens:
            return list(rows.split(size))
        sizes, count, longest = [], 0, 0
        for length in self.lengths[rows].tolist():
            if count and (count == size or (count + 1) * max(longest, length) > self.tokens):
                sizes, count, longest = sizes + [count], 0, 0
            count, longest = count + 1, max(longest, length)
        return list(rows.split(sizes + [count])) if count else []

    def micro_batches(self, m: int, size: int) -> list[Tensor]:
        """This rank's share of mini-batch m in micro-batches of at most `size` rows; every rank gets
        the same number of them (a shorter share ends with empty ones)."""
        count = max(len(self._pieces(self.share(m, rank), size)) for rank in range(self.world))
        pieces = self._pieces(self.share(m), size)
        return pieces + [self.mini_batches[m][:0]] * (count - len(pieces))

    def passes(self, m: int, size: int) -> list[MicroBatch]:
        """This rank's passes over its share of mini-batch m, `size` rows at most each (`micro_batches`): a
        piece with rows weighs 1, an empty one is a pass of weight 0 over the mini-batch's first row."""
        pieces = self.micro_batches(m, size)
        passes = max(1, sum(1 for rows in pieces if len(rows))) * self.world
        stand_in = self.mini_batches[m][:1]
        return [MicroBatch(rows, 1.0, passes) if len(rows) else MicroBatch(stand_in, 0.0, passes) for rows in pieces]

    def rows_where(self, mask: Tensor, rank: Optional[int] = None) -> Tensor:
        """The rows of all mini-batches that `rank` trains on and where `mask` [B] is True, in order."""
        shares = [self.share(m, rank) for m in range(len(self))]
        rows = torch.cat(shares) if shares else torch.zeros(0, dtype=torch.long)
        return rows[mask[rows]]

    def micro_batches_where(self, mask: Tensor, size: int) -> list[Tensor]:
        """`rows_where(mask)` of this rank in micro-batches of at most `size`; as many on every rank. No update
        runs between them, so with `by_length` they are ordered by length over all mini-batches."""
        most = max(len(self._pieces(self.rows_where(mask, rank), size)) for rank in range(self.world))
        pieces = self._pieces(self.rows_where(mask), size)
        return pieces + [mask.new_zeros(0, dtype=torch.long)] * (most - len(pieces))

    def passes_where(self, mask: Tensor, size: int) -> list[MicroBatch]:
        """This rank's passes over `rows_where(mask)` (`micro_batches_where`), an empty piece a pass of weight 0
        over the view's first row where `mask` holds (the old log-probs' passes over a source's own rows)."""
        stand_in = torch.nonzero(mask).flatten()[:1]
        return [MicroBatch(rows, 1.0) if len(rows) else MicroBatch(stand_in, 0.0)
                for rows in self.micro_batches_where(mask, size)]

    def padding(self, size: int, mask: Optional[Tensor] = None) -> tuple[int, int]:
        """(real tokens, tokens computed) of every rank's passes with rows: the update's (`passes`), or with `mask`
        the old log-probs' (`passes_where`). A pass computes rows x its longest row's tokens. Needs `lengths`."""
        if self.lengths is None:
            raise ValueError("StepPlan.padding needs the rows' lengths: build the plan with lengths=")
        if mask is None:
            pieces = [rows for m in range(len(self)) for rank in range(self.world)
                      for rows in self._pieces(self.share(m, rank), size)]
        else:
            pieces = [rows for rank in range(self.world) for rows in self._pieces(self.rows_where(mask, rank), size)]
        lengths = [self.lengths[rows] for rows in pieces if len(rows)]
        return int(sum(int(t.sum()) for t in lengths)), int(sum(len(t) * int(t.max()) for t in lengths))
