"""Loss building blocks: importance ratios, the clipped terms of GSPO/GRPO and HACPO, KL, aggregation.

Each function is one equation of the paper (v1) or of verl, written on tensors, and returns the
per-sample (or per-token) *objective* term to be maximised; `objective.hacpo_loss` assembles them
into the loss of one learner's mini-batch. Deliberately not here: models, tokenization, which
preset is running (the caller passes plain scalars), and optimizer steps.

Shape legend: B sequences in the learner's mini-batch, T response tokens in the learner's
tokenization, T_old in the source's. `loss_mask` is True on response tokens that count.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor


__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "MAX_ABS_LOG_RATIO",
    "aggregate_loss",
    "cross_clip_lower",
    "hacpo_cross_term",
    "kl_penalty",
    "log_ratio_from_means",
    "ppo_clip_term",
    "sequence_log_ratio",
    "sequence_mean_logp",
    "token_log_ratio",
    "truncated_is_weight",
]

MAX_ABS_LOG_RATIO = 10.0
"""|log s| is clamped to this before exponentiating (docs/spec.md §5, authors' code)."""


def _check_pair(name_a: str, a: Tensor, name_b: str, b: Tensor, shape: str) -> None:
    """Raise with both shapes unless a and b have one shape with as many dims as `shape` names."""
    if a.shape != b.shape or a.ndim != shape.count(",") + 1:
        raise ValueError(f"{name_a} and {name_b} must both be {shape}, got {tuple(a.shape)} and {tuple(b.shape)}")


# --- importance ratios -------------------------------------------------------------------------


def sequence_mean_logp(logp: Tensor, loss_mask: Tensor) -> Tensor:
    """Length-normalised log-probability: `mean_t logp[b, t]` over the tokens where loss_mask is True.

    logp, loss_mask: [B, T]. Returns [B]. A row without tokens gives 0. Padding may hold any value
    (even -inf): it is never read.
    """
    _check_pair("logp", logp, "loss_mask", loss_mask, "[B, T]")
    mask = loss_mask.bool()
    total = torch.where(mask, logp, torch.zeros_like(logp)).sum(dim=-1)  # [B]
    return total / mask.sum(dim=-1).clamp(min=1).to(logp.dtype)


def log_ratio_from_means(new_mean: Tensor, old_mean: Tensor, *, max_abs: float = MAX_ABS_LOG_RATIO) -> Tensor:
    """`log s = clamp(new_mean - old_mean, -max_abs, max_abs)`; both [B] (already length-normalised).

    Use this when the source's mean old log-prob was computed once per response and shared by all
    learners (the usual case: a cross response's old log-probs live in the source's tokenization).
    """
    _check_pair("new_mean", new_mean, "old_mean", old_mean, "[B]")
    return (new_mean - old_mean.to(new_mean)).clamp(-max_abs, max_abs)


def sequence_log_ratio(
    logp_new: Tensor,
    mask_new: Tensor,
    logp_old: Tensor,
    mask_old: Tensor,
    *,
    max_abs: float = MAX_ABS_LOG_RATIO,
) -> Tensor:
    """Sequence-level log importance ratio, paper Eq. 11 (GSPO's geometric mean), clamped ±max_abs:

        log s = mean_t log π_k,current(y_t) - mean_t' log π_j,old(y_t')

    The first mean runs over the response in the learner's tokenization (logp_new, mask_new: [B, T]),
    the second over the source's (logp_old, mask_old: [B, T_old]); each divides by its own token
    count, so T != T_old is expected for cross responses (docs/spec.md §5). Returns [B].
    """
    if logp_new.shape[0] != logp_old.shape[0]:
        raise ValueError(f"batch sizes differ: new {tuple(logp_new.shape)} vs old {tuple(logp_old.shape)}")
    return log_ratio_from_means(
        sequence_mean_logp(logp_new, mask_new), sequence_mean_logp(logp_old, mask_old), max_abs=max_abs
    )


def token_log_ratio(logp_new: Tensor, logp_old: Tensor, *, max_abs: float = MAX_ABS_LOG_RATIO) -> Tensor:
    """Per-token log ratio (PPO/GRPO): `clamp(logp_new - logp_old, ±max_abs)`; both [B, T] in one tokenization."""
    _check_pair("logp_new", logp_new, "logp_old", logp_old, "[B, T] (one tokenization)")
    return (logp_new - logp_old.to(logp_new)).clamp(-max_abs, max_abs)


def cross_clip_lower(m: int, delta: float, delta_step: float) -> float:
    """Stepwise lower bound of the cross ratio, paper Eq. 14: `min(1, 1 - delta + m * delta_step)`.

    m counts the optimizer updates already made for this learner in this step (0, 1, ...).
    """
    if m < 0:
        raise ValueError(f"mini-batch index m must be >= 0, got {m}")
    return min(1.0, 1.0 - delta + m * delta_step)


# --- clipped terms (objectives to maximise) ---------------------------------------------------


def ppo_clip_term(
    ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float, dual_clip_c: Optional[float] = None
) -> Tensor:
    """PPO clipped surrogate with asymmetric range, and optionally dual-clip:

        term = min( r · A,  clip(r, 1 - clip_low, 1 + clip_high) · A )
        dual-clip (A < 0 only):  term = max(term, c · A)

    With the sequence ratio s of Eq. 11 this is GSPO and HACPO's own-response term (paper Eqs. 47-49,
    clip 3e-4 / 4e-4); with per-token ratios and advantages broadcast over tokens ([B, T] and [B, 1])
    it is GRPO's token-level term with DAPO's clip-higher (0.2 / 0.28). `dual_clip_c` (c > 1; None or
    0: off) is verl's `clip_ratio_c` (Ye et al. 2020): where A < 0 the pessimistic min would follow a
    ratio r > c without bound, so the term is held at c · A there, with no gradient. Returns ratio's shape.
    """
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    term = torch.minimum(ratio * advantages, clipped * advantages)
    if not dual_clip_c:
        return term
    if dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or 0/None: off), got {dual_clip_c}")
    return torch.where(advantages < 0, torch.maximum(term, dual_clip_c * advantages), term)


def hacpo_cross_term(
    ratio: Tensor,
    advantages: Tensor,
    omega_factor: Tensor,
    *,
    lower: float,
    alpha: float,
    clip: bool = True,
) -> Tensor:
    """HACPO's term for a response of partner j trained on by learner k, paper Eqs. 12-14 and 50-52:

        c    = clamp(s, lower_m, 1)                        # asymmetric, stepwise lower bound
        term = c · stopgrad(c) ** alpha · omega[j, k] · A

    A hard clamp, not a PPO min (docs/spec.md §6, Decision): outside [lower_m, 1] the term is
    constant, so the response gives no gradient whatever the sign of A. Inside, its gradient is
    `stopgrad(c) ** (alpha + 1) · omega · A · ∇ log s` (Prop. D.6). `clip=False` uses c = s
    (hacpo_no_clip). ratio, advantages, omega_factor: [B]. Returns [B].
    """
    c = ratio.clamp(lower, 1.0) if clip else ratio  # [B]
    return c * c.detach().pow(alpha) * omega_factor * advantages


# --- KL to a reference ----------------------------------------------------------------------


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π || π_ref) from samples of π (Schulman's k1/k2/k3), [B, T] -> [B, T].

        k1 = logp - ref_logp
        k2 = (logp - ref_logp) ** 2 / 2
        k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1      (verl's low_var_kl; >= 0)

    As in verl, k3 clamps `ref_logp - logp` to ±20 and the estimate to at most 10.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must have one shape, got {tuple(logp.shape)} and {tuple(ref_logp.shape)}")
    if estimator not in _KL:
        raise ValueError(f"unknown KL estimator {estimator!r}: known {sorted(KL_ESTIMATORS)}")
    return _KL[estimator](logp - ref_logp.to(logp))  # [B, T]


def _k3(diff: Tensor) -> Tensor:
    neg = (-diff).clamp(-20.0, 20.0)
    return (neg.exp() - neg - 1.0).clamp(max=10.0)


_KL = {"k1": lambda diff: diff, "k2": lambda diff: 0.5 * diff.square(), "k3": _k3}
"""Each estimator of `kl_penalty` by name, from diff = logp - ref_logp [B, T]."""
KL_ESTIMATORS = tuple(_KL)
"""The estimators `kl_penalty` knows (Schulman's k1/k2/k3)."""


# --- the rollout engine's mismatch --------------------------------------------------------------


def truncated_is_weight(old_logp: Tensor, engine_logp: Tensor, loss_mask: Tensor, *, cap: float) -> Tensor:
    """Truncated importance weight of each sampled token, [B, T] -> [B, T] (verl's `tis_imp_ratio_cap`):

        w_t = min(exp(old_logp_t - engine_logp_t), cap)      (detached: a weight, not a ratio to train)

    The sampler (a vLLM engine) and the trainer compute log-probs with different kernels and precision,
    so the responses come from a policy slightly off the trainer's π_old; weighting each token's policy
    term by π_old / π_engine corrects that, and the cap bounds the variance. `exp` takes the difference
    clamped to ±MAX_ABS_LOG_RATIO. w = 1 outside `loss_mask` and where `engine_logp` is NaN (not reported).
    """
    _check_pair("old_logp", old_logp, "engine_logp", engine_logp, "[B, T]")
    known = loss_mask.bool() & torch.isfinite(engine_logp)  # [B, T]
    diff = torch.where(known, old_logp.detach() - engine_logp.to(old_logp), torch.zeros_like(old_logp))
    return diff.clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO).exp().clamp(max=cap)  # [B, T]


# --- aggregation ------------------------------------------------------------------------------


def aggregate_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    *,
    mode: str,
    total_tokens: Union[float, Tensor, None] = None,
    total_seqs: Union[float, Tensor, None] = None,
    loss_scale_factor: Optional[float] = None,
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar, with verl's mode names (`core_algos.agg_loss`):

        token-mean               Σ_b Σ_t L / total_tokens
        seq-mean-token-mean      Σ_b (Σ_t L / |y_b|) / total_seqs        (HACPO, GSPO)
        seq-mean-token-sum       Σ_b Σ_t L / total_seqs
        seq-mean-token-sum-norm  Σ_b Σ_t L / (total_seqs · loss_scale_factor)   (Dr. GRPO)

    A sequence-level term is broadcast over its tokens first, so seq-mean-token-mean averages the
    terms. total_tokens / total_seqs default to this call's counts (rows without tokens do not
    count); pass the mini-batch's totals when it is split into micro-batches, so that the micro-batch
    losses sum to the mini-batch loss. loss_scale_factor defaults to T; pass a constant (the max
    response length) to reproduce Dr. GRPO.
    """
    _check_pair("loss_mat", loss_mat, "loss_mask", loss_mask, "[B, T]")
    if mode not in _AGGREGATIONS:
        raise ValueError(f"unknown loss_agg_mode {mode!r}: known {sorted(LOSS_AGG_MODES)}")
    mask = loss_mask.bool()
    masked = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))  # [B, T]
    tokens_per_seq = mask.sum(dim=-1)  # [B]
    if total_seqs is None:
        total_seqs = (tokens_per_seq > 0).sum().clamp(min=1)
    return _AGGREGATIONS[mode](masked, tokens_per_seq, total_tokens=total_tokens, total_seqs=total_seqs,
                               scale=loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor)


def _token_mean(masked: Tensor, tokens_per_seq: Tensor, *, total_tokens, total_seqs, scale) -> Tensor:
    if total_tokens is None:
        total_tokens = tokens_per_seq.sum().clamp(min=1)
    return masked.sum() / total_tokens


def _seq_mean_token_mean(masked: Tensor, tokens_per_seq: Tensor, *, total_tokens, total_seqs, scale) -> Tensor:
    per_seq = masked.sum(dim=-1) / tokens_per_seq.clamp(min=1).to(masked.dtype)  # [B]
    return per_seq.sum() / total_seqs


def _seq_mean_token_sum(masked: Tensor, tokens_per_seq: Tensor, *, total_tokens, total_seqs, scale) -> Tensor:
    return masked.sum() / total_seqs


def _seq_mean_token_sum_norm(masked: Tensor, tokens_per_seq: Tensor, *, total_tokens, total_seqs, scale) -> Tensor:
    return masked.sum() / (total_seqs * scale)


_AGGREGATIONS = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
"""Each reduction of `aggregate_loss` by mode: (masked [B, T], tokens per row [B], totals) -> scalar."""
LOSS_AGG_MODES = tuple(_AGGREGATIONS)
"""The reductions `aggregate_loss` knows (verl's `loss_agg_mode` names)."""
