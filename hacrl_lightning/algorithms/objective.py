"""The loss of one learner's mini-batch: `hacpo_loss`, the single entry point the trainer calls.

It applies the own-response term to the learner's own responses and the cross term to partners'
responses, as its keyword switches say (docs/spec.md §6, §9; `AlgorithmConfig.loss_settings()` gives
them for a preset), so the trainer never asks which preset runs: GRPO, GSPO, naive, HACPO and every
ablation go through the same call. Deliberately not here: forward passes, mini-batch ordering (own
first, docs/spec.md §6) and the stepwise schedule of the cross lower bound: the caller passes the
bound of this mini-batch as a plain number (`cross_lower`, from the clip-schedule callback).

Given each response's reward, it also reports which responses the clip leaves without gradient,
split by whether the answer was correct (`diag/*`, docs/training.md#diagnostics): per micro-batch
fractions with their denominators (`count/*_correct`, `count/*_wrong`), so `LossStats` reduces them
as counts over micro-batches and ranks.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from hacrl_lightning.algorithms.losses import (
    aggregate_loss,
    hacpo_cross_term,
    kl_penalty,
    log_ratio_from_means,
    ppo_clip_term,
    sequence_mean_logp,
    token_log_ratio,
    truncated_is_weight,
)

__all__ = ["ANSWERS", "CROSS_LOSSES", "METRIC_NAMES", "RATIO_LEVELS", "hacpo_loss"]

ANSWERS = ("correct", "wrong")
"""A response is correct when its reward is > 0 (docs/spec.md §2, as the accuracy counts it), else wrong."""
METRIC_NAMES = tuple(
    ["loss/policy", "loss/kl", "loss/total", "count/self", "count/cross", "clip/cross_lower", "omega/cross_mean"]
    + [f"ratio/{part}_{stat}" for part in ("self", "cross") for stat in ("mean", "min", "max")]
    + [f"clip/{part}_{kind}" for part in ("self", "cross") for kind in ("low_frac", "high_frac", "frac")]
    + [f"count/{part}_{answer}" for part in ("self", "cross") for answer in ANSWERS]
    + [f"diag/{part}_nograd_frac_{answer}" for part in ("self", "cross") for answer in ANSWERS]
    + ["rollout_is/weight_mean", "rollout_is/capped_frac", "clip/self_dual_frac"]
)
"""Every key `hacpo_loss` may put in its metrics (a call returns the ones its batch has). A rate is a mean
over the part's responses (`count/self` or `count/cross`), or, for `diag/{part}_nograd_frac_{answer}`,
over the part's correct or wrong responses (`count/{part}_{answer}`): `LossStats` weights it by that count."""

RATIO_LEVELS = ("sequence", "token")
"""`sequence`: GSPO's length-normalised ratio per response (Eq. 11); `token`: per-token ratios (GRPO)."""
CROSS_LOSSES = ("hacpo", "self")
"""`hacpo`: the cross term of Eqs. 12-14; `self`: the own-response term applied to partners' responses (naive)."""

Metrics = Dict[str, Tensor]


def hacpo_loss(
    *,
    logp_new: Tensor,
    loss_mask: Tensor,
    advantages: Tensor,
    is_own: Tensor,
    ratio_level: str = "sequence",
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    cross_loss: str = "hacpo",
    cross_lower: Optional[float] = None,
    alpha: float = 1.0,
    cross_clip: bool = True,
    use_omega: bool = True,
    loss_agg_mode: str = "seq-mean-token-mean",
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    old_logp_mean: Optional[Tensor] = None,
    old_logp: Optional[Tensor] = None,
    omega_factor: Optional[Tensor] = None,
    ref_logp: Optional[Tensor] = None,
    rewards: Optional[Tensor] = None,
    total_tokens: Union[float, Tensor, None] = None,
    total_seqs: Union[float, Tensor, None] = None,
    loss_scale_factor: Optional[float] = None,
    rollout_is_cap: float = 0.0,
    engine_logp: Optional[Tensor] = None,
    dual_clip_c: Optional[float] = None,
) -> Tuple[Tensor, Metrics]:
    """Loss of learner k on one mini-batch (paper Eq. 53: J = J_homo + J_hete; loss = -J aggregated).

    Per response b, with s_b the sequence ratio of Eq. 11 (`ratio_level == "sequence"`):
      own (is_own):        min(s·A, clip(s, 1 - clip_low, 1 + clip_high)·A)         Eqs. 47-49
      cross, "hacpo":      clamp(s, lower_m, 1) · sg(c)^alpha · omega[j, k] · A     Eqs. 50-52
      cross, "self":       the own term with the cross ratio                        (naive)
    `ratio_level == "token"` (GRPO) uses per-token ratios with the own term and accepts own responses
    only, and with `dual_clip_c` (verl's `clip_ratio_c`) holds a token's term at c·A where A < 0 and
    r > c (`ppo_clip_term`); as in verl, whose GSPO loss has no dual-clip, sequence-level ratios ignore
    it. The loss is `-aggregate(term)` with `loss_agg_mode`, plus `kl_coef · KL` on own responses
    (normalised like the policy term) when kl_coef > 0. `cross_clip=False` drops the clamp
    (hacpo_no_clip); `use_omega=False` drops the omega factor (hacpo_no_omega).

    Inputs (B responses, T tokens in the learner's tokenization):
      logp_new [B, T]       learner's current log-probs of each response token (with grad)
      loss_mask [B, T]      True on response tokens (the learner's tokens of the response)
      advantages [B]        learner k's advantage of each response (`compute_advantages(...)[k]`)
      is_own [B] bool       True where the source is the learner
      cross_lower           lower_m of this mini-batch (Eq. 14, `cross_clip_lower`); needed when
                            cross_loss == "hacpo" and the batch holds cross responses
      old_logp_mean [B]     source's mean old log-prob over the source's tokens (sequence level)
      old_logp [B, T]       old per-token log-probs in the learner's tokens (own responses only);
                            needed at token level, and used at sequence level if old_logp_mean is None
      omega_factor [B]      omega[source, k] per response (needed for cross responses when
                            use_omega; ignored otherwise and on own responses)
      ref_logp [B, T]       reference log-probs (needed when kl_coef > 0)
      rewards [B]           each response's reward (optional; only the diagnostics read it: > 0 is correct)
      total_tokens, total_seqs, loss_scale_factor: see `aggregate_loss` (micro-batching, Dr. GRPO)
      rollout_is_cap, engine_logp [B, T]: with a cap > 0, each own response token's policy term is
                            weighted by `truncated_is_weight(old_logp, engine_logp, cap)` (the sampler's
                            log-probs, NaN where unknown; needs old_logp); cross rows keep weight 1
    Returns (loss, metrics); metrics are detached, and keys of an absent part (no own or no cross
    responses in this batch) are left out.

    Diagnostics (sequence level, when `rewards` is given): `diag/{part}_nograd_frac_{answer}` is the
    fraction of the part's (`self`: own, `cross`: partners') correct (reward > 0) or wrong responses
    whose term the clip makes constant, so they carry no gradient:
      cross, "hacpo":  s < lower_m or s > 1, whatever the sign of A (hard clamp); none when cross_clip=False
      own, and cross "self" (naive): s < 1 - clip_low with A < 0, or s > 1 + clip_high with A > 0 (PPO min)
    with its denominator `count/{part}_{answer}` (a fraction whose denominator is 0 is left out).
    """
    if logp_new.ndim != 2 or logp_new.shape != loss_mask.shape:
        raise ValueError(
            f"logp_new and loss_mask must both be [B, T], got {tuple(logp_new.shape)} and {tuple(loss_mask.shape)}"
        )
    batch = logp_new.shape[0]
    for name, value in (("advantages", advantages), ("is_own", is_own)):
        if value.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}], got {tuple(value.shape)}")
    if cross_loss not in CROSS_LOSSES:
        raise ValueError(f"unknown cross_loss {cross_loss!r}: known {sorted(CROSS_LOSSES)}")
    mask = loss_mask.bool()
    # padding may hold anything (even -inf); zero it so no NaN can reach the gradient
    logp_new = torch.where(mask, logp_new, torch.zeros_like(logp_new))  # [B, T]
    is_own = is_own.bool()  # [B]
    valid = mask.any(dim=-1)  # [B]  rows with at least one token
    own, cross = is_own & valid, ~is_own & valid  # [B], [B]
    advantages = advantages.to(logp_new)
    metrics: Metrics = {}

    clip = dict(clip_low=clip_low, clip_high=clip_high)
    if ratio_level == "sequence":
        if old_logp_mean is None:
            if old_logp is None:
                raise ValueError("sequence-level ratios need old_logp_mean [B] (or old_logp [B, T] for own responses)")
            old_logp_mean = sequence_mean_logp(old_logp, loss_mask)
        log_ratio = log_ratio_from_means(sequence_mean_logp(logp_new, loss_mask), old_logp_mean)  # [B]
        ratio = log_ratio.exp()  # [B]
        own_term = ppo_clip_term(ratio, advantages, **clip)  # [B]
        if cross_loss == "self":  # naive: the own term for every response
            term = own_term
            _ppo_metrics(metrics, "cross", ratio, advantages, cross, **clip)
        else:
            if cross_lower is None:
                if bool(cross.any()):
                    raise ValueError("cross responses with cross_loss='hacpo' need cross_lower (lower_m of Eq. 14, "
                                     "e.g. `cross_clip_lower(m, delta, delta_step)`)")
                cross_lower = 1.0  # no cross row reads it
            cross_term, cross_metrics = _cross_term(ratio, advantages, cross, omega_factor, lower=float(cross_lower),
                                                    alpha=alpha, clip=cross_clip, use_omega=use_omega)  # [B]
            term = torch.where(is_own, own_term, cross_term)  # [B]
            metrics.update(cross_metrics)
        loss_mat = term[:, None].expand_as(logp_new)  # [B, T]
        _ppo_metrics(metrics, "self", ratio, advantages, own, **clip)
        if rewards is not None:
            if rewards.shape != (batch,):
                raise ValueError(f"rewards must have shape [{batch}], got {tuple(rewards.shape)}")
            correct = rewards.to(ratio.device) > 0  # [B]
            own_nograd = _ppo_nograd(ratio, advantages, **clip)  # [B]
            if cross_loss == "self":
                cross_nograd = own_nograd
            elif cross_clip:
                cross_nograd = (ratio.detach() < float(cross_lower)) | (ratio.detach() > 1.0)  # [B]
            else:
                cross_nograd = torch.zeros_like(own_nograd)
            _nograd_metrics(metrics, "self", own_nograd, own, correct)
            _nograd_metrics(metrics, "cross", cross_nograd, cross, correct)
    elif ratio_level == "token":
        if bool(cross.any()):
            raise ValueError(
                "ratio_level='token' compares log-probs token by token and needs one tokenization: it "
                "supports own responses only; use ratio_level='sequence' for shared rollouts"
            )
        if old_logp is None:
            raise ValueError("ratio_level='token' needs old_logp [B, T] in the learner's tokenization")
        old_logp = torch.where(mask, old_logp.to(logp_new), torch.zeros_like(logp_new))  # [B, T]
        ratio = token_log_ratio(logp_new, old_logp).exp()  # [B, T]
        loss_mat = ppo_clip_term(ratio, advantages[:, None], **clip, dual_clip_c=dual_clip_c)
        _ppo_metrics(metrics, "self", ratio, advantages[:, None].expand_as(ratio), mask & own[:, None], **clip)
        if dual_clip_c and bool(own.any()):  # tokens the dual-clip holds at c·A (verl's pg_clipfrac_lower)
            held = (advantages[:, None] < 0) & (ppo_clip_term(ratio.detach(), advantages[:, None], **clip)
                                                 < dual_clip_c * advantages[:, None])  # [B, T]
            metrics["clip/self_dual_frac"] = held[mask & own[:, None]].float().mean()
    else:
        raise ValueError(f"unknown ratio_level {ratio_level!r}: known {sorted(RATIO_LEVELS)}")

    # one pair of normalisers for the policy term and the KL, so both scale alike under micro-batching
    tokens_per_seq = mask.sum(dim=-1)  # [B]
    total_tokens = tokens_per_seq.sum().clamp(min=1) if total_tokens is None else total_tokens
    total_seqs = valid.sum().clamp(min=1) if total_seqs is None else total_seqs
    agg = dict(
        mode=loss_agg_mode, total_tokens=total_tokens, total_seqs=total_seqs, loss_scale_factor=loss_scale_factor
    )
    if rollout_is_cap > 0:
        if old_logp is None or engine_logp is None:
            raise ValueError(f"rollout_is_cap={rollout_is_cap} needs old_logp and engine_logp [B, T] of own responses")
        own_tokens = mask & own[:, None]  # [B, T]
        weight = truncated_is_weight(old_logp.to(logp_new), engine_logp, own_tokens, cap=rollout_is_cap)  # [B, T]
        loss_mat = loss_mat * weight
        if bool(own_tokens.any()):
            metrics["rollout_is/weight_mean"] = weight[own_tokens].mean()
            metrics["rollout_is/capped_frac"] = (weight[own_tokens] >= rollout_is_cap).float().mean()
    policy_loss = -aggregate_loss(loss_mat, loss_mask, **agg)
    loss = policy_loss
    metrics["loss/policy"] = policy_loss.detach()

    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError(f"kl_coef={kl_coef} > 0 needs ref_logp [B, T] from the learner's reference model")
        ref_logp = torch.where(mask, ref_logp.to(logp_new), torch.zeros_like(logp_new))  # [B, T]
        kl = aggregate_loss(kl_penalty(logp_new, ref_logp, estimator=kl_estimator), mask & own[:, None], **agg)
        loss = policy_loss + kl_coef * kl
        metrics["loss/kl"] = kl.detach()
    metrics["loss/total"] = loss.detach()
    metrics["count/self"] = own.sum().detach()
    metrics["count/cross"] = cross.sum().detach()
    return loss, metrics


def _cross_term(
    ratio: Tensor, advantages: Tensor, cross: Tensor, omega_factor: Optional[Tensor], *, lower: float, alpha: float,
    clip: bool, use_omega: bool
) -> Tuple[Tensor, Metrics]:
    """HACPO's cross term for every row (the caller keeps it on cross rows only) and its metrics."""
    metrics: Metrics = {}
    if not use_omega:
        omega_factor = torch.ones_like(ratio)
    elif omega_factor is None:
        if bool(cross.any()):
            raise ValueError("cross responses with use_omega need omega_factor [B] = omega[source, learner]")
        omega_factor = torch.ones_like(ratio)
    elif omega_factor.shape != ratio.shape:
        raise ValueError(f"omega_factor must have shape {tuple(ratio.shape)}, got {tuple(omega_factor.shape)}")
    omega_factor = omega_factor.to(ratio)
    term = hacpo_cross_term(ratio, advantages, omega_factor, lower=lower, alpha=alpha, clip=clip)
    if bool(cross.any()):
        r = ratio.detach()[cross]
        low = (r < lower) if clip else torch.zeros_like(r, dtype=torch.bool)
        high = (r > 1.0) if clip else torch.zeros_like(r, dtype=torch.bool)
        metrics.update(_ratio_stats("cross", r))
        metrics.update(_fractions("cross", low, high))
        metrics["clip/cross_lower"] = r.new_tensor(lower)
        metrics["omega/cross_mean"] = omega_factor.detach()[cross].mean()
    return term, metrics


def _ppo_metrics(
    metrics: Metrics, part: str, ratio: Tensor, advantages: Tensor, select: Tensor, *, clip_low: float,
    clip_high: float
) -> None:
    """Ratio stats and clip fractions of a PPO-clipped part. A response (or token) counts as clipped
    low / high when the clip zeroes its gradient: r < 1 - clip_low with A < 0, r > 1 + clip_high with A > 0."""
    if not bool(select.any()):
        return
    r, a = ratio.detach()[select], advantages.detach()[select]
    low = (r < 1.0 - clip_low) & (a < 0)
    high = (r > 1.0 + clip_high) & (a > 0)
    metrics.update(_ratio_stats(part, r))
    metrics.update(_fractions(part, low, high))


def _ppo_nograd(ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float) -> Tensor:
    """[B] bool: where `ppo_clip_term`'s min picks the clipped, constant side, so the term has no gradient."""
    r, a = ratio.detach(), advantages.detach()
    return ((r < 1.0 - clip_low) & (a < 0)) | ((r > 1.0 + clip_high) & (a > 0))


def _nograd_metrics(metrics: Metrics, part: str, nograd: Tensor, select: Tensor, correct: Tensor) -> None:
    """Per answer (correct / wrong) among the `select`ed rows: their count and the fraction without gradient."""
    if not bool(select.any()):
        return
    for answer, rows in (("correct", select & correct), ("wrong", select & ~correct)):  # [B], [B]
        count = rows.sum()
        metrics[f"count/{part}_{answer}"] = count.detach()
        if bool(count > 0):
            metrics[f"diag/{part}_nograd_frac_{answer}"] = nograd[rows].float().mean()


def _ratio_stats(part: str, r: Tensor) -> Metrics:
    return {f"ratio/{part}_mean": r.mean(), f"ratio/{part}_min": r.min(), f"ratio/{part}_max": r.max()}


def _fractions(part: str, low: Tensor, high: Tensor) -> Metrics:
    return {
        f"clip/{part}_low_frac": low.float().mean(),
        f"clip/{part}_high_frac": high.float().mean(),
        f"clip/{part}_frac": (low | high).float().mean(),
    }
