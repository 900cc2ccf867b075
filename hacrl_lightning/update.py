"""The parts of a learner's update that hold no state: a source's scores of its own rows before the update, a
micro-batch's loss inputs and the gradient norm.

The passes a rank runs (rows, weight, pass count) are the plan's (`plan.StepPlan.passes`).
`score_own_rows` is the old log-probs' pass over one source's own rows (and its KL reference's, and how far
the engine's log-probs were from the trainer's). `LearnerTables` holds a learner's per-row inputs of one step
(advantages, old and reference log-probs, omega, rewards), `loss_inputs` turns a micro-batch of them into
`hacpo_loss`'s keyword arguments (besides the algorithm's `loss_settings()`), `total_grad_norm` is the clip's
utility, global over ranks under FSDP, and `adamw` builds an agent's optimizer (fused on CUDA, `adamw_options`).
No pass loop here or in the module reads a value to the host (on a GPU each read waits for every queued
kernel): `to_device` selects a pass's rows on the host and copies them without waiting, `host_values` brings a
mini-batch's figures over in one copy; `padding_metrics` says what share of the passes' tokens is padding.
Deliberately not here: forward passes, backward passes and optimizer steps (the module), the loss
itself (`algorithms/`) and the plan of mini-batches and passes (`plan.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from hacrl_lightning.agents.agent import Agent, first_target_column
from hacrl_lightning.algorithms import sequence_mean_logp
from hacrl_lightning.algorithms.objective import rows_present
from hacrl_lightning.exchange import AgentView
from hacrl_lightning.plan import MicroBatch, StepPlan

__all__ = ["LearnerTables", "OwnScores", "adamw", "adamw_options", "host_values", "loss_inputs", "padding_metrics",
           "score_own_rows", "to_device", "total_grad_norm"]


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
    from the trainer's. The scores stay on the device until the last pass and reach the host in one copy each:
    no pass waits for the one before it (`to_device`)."""
    shape, wide = view.input_ids.shape, torch.float64
    tokens = torch.zeros(shape, device=device)                                             # [B, T]
    ref_tokens = torch.zeros(shape, device=device) if reference is not None else None
    mean, scored = torch.zeros(shape[0], device=device), torch.zeros(shape[0], dtype=torch.bool)
    diff_sum, diff_count, diff_max = (torch.zeros((), dtype=wide, device=device) for _ in range(3))
    for micro_batch in passes:
        micro, first = to_device(view, micro_batch.rows, device)
        scoring = dict(temperature=agent.cfg.temperature, first_target=first)
        logp = agent.token_logprobs(micro.input_ids, micro.attention_mask, **scoring)     # [b, T], 0 before responses
        ref = reference(micro.input_ids, micro.attention_mask, **scoring) if reference is not None else None
        if not micro_batch.counts:
            continue
        rows, width = micro_batch.rows.to(device, non_blocking=True), logp.shape[1]
        tokens[rows, :width] = logp.float()
        # |engine - trainer| per token where the engine reported its log-probs (vLLM); 0 elsewhere
        known = micro.loss_mask & torch.isfinite(micro.engine_logp)                       # [b, T]
        diff = torch.where(known, (logp.float() - micro.engine_logp.float()).abs().to(wide), 0.0)
        diff_sum, diff_count = diff_sum + diff.sum(), diff_count + known.sum()
        diff_max = torch.maximum(diff_max, diff.max())
        mean[rows] = sequence_mean_logp(logp, micro.loss_mask).float()
        scored[micro_batch.rows] = True
        if ref is not None:
            ref_tokens[rows, : ref.shape[1]] = ref.float()
    return OwnScores(tokens=tokens.cpu(), reference=None if ref_tokens is None else ref_tokens.cpu(), mean=mean.cpu(),
                     scored=scored, engine_diff=torch.stack([diff_sum, diff_count.to(wide), diff_max]).cpu())


def to_device(view: AgentView, rows: Tensor, device: Any) -> tuple[AgentView, int]:
    """The view of `rows` (trimmed to their longest row) on `device`, and its first response column
    (`first_target_column`), both taken on the host; the copy does not wait for the device (a host-to-device copy
    returns once the driver holds the data), so the next pass is queued while the last one runs."""
    micro = view.select(rows)
    first = first_target_column(micro.loss_mask)
    return micro._map(lambda t: t.to(device, non_blocking=True)), first


def host_values(flag: Tensor, stats: Sequence[tuple[dict[str, Tensor], Optional[Tensor]]]
                ) -> tuple[bool, list[tuple[dict[str, float], Optional[float]]]]:
    """`flag` (one mini-batch's every-rank finite check) and its passes' loss metrics and own-token counts
    (`stats`: one (metrics, count or None) per pass that counts) on the host in one copy: one synchronisation with
    the device per mini-batch, where reading them one value at a time cost one each."""
    values = [flag] + [v for metrics, own in stats for v in (*metrics.values(), *(() if own is None else (own,)))]
    host = iter(torch.stack([v.detach().to(flag.device, torch.float64) for v in values]).cpu().tolist())
    ok = next(host) > 0
    return ok, [({key: next(host) for key in metrics}, None if own is None else next(host)) for metrics, own in stats]


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

    def put(t: Tensor) -> Tensor:  # a host-to-device copy that does not wait for the device (`to_device`)
        return t.to(device, non_blocking=True)

    loss_mask = micro.loss_mask                                                             # [b, T]
    if part is not None:
        loss_mask = loss_mask & (micro.is_own if part == "self" else ~micro.is_own)[:, None]
    old_logp = put(tables.old_logp[rows, :width])                                          # [b, T]
    old_logp_mean = put(tables.old_logp_mean[rows])                                        # [b]
    if own_old_is_new:
        own, new = put(micro.is_own), logp.detach()
        old_logp = torch.where(own[:, None], new.to(old_logp.dtype), old_logp)
        old_logp_mean = torch.where(own, sequence_mean_logp(new, loss_mask).to(old_logp_mean.dtype), old_logp_mean)
    host_mask = view.loss_mask[rows]                                                       # [b, T] on the host
    if part is not None:
        host_mask = host_mask & (view.is_own[rows] if part == "self" else ~view.is_own[rows])[:, None]
    present = rows_present(host_mask, view.is_own[rows], None if part is not None else tables.rewards[rows])
    return dict(
        logp_new=logp, loss_mask=loss_mask, is_own=micro.is_own, cross_lower=cross_lower, present=present,
        advantages=put(tables.advantages[rows]),
        old_logp_mean=old_logp_mean,
        old_logp=old_logp,
        omega_factor=put(tables.omega_factor[rows]),
        ref_logp=None if tables.ref_logp is None else put(tables.ref_logp[rows, :width]),
        total_tokens=put(view.loss_mask[mini].sum().clamp(min=1)),                         # global mini-batch
        total_seqs=put(torch.tensor(float(len(mini)))),
        loss_scale_factor=loss_scale_factor, kl_micro_batches=float(micro_batches),
        engine_logp=put(micro.engine_logp) if engine_logp else None,
        rewards=None if part is not None else put(tables.rewards[rows]),
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


def adamw_options(device_types: Iterable[str]) -> dict[str, bool]:
    """`torch.optim.AdamW`'s implementation keyword for parameters on these device types: `fused=True` where every
    one is on CUDA (one kernel per step for all of them, DTensor shards included), else nothing: torch's default
    (the per-parameter loop on the CPU, foreach on other accelerators), so a CPU run's update is unchanged."""
    return {"fused": True} if set(device_types) == {"cuda"} else {}


def adamw(params: list[Tensor], cfg: Any) -> torch.optim.AdamW:
    """An agent's AdamW over `params` with its `lr`, `betas` and `weight_decay` (`cfg`: its `AgentConfig`), in the
    implementation `adamw_options` picks for the parameters' device."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                             **adamw_options(p.device.type for p in params))


def padding_metrics(plans: Mapping[str, StepPlan], views: Mapping[str, AgentView], size: int) -> dict[str, float]:
    """`{agent}/perf/padding_frac/{old_logprobs,update}`: the share of the tokens its passes compute (every rank's,
    `StepPlan.padding`) that is padding, in the old log-probs' pass over its own rows and in its update."""
    out = {}
    for name, plan in plans.items():
        for phase, mask in (("old_logprobs", views[name].is_own), ("update", None)):
            real, computed = plan.padding(size, mask)
            out[f"{name}/perf/padding_frac/{phase}"] = 1.0 - real / computed if computed else 0.0
    return out
