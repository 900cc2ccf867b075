"""The parts of a learner's update that hold no state: a source's scores of its own rows before the update, a
micro-batch's loss inputs and the gradient norm.

The passes a rank runs (rows, weight, pass count) are the plan's (`plan.StepPlan.passes`).
`score_own_rows` is the old log-probs' pass over one source's own rows (and its KL reference's, and how far the
engine's log-probs were from the trainer's). `LearnerTables` holds a learner's per-row inputs of one step (advantages, old and reference
log-probs, omega, rewards), `loss_inputs` turns a micro-batch of them into `hacpo_loss`'s keyword
arguments (besides the algorithm's `loss_settings()`), and `total_grad_norm` is the clip's utility,
global over ranks under FSDP.
Deliberately not here: forward passes, backward passes and optimizer steps (the module), the loss
itself (`algorithms/`) and the plan of mini-batches and passes (`plan.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor

from hacrl_lightning.agents.agent import Agent, first_target_column
from hacrl_lightning.algorithms import sequence_mean_logp
from hacrl_lightning.exchange import AgentView
from hacrl_lightning.plan import MicroBatch

__all__ = ["LearnerTables", "OwnScores", "loss_inputs", "score_own_rows", "total_grad_norm"]


@dataclass(frozen=True)
class OwnScores:
    """A source's scores of the own rows this rank trains on, before any update (B view rows, T token columns)."""

    tokens: Tensor                  # [B, T]  per-token old log-probs, zero on rows not scored here
    reference: Optional[Tensor]     # [B, T]  the KL reference's, or None without one
    mean: Tensor                    # [B]  the response's mean old log-prob (its response tokens)
    scored: Tensor                  # [B] bool  the rows scored on this rank
    engine_diff: Tensor             # [3] float64: sum, count and max of |log p_engine - log p_trainer| per token


@torch.no_grad()
def score_own_rows(agent: Agent, view: AgentView, passes: Sequence[MicroBatch], *, device: Any,
                   reference: Optional[Callable[..., Tensor]] = None) -> OwnScores:
    """One forward pass of `agent` (and of `reference`, `token_logprobs`' signature) per pass of its own rows
    (`StepPlan.passes_where`); a zero-weight pass runs its forward all the same (FSDP's collectives) and keeps
    nothing. Where the engine reported log-probs of the sampled tokens (`view.engine_logp` finite), their distance
    from the trainer's."""
    tokens = torch.zeros(view.input_ids.shape)                                             # [B, T]
    ref_tokens = torch.zeros(view.input_ids.shape) if reference is not None else None
    mean, scored = torch.zeros(len(view.input_ids)), torch.zeros(len(view.input_ids), dtype=torch.bool)
    diff_stats = torch.zeros(3, dtype=torch.float64)                                       # sum, count, max
    for micro_batch in passes:
        rows = micro_batch.rows
        micro = view.select(rows).to(device)
        scoring = dict(temperature=agent.cfg.temperature, first_target=first_target_column(micro.loss_mask))
        logp = agent.token_logprobs(micro.input_ids, micro.attention_mask, **scoring)     # [b, T], 0 before responses
        ref = reference(micro.input_ids, micro.attention_mask, **scoring) if reference is not None else None
        if not micro_batch.counts:
            continue
        tokens[rows, : logp.shape[1]] = logp.float().cpu()
        known = micro.loss_mask & torch.isfinite(micro.engine_logp)                       # [b, T]
        if bool(known.any()):  # the engine reported its log-probs (vLLM): |engine - trainer| per token
            diff = (logp.float() - micro.engine_logp.float())[known].abs().double().cpu()
            diff_stats[0] += diff.sum()
            diff_stats[1] += diff.numel()
            diff_stats[2] = max(diff_stats[2], diff.max())
        mean[rows] = sequence_mean_logp(logp, micro.loss_mask).float().cpu()
        scored[rows] = True
        if ref is not None:
            ref_tokens[rows, : ref.shape[1]] = ref.float().cpu()
    return OwnScores(tokens=tokens, reference=ref_tokens, mean=mean, scored=scored, engine_diff=diff_stats)


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
                part: Optional[str] = None, micro_batches: int = 1, own_old_is_new: bool = False) -> dict[str, Any]:
    """`hacpo_loss`'s inputs for `rows` of `view` (`micro`: those rows, selected and on the device of
    `logp`, their new per-token log-probs [b, T]), normalised over the global mini-batch `mini` (its
    sequences, and its tokens for token-mean). `part` ("self" or "cross") keeps only those responses'
    terms: the others get no tokens, so the two parts sum to the loss (and no reward-based statistics).
    `micro_batches`: the global mini-batch's micro-batch count over every rank (the paper code's KL mean).
    `own_old_is_new`: no update of this learner has been applied this step, so the weights are those that scored
    its own rows' old log-probs: those rows take `logp`, detached, as old (ratio exactly 1, docs/spec.md §7). The
    old log-probs' pass batches rows otherwise than the update's passes, and in bf16 that alone moved a sequence
    ratio by up to 8.2e-4 (Qwen3-1.7B, the GPU check of 2026-11-28), past the own-row clip."""
    device, width = logp.device, logp.shape[1]
    loss_mask = micro.loss_mask                                                             # [b, T]
    if part is not None:
        loss_mask = loss_mask & (micro.is_own if part == "self" else ~micro.is_own)[:, None]
    old_logp = tables.old_logp[rows, :width].to(device)                                    # [b, T]
    old_logp_mean = tables.old_logp_mean[rows].to(device)                                  # [b]
    if own_old_is_new:
        own, new = micro.is_own.to(device), logp.detach()
        old_logp = torch.where(own[:, None], new.to(old_logp.dtype), old_logp)
        old_logp_mean = torch.where(own, sequence_mean_logp(new, loss_mask).to(old_logp_mean.dtype), old_logp_mean)
    return dict(
        logp_new=logp, loss_mask=loss_mask, is_own=micro.is_own, cross_lower=cross_lower,
        advantages=tables.advantages[rows].to(device),
        old_logp_mean=old_logp_mean,
        old_logp=old_logp,
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
