"""The parts of a learner's update that hold no state: the micro-batches a rank runs, a micro-batch's
loss inputs, and the gradient norm.

`micro_batches` owns the zero-weight rule. Under FSDP every forward pass is a collective, so every
rank runs as many micro-batches as the rank with the most rows (`plan.StepPlan` pads a shorter
share with empty ones); an empty one runs over a stand-in row with weight 0, which keeps the ranks
in step and adds nothing to the loss or the gradients (docs/training.md). The old log-probs, the
update and the gradient-share diagnostic (`grad_share.py`) all run their passes through it.
`LearnerTables` holds a learner's per-row inputs of one step (advantages, old and reference
log-probs, omega, rewards), `loss_inputs` turns a micro-batch of them into `hacpo_loss`'s keyword
arguments (besides the algorithm's `loss_settings()`), and `total_grad_norm` is the clip's utility,
global over ranks under FSDP.
Deliberately not here: forward passes, backward passes and optimizer steps (the module), the loss
itself (`algorithms/`) and the plan of mini-batches (`plan.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import Tensor

from hacrl_lightning.exchange import AgentView

__all__ = ["LearnerTables", "MicroBatch", "total_grad_norm", "loss_inputs", "micro_batches"]


@dataclass(frozen=True)
class MicroBatch:
    """The view rows of one forward/backward pass and its weight: 1.0, or 0.0 for a zero-weight pass
    that only keeps this rank in step with the others (its rows are a stand-in)."""

    rows: Tensor
    weight: float

    @property
    def counts(self) -> bool:
        """Whether the pass's loss and metrics count (False: a zero-weight pass)."""
        return self.weight != 0.0


def micro_batches(pieces: Iterable[Tensor], stand_in: Tensor) -> Iterator[MicroBatch]:
    """Each piece of rows as a pass of weight 1; an empty piece (this rank holds fewer rows than another)
    as a pass over `stand_in` (a row of the view) of weight 0."""
    for rows in pieces:
        yield MicroBatch(stand_in, 0.0) if len(rows) == 0 else MicroBatch(rows, 1.0)


@dataclass(frozen=True)
class LearnerTables:
    """A learner's per-row inputs of one step, indexed by its view's rows (B rows, T token columns)."""

    advantages: Tensor              # [B]
    old_logp_mean: Tensor           # [B]  the source's mean old log-prob of the response
    old_logp: Tensor                # [B, T]  per token, this rank's own rows (zero elsewhere)
    omega_factor: Tensor            # [B]  omega[source, learner]
    ref_logp: Optional[Tensor]      # [B, T]  the KL reference's, or None without a KL term
    rewards: Tensor                 # [B]

    @classmethod
    def of_step(cls, view: AgentView, k: int, *, advantages: Tensor, old_mean: Tensor, old_tokens: Tensor,
                ref_tokens: Optional[Tensor], omega: Tensor, rewards: Tensor) -> "LearnerTables":
        """Learner k's tables from the step's: advantages, old_mean, rewards [P·n·G] in the step's flat order
        (a view's `row_idx` indexes it), omega [n, n]; old_tokens, ref_tokens [B, T] already per view row."""
        return cls(advantages=advantages[view.row_idx], old_logp_mean=old_mean[view.row_idx], old_logp=old_tokens,
                   omega_factor=omega[view.source_idx, k], ref_logp=ref_tokens, rewards=rewards[view.row_idx])


def loss_inputs(view: AgentView, micro: AgentView, rows: Tensor, mini: Tensor, logp: Tensor, tables: LearnerTables, *,
                cross_lower: float, loss_scale_factor: float, engine_logp: bool,
                part: Optional[str] = None, micro_batches: int = 1) -> dict[str, Any]:
    """`hacpo_loss`'s inputs for `rows` of `view` (`micro`: those rows, selected and on the device of
    `logp`, their new per-token log-probs [b, T]), normalised over the global mini-batch `mini` (its
    sequences, and its tokens for token-mean). `part` ("self" or "cross") keeps only those responses'
    terms: the others get no tokens, so the two parts sum to the loss (and no reward-based statistics).
    `micro_batches`: the global mini-batch's micro-batch count over every rank (the paper code's KL mean)."""
    device, width = logp.device, logp.shape[1]
    loss_mask = micro.loss_mask                                                             # [b, T]
    if part is not None:
        loss_mask = loss_mask & (micro.is_own if part == "self" else ~micro.is_own)[:, None]
    return dict(
        logp_new=logp, loss_mask=loss_mask, is_own=micro.is_own, cross_lower=cross_lower,
        advantages=tables.advantages[rows].to(device),
        old_logp_mean=tables.old_logp_mean[rows].to(device),
        old_logp=tables.old_logp[rows, :width].to(device),
        omega_factor=tables.omega_factor[rows].to(device),
        ref_logp=None if tables.ref_logp is None else tables.ref_logp[rows, :width].to(device),
        total_tokens=view.loss_mask[mini].sum().clamp(min=1).to(device),                    # global mini-batch
        total_seqs=torch.tensor(float(len(mini))).to(device),
        loss_scale_factor=loss_scale_factor, kl_micro_batches=float(micro_batches),
        engine_logp=micro.engine_logp.to(device) if engine_logp else None,
        rewards=None if part is not None else tables.rewards[rows].to(device),
    )


def source_span(loss_mask: Tensor, is_own: Tensor, source_len: Tensor) -> Tensor:
    """[B] factor on each row's advantage that gives a partner's row of L_k learner tokens the advantage on
    its first L_src tokens only (L_src: the source's token count), as the paper's code masks its first model's
    partner rows (docs/spec.md §11): HACPO's sequence-level cross term is the same on every token of a row but
    for the advantage, so any aggregation linear in the per-token terms gets min(L_src, L_k) / L_k of it.
    Own rows: 1. loss_mask [B, T] (the learner's response tokens), is_own [B], source_len [B]."""
    learner_len = loss_mask.sum(-1).to(torch.float64)                                      # [B]
    span = torch.minimum(source_len.to(torch.float64), learner_len) / learner_len.clamp(min=1)
    return torch.where(is_own, torch.ones_like(span), span)                               # float64


def total_grad_norm(params: Iterable[Tensor], max_norm: float = float("inf")) -> Tensor:
    """The total 2-norm of the parameters' gradients over every rank (DTensor-aware), clipping them to
    `max_norm` (0 or inf: no clipping)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
