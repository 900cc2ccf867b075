"""The loss of one learner's mini-batch: `hacpo_loss`, the single entry point the trainer calls.

It applies the own-response term to the learner's own responses and the cross term to partners'
responses, as its keyword switches say (docs/spec.md §6, §9; `AlgorithmConfig.loss_settings()` gives
them for a preset), so the trainer never asks which preset runs: GRPO, GSPO, naive, HACPO and every
ablation go through the same call. It is a short composition of small steps, each chosen by a setting
the way verl registers its policy losses: the policy term by ratio level (`RATIO_TERMS`), the cross term
by `cross_loss` (`CROSS_TERMS`), the rollout-IS weight, the aggregation by mode (`aggregate_loss`) and
the KL; a new mode is one registered function. Deliberately not here: forward passes, mini-batch ordering (own
first, docs/spec.md §6) and the stepwise schedule of the cross lower bound: the caller passes the
bound of this mini-batch as a plain number (`cross_lower`, from the clip-schedule callback).

Given each response's reward, it also reports which responses the clip leaves without gradient,
split by whether the answer was correct (`diag/*`, docs/training.md#diagnostics): per micro-batch
fractions with their denominators (`count/*_correct`, `count/*_wrong`), so `LossStats` reduces them
as counts over micro-batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from hacrl_lightning.algorithms.losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    aggregate_loss,
    hacpo_cross_term,
    kl_penalty,
    log_ratio_from_means,
    ppo_clip_term,
    sequence_mean_logp,
    token_log_ratio,
    truncated_is_weight,
)

__all__ = [
    "ANSWERS", "CROSS_LOSSES", "CROSS_TERMS", "LOSS_MODES", "METRIC_NAMES", "RATIO_LEVELS", "RATIO_TERMS", "SETTINGS",
    "LossSettings", "PRESENCE", "hacpo_loss", "register_cross_loss", "register_ratio_level", "rows_present",
]

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

PRESENCE = ("self", "cross", *(f"{part}_{answer}" for part in ("self", "cross") for answer in ANSWERS))
"""The kinds of rows a batch may hold or lack (`rows_present`): own (`self`) and partners' (`cross`) rows with a
token, and with rewards each part's correct and wrong ones. A metric over an absent kind is left out."""

LossTerm = Callable[["LossInputs", "LossSettings"], Tuple[Tensor, "Metrics"]]
"""A policy term by ratio level: (inputs, settings) -> (per-token objective [B, T] to maximise, metrics)."""
CrossTerm = Callable[["LossInputs", "LossSettings", Tensor, Tensor], Tuple[Tensor, Tensor, "Metrics"]]
"""A cross term by `cross_loss`: (inputs, settings, sequence ratio [B], own term [B]) -> (term [B] for every
row (the caller keeps its cross rows), [B] bool where the term has no gradient, metrics)."""
RATIO_TERMS: Dict[str, LossTerm] = {}
CROSS_TERMS: Dict[str, CrossTerm] = {}

Metrics = Dict[str, Tensor]


def _register(table: Dict[str, Callable], kind: str, name: str, fn: Callable) -> None:
    """`table[name] = fn`, refusing a name that another function holds (a second registration would silently
    change what every run of that name computes); registering the same function again is a no-op."""
    if table.get(name, fn) is not fn:
        raise ValueError(f"{kind} {name!r} is already registered to {table[name].__qualname__}; pick another name")
    table[name] = fn


def register_ratio_level(name: str) -> Callable[[LossTerm], LossTerm]:
    """Register the policy term of ratio level `name` (`ratio_level`; verl's `register_policy_loss`)."""
    def add(fn: LossTerm) -> LossTerm:
        _register(RATIO_TERMS, "ratio level", name, fn)
        return fn
    return add


def register_cross_loss(name: str) -> Callable[[CrossTerm], CrossTerm]:
    """Register the cross term `name` (`cross_loss`): what partners' responses contribute at sequence level."""
    def add(fn: CrossTerm) -> CrossTerm:
        _register(CROSS_TERMS, "cross loss", name, fn)
        return fn
    return add


@dataclass(frozen=True)
class LossSettings:
    """The algorithm's switches `hacpo_loss` reads, one field per keyword (`AlgorithmConfig.loss_settings()`
    gives them for a preset; docs/algorithms.md says what each does). No defaults of its own: the algorithm's
    defaults live once, in `AlgorithmConfig`, so a direct caller says which algorithm it means
    (`AlgorithmConfig().loss_settings()` is the paper's HACPO, `get_preset(name).loss_settings()` a preset).
    Unknown names and modes are refused here, listing the known ones, before any tensor is read."""

    ratio_level: str
    """A key of `RATIO_TERMS`: `sequence` (GSPO's length-normalised ratio per response, Eq. 11) or `token` (GRPO)."""
    clip_low: float
    """Own ratio clip range starts at 1 - clip_low."""
    clip_high: float
    """Own ratio clip range ends at 1 + clip_high."""
    dual_clip_c: Optional[float]
    """Token level only: where A < 0 and r > c the term is held at c·A (0 or None: off)."""
    cross_loss: str
    """A key of `CROSS_TERMS`: `hacpo` (Eqs. 12-14) or `self` (the own term on partners' responses, naive)."""
    alpha: float
    """Exponent of the detached exponential importance weight on cross terms."""
    cross_clip: bool
    """Clamp the cross ratio to [lower_m, 1]."""
    use_omega: bool
    """Multiply the cross term by omega[source, learner]."""
    loss_agg_mode: str
    """A key of `LOSS_AGG_MODES` (`aggregate_loss`)."""
    kl_coef: float
    """β of the KL to the reference on own responses (0: none)."""
    kl_estimator: str
    """A key of `KL_ESTIMATORS`."""
    rollout_is_cap: float
    """> 0: truncated importance weight of the engine's mismatch on own tokens (0: off)."""
    kl_agg_mode: str
    """A key of `KL_AGG_MODES`: `policy` (as the policy term) or `micro-token-mean` (the paper's code)."""

    def __post_init__(self) -> None:
        for key, known in LOSS_MODES.items():
            if getattr(self, key) not in known:
                raise ValueError(f"unknown {key} {getattr(self, key)!r}: known {sorted(known)}")

    @property
    def clip(self) -> Dict[str, float]:
        return dict(clip_low=self.clip_low, clip_high=self.clip_high)


KL_AGG_MODES = ("policy", "micro-token-mean")
"""How `_kl_loss` reduces the KL: as the policy term, or as the paper's code (a token-mean over each micro-batch's
own tokens divided by the mini-batch's micro-batch count, `kl_micro_batches`)."""
LOSS_MODES = {"ratio_level": RATIO_TERMS, "cross_loss": CROSS_TERMS, "loss_agg_mode": LOSS_AGG_MODES,
              "kl_estimator": KL_ESTIMATORS, "kl_agg_mode": KL_AGG_MODES}
"""The settings that name a registered mode, with the known names (`preflight.name_problems` checks each)."""
SETTINGS: Tuple[str, ...] = tuple(f.name for f in fields(LossSettings))
"""`hacpo_loss`'s setting keywords (`AlgorithmConfig.loss_settings()` gives exactly these; tests/test_config.py
keeps the two equal)."""


@dataclass(frozen=True, eq=False)
class LossInputs:
    """One mini-batch's tensors as the terms read them: padding zeroed, masks boolean, shapes checked."""

    logp_new: Tensor  # [B, T]  with grad; 0 on padding
    loss_mask: Tensor  # [B, T]  as given (True on response tokens)
    mask: Tensor  # [B, T] bool  True on response tokens
    advantages: Tensor  # [B]
    is_own: Tensor  # [B] bool  True where the source is the learner
    own: Tensor  # [B] bool  True on own rows with at least one token
    cross: Tensor  # [B] bool  True on partners' rows with at least one token
    cross_lower: Optional[float]
    old_logp_mean: Optional[Tensor]
    old_logp: Optional[Tensor]
    omega_factor: Optional[Tensor]
    rewards: Optional[Tensor]
    present: Dict[str, bool]  # PRESENCE -> whether the batch holds such rows (host values: branching reads nothing)


def rows_present(loss_mask: Tensor, is_own: Tensor, rewards: Optional[Tensor] = None) -> Dict[str, bool]:
    """`PRESENCE` -> whether the batch holds such rows (the correct / wrong kinds only with `rewards`), read to the
    host in one copy. `hacpo_loss` takes it as
    `present=` computed from the host's copies of `loss_mask`, `is_own` and `rewards` (the caller built the batch
    there), so on a GPU its branches wait for nothing; without it, it computes it here (one synchronisation)."""
    valid = loss_mask.bool().any(dim=-1)  # [B]
    own, cross = is_own.bool() & valid, ~is_own.bool() & valid  # [B], [B]
    kinds = [own, cross]
    if rewards is not None:
        correct = rewards.to(valid.device) > 0  # [B]
        kinds += [own & correct, own & ~correct, cross & correct, cross & ~correct]
    values = torch.stack([k.any() for k in kinds]).tolist()
    return {key: bool(value) for key, value in zip(PRESENCE, values)}


def hacpo_loss(
    *,
    logp_new: Tensor,
    loss_mask: Tensor,
    advantages: Tensor,
    is_own: Tensor,
    cross_lower: Optional[float] = None,
    old_logp_mean: Optional[Tensor] = None,
    old_logp: Optional[Tensor] = None,
    omega_factor: Optional[Tensor] = None,
    ref_logp: Optional[Tensor] = None,
    rewards: Optional[Tensor] = None,
    engine_logp: Optional[Tensor] = None,
    total_tokens: Union[float, Tensor, None] = None,
    total_seqs: Union[float, Tensor, None] = None,
    loss_scale_factor: Optional[float] = None,
    kl_micro_batches: Union[float, Tensor] = 1.0,
    present: Optional[Dict[str, bool]] = None,
    **settings: Any,
) -> Tuple[Tensor, Metrics]:
    """Loss of learner k on one mini-batch (paper Eq. 53: J = J_homo + J_hete; loss = -J aggregated).

    `settings` are the keywords of `LossSettings` (`SETTINGS`; an unknown one is refused, naming them).
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

    The steps, each a small function: the policy term of the ratio level (`RATIO_TERMS`, which at sequence
    level asks `CROSS_TERMS[cross_loss]` for partners' rows), the rollout-IS weight (`_rollout_is_weight`),
    the aggregation (`aggregate_loss` by mode), the KL (`_kl_loss`).

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
      kl_micro_batches      kl_agg_mode == "micro-token-mean": the global mini-batch's micro-batch count (every
                            rank's), which each micro-batch's own-token KL mean is divided by
      rollout_is_cap, engine_logp [B, T]: with a cap > 0, each own response token's policy term is
                            weighted by `truncated_is_weight(old_logp, engine_logp, cap)` (the sampler's
                            log-probs, NaN where unknown; needs old_logp); cross rows keep weight 1
      present               `rows_present` of the host's copies of loss_mask, is_own and rewards (None: computed
                            here, one read to the host); every statistic is a masked reduction, so with it no
                            value is read back and no shape depends on one (it runs on the meta device)
    Returns (loss, metrics); metrics are detached, and keys of an absent part (no own or no cross
    responses in this batch) are left out.

    Diagnostics (sequence level, when `rewards` is given): `diag/{part}_nograd_frac_{answer}` is the
    fraction of the part's (`self`: own, `cross`: partners') correct (reward > 0) or wrong responses
    whose term the clip makes constant, so they carry no gradient:
      cross, "hacpo":  s < lower_m or s > 1, whatever the sign of A (hard clamp); none when cross_clip=False
      own, and cross "self" (naive): s < 1 - clip_low with A < 0, or s > 1 + clip_high with A > 0 (PPO min)
    with its denominator `count/{part}_{answer}` (a fraction whose denominator is 0 is left out).
    """
    s = loss_settings(**settings)
    present = rows_present(loss_mask, is_own, rewards) if present is None else dict(present)
    needed = PRESENCE if rewards is not None else PRESENCE[:2]
    if not set(needed) <= set(present):
        raise ValueError(f"present= lacks {sorted(set(needed) - set(present))}: compute it with "
                         "rows_present(loss_mask, is_own, rewards), the rewards included when the loss is given them")
    x = _inputs(logp_new, loss_mask, advantages, is_own, cross_lower=cross_lower, old_logp_mean=old_logp_mean,
                old_logp=old_logp, omega_factor=omega_factor, rewards=rewards, present=present)
    loss_mat, metrics = RATIO_TERMS[s.ratio_level](x, s)  # [B, T]
    if s.rollout_is_cap > 0:
        loss_mat = loss_mat * _rollout_is_weight(x, s.rollout_is_cap, engine_logp, metrics)  # [B, T]
    # one pair of normalisers for the policy term and the KL, so both scale alike under micro-batching
    agg = dict(mode=s.loss_agg_mode, loss_scale_factor=loss_scale_factor,
               total_tokens=x.mask.sum(dim=-1).sum().clamp(min=1) if total_tokens is None else total_tokens,
               total_seqs=x.mask.any(dim=-1).sum().clamp(min=1) if total_seqs is None else total_seqs)
    policy_loss = -aggregate_loss(loss_mat, x.loss_mask, **agg)
    loss = policy_loss
    metrics["loss/policy"] = policy_loss.detach()
    if s.kl_coef > 0:
        kl = _kl_loss(x, s, ref_logp, agg, micro_batches=kl_micro_batches)
        loss = policy_loss + s.kl_coef * kl
        metrics["loss/kl"] = kl.detach()
    metrics["loss/total"] = loss.detach()
    metrics["count/self"] = x.own.sum().detach()
    metrics["count/cross"] = x.cross.sum().detach()
    return loss, metrics


def loss_settings(**settings: Any) -> LossSettings:
    """`LossSettings` from keywords; an unknown keyword is refused naming the known ones."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise TypeError(f"hacpo_loss got unknown setting(s) {unknown}: known {list(SETTINGS)}")
    missing = [key for key in SETTINGS if key not in settings]
    if missing:
        raise TypeError(f"hacpo_loss is missing setting(s) {missing}: it has no defaults of its own; pass "
                        "**AlgorithmConfig().loss_settings() (the paper's HACPO) or a preset's, e.g. "
                        "**get_preset('grpo').loss_settings(), with your changes after them")
    return LossSettings(**settings)


def _inputs(logp_new: Tensor, loss_mask: Tensor, advantages: Tensor, is_own: Tensor, **optional: Any) -> LossInputs:
    """The checked, normalised inputs: padding zeroed (it may hold anything, even -inf, and must never
    reach the gradient as NaN), masks boolean, own and cross rows those with at least one token."""
    if logp_new.ndim != 2 or logp_new.shape != loss_mask.shape:
        raise ValueError(
            f"logp_new and loss_mask must both be [B, T], got {tuple(logp_new.shape)} and {tuple(loss_mask.shape)}"
        )
    batch = logp_new.shape[0]
    for name, value in (("advantages", advantages), ("is_own", is_own)):
        if value.shape != (batch,):
            raise ValueError(f"{name} must have shape [{batch}], got {tuple(value.shape)}")
    mask = loss_mask.bool()
    valid = mask.any(dim=-1)  # [B]  rows with at least one token
    is_own = is_own.bool()  # [B]
    return LossInputs(logp_new=torch.where(mask, logp_new, torch.zeros_like(logp_new)), loss_mask=loss_mask,
                      mask=mask, advantages=advantages.to(logp_new), is_own=is_own, own=is_own & valid,
                      cross=~is_own & valid, **optional)


# --- the policy term by ratio level -------------------------------------------------------------


@register_ratio_level("sequence")
def _sequence_term(x: LossInputs, s: LossSettings) -> Tuple[Tensor, Metrics]:
    """GSPO's sequence ratio per response (Eq. 11): the own term on own rows, `CROSS_TERMS[cross_loss]` on
    partners' rows, broadcast over each response's tokens; with rewards, which responses have no gradient."""
    old_logp_mean = x.old_logp_mean
    if old_logp_mean is None:
        if x.old_logp is None:
            raise ValueError("sequence-level ratios need old_logp_mean [B] (or old_logp [B, T] for own responses)")
        old_logp_mean = sequence_mean_logp(x.old_logp, x.loss_mask)
    ratio = log_ratio_from_means(sequence_mean_logp(x.logp_new, x.loss_mask), old_logp_mean).exp()  # [B]
    own_term = ppo_clip_term(ratio, x.advantages, **s.clip)  # [B]
    cross_term, cross_nograd, metrics = CROSS_TERMS[s.cross_loss](x, s, ratio, own_term)  # [B], [B]
    term = torch.where(x.is_own, own_term, cross_term)  # [B]
    if x.present["self"]:
        _ppo_metrics(metrics, "self", ratio, x.advantages, x.own, **s.clip)
    if x.rewards is not None:
        batch = ratio.shape[0]
        if x.rewards.shape != (batch,):
            raise ValueError(f"rewards must have shape [{batch}], got {tuple(x.rewards.shape)}")
        correct = x.rewards.to(ratio.device) > 0  # [B]
        _nograd_metrics(metrics, "self", _ppo_nograd(ratio, x.advantages, **s.clip), x.own, correct, x.present)
        _nograd_metrics(metrics, "cross", cross_nograd, x.cross, correct, x.present)
    return term[:, None].expand_as(x.logp_new), metrics  # [B, T]


@register_ratio_level("token")
def _token_term(x: LossInputs, s: LossSettings) -> Tuple[Tensor, Metrics]:
    """GRPO's per-token ratios with the own term (and verl's dual-clip); own responses only."""
    if x.present["cross"]:
        raise ValueError(
            "ratio_level='token' compares log-probs token by token and needs one tokenization: it "
            "supports own responses only; use ratio_level='sequence' for shared rollouts"
        )
    if x.old_logp is None:
        raise ValueError("ratio_level='token' needs old_logp [B, T] in the learner's tokenization")
    old_logp = torch.where(x.mask, x.old_logp.to(x.logp_new), torch.zeros_like(x.logp_new))  # [B, T]
    ratio = token_log_ratio(x.logp_new, old_logp).exp()  # [B, T]
    advantages = x.advantages[:, None]  # [B, 1]
    loss_mat = ppo_clip_term(ratio, advantages, **s.clip, dual_clip_c=s.dual_clip_c)  # [B, T]
    metrics: Metrics = {}
    own_tokens = x.mask & x.own[:, None]  # [B, T]
    if x.present["self"]:
        _ppo_metrics(metrics, "self", ratio, advantages.expand_as(ratio), own_tokens, **s.clip)
    if s.dual_clip_c and x.present["self"]:  # tokens the dual-clip holds at c·A (verl's pg_clipfrac_lower)
        held = (advantages < 0) & (ppo_clip_term(ratio.detach(), advantages, **s.clip)
                                   < s.dual_clip_c * advantages)  # [B, T]
        metrics["clip/self_dual_frac"] = _masked_mean(held.float(), own_tokens)
    return loss_mat, metrics


# --- the cross term by cross_loss (sequence level) ------------------------------------------------


@register_cross_loss("hacpo")
def _hacpo_cross(x: LossInputs, s: LossSettings, ratio: Tensor, own_term: Tensor) -> Tuple[Tensor, Tensor, Metrics]:
    """HACPO's cross term (Eqs. 12-14) for every row, and its metrics: the clamp [lower_m, 1] makes the
    term constant outside it, whatever the sign of A."""
    lower = x.cross_lower
    if lower is None:
        if x.present["cross"]:
            raise ValueError("cross responses with cross_loss='hacpo' need cross_lower (lower_m of Eq. 14, "
                             "e.g. `cross_clip_lower(m, delta, delta_step)`)")
        lower = 1.0  # no cross row reads it
    lower = float(lower)
    omega_factor = _omega(x, ratio, s.use_omega)  # [B]
    term = hacpo_cross_term(ratio, x.advantages, omega_factor, lower=lower, alpha=s.alpha, clip=s.cross_clip)
    r = ratio.detach()  # [B]
    nograd = ((r < lower) | (r > 1.0)) if s.cross_clip else torch.zeros_like(r, dtype=torch.bool)  # [B]
    metrics: Metrics = {}
    if x.present["cross"]:
        low = (r < lower) if s.cross_clip else torch.zeros_like(r, dtype=torch.bool)  # [B]
        high = (r > 1.0) if s.cross_clip else torch.zeros_like(r, dtype=torch.bool)  # [B]
        metrics.update(_ratio_stats("cross", r, x.cross))
        metrics.update(_fractions("cross", low, high, x.cross))
        metrics["clip/cross_lower"] = r.new_tensor(lower)
        metrics["omega/cross_mean"] = _masked_mean(omega_factor.detach(), x.cross)
    return term, nograd, metrics


@register_cross_loss("self")
def _self_cross(x: LossInputs, s: LossSettings, ratio: Tensor, own_term: Tensor) -> Tuple[Tensor, Tensor, Metrics]:
    """Naive sharing: the own-response term on partners' responses too."""
    metrics: Metrics = {}
    if x.present["cross"]:
        _ppo_metrics(metrics, "cross", ratio, x.advantages, x.cross, **s.clip)
    return own_term, _ppo_nograd(ratio, x.advantages, **s.clip), metrics


def _omega(x: LossInputs, ratio: Tensor, use_omega: bool) -> Tensor:
    """[B] omega[source, k] per row; ones without the factor (and where no cross row needs it)."""
    omega_factor = x.omega_factor
    if not use_omega:
        omega_factor = torch.ones_like(ratio)
    elif omega_factor is None:
        if x.present["cross"]:
            raise ValueError("cross responses with use_omega need omega_factor [B] = omega[source, learner]")
        omega_factor = torch.ones_like(ratio)
    elif omega_factor.shape != ratio.shape:
        raise ValueError(f"omega_factor must have shape {tuple(ratio.shape)}, got {tuple(omega_factor.shape)}")
    return omega_factor.to(ratio)


RATIO_LEVELS = tuple(RATIO_TERMS)
"""`sequence`: GSPO's length-normalised ratio per response (Eq. 11); `token`: per-token ratios (GRPO)."""
CROSS_LOSSES = tuple(CROSS_TERMS)
"""`hacpo`: the cross term of Eqs. 12-14; `self`: the own-response term applied to partners' responses (naive)."""


# --- the steps after the policy term --------------------------------------------------------------


def _rollout_is_weight(x: LossInputs, cap: float, engine_logp: Optional[Tensor], metrics: Metrics) -> Tensor:
    """[B, T] truncated importance weight of own tokens (`truncated_is_weight`), 1 on partners' rows."""
    if x.old_logp is None or engine_logp is None:
        raise ValueError(f"rollout_is_cap={cap} needs old_logp and engine_logp [B, T] of own responses")
    own_tokens = x.mask & x.own[:, None]  # [B, T]
    weight = truncated_is_weight(x.old_logp.to(x.logp_new), engine_logp, own_tokens, cap=cap)  # [B, T]
    if x.present["self"]:
        metrics["rollout_is/weight_mean"] = _masked_mean(weight, own_tokens)
        metrics["rollout_is/capped_frac"] = _masked_mean((weight >= cap).float(), own_tokens)
    return weight


def _kl_loss(x: LossInputs, s: LossSettings, ref_logp: Optional[Tensor], agg: Dict[str, Any], *,
             micro_batches: Union[float, Tensor] = 1.0) -> Tensor:
    """The KL to the reference on own tokens, aggregated like the policy term (`policy`), or as the paper's code
    (`micro-token-mean`): Σ k3 over this micro-batch's own tokens / (their count + 1e-8), divided by the
    mini-batch's micro-batch count, so the micro-batches' terms sum to their mean."""
    if ref_logp is None:
        raise ValueError(f"kl_coef={s.kl_coef} > 0 needs ref_logp [B, T] from the learner's reference model")
    ref_logp = torch.where(x.mask, ref_logp.to(x.logp_new), torch.zeros_like(x.logp_new))  # [B, T]
    per_token = kl_penalty(x.logp_new, ref_logp, estimator=s.kl_estimator)                   # [B, T]
    own = x.mask & x.own[:, None]
    if s.kl_agg_mode == "micro-token-mean":
        return (per_token * own).sum() / (own.sum() + 1e-8) / micro_batches
    return aggregate_loss(per_token, own, **agg)


def _ppo_metrics(
    metrics: Metrics, part: str, ratio: Tensor, advantages: Tensor, select: Tensor, *, clip_low: float,
    clip_high: float
) -> None:
    """Ratio stats and clip fractions of a PPO-clipped part over the `select`ed responses (or tokens; at least
    one). One counts as clipped low / high when the clip zeroes its gradient: r < 1 - clip_low with A < 0,
    r > 1 + clip_high with A > 0."""
    r, a = ratio.detach(), advantages.detach()
    low = (r < 1.0 - clip_low) & (a < 0)
    high = (r > 1.0 + clip_high) & (a > 0)
    metrics.update(_ratio_stats(part, r, select))
    metrics.update(_fractions(part, low, high, select))


def _ppo_nograd(ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float) -> Tensor:
    """[B] bool: where `ppo_clip_term`'s min picks the clipped, constant side, so the term has no gradient."""
    r, a = ratio.detach(), advantages.detach()
    return ((r < 1.0 - clip_low) & (a < 0)) | ((r > 1.0 + clip_high) & (a > 0))


def _nograd_metrics(metrics: Metrics, part: str, nograd: Tensor, select: Tensor, correct: Tensor,
                    present: Dict[str, bool]) -> None:
    """Per answer (correct / wrong) among the `select`ed rows: their count and the fraction without gradient
    (left out where there are none, as `present` says)."""
    if not present[part]:
        return
    for answer, rows in (("correct", select & correct), ("wrong", select & ~correct)):  # [B], [B]
        metrics[f"count/{part}_{answer}"] = rows.sum().detach()
        if present[f"{part}_{answer}"]:
            metrics[f"diag/{part}_nograd_frac_{answer}"] = _masked_mean(nograd.float(), rows)


def _masked_mean(values: Tensor, select: Tensor) -> Tensor:
    """The mean of `values` where `select` (same shape; at least one), without indexing by the mask (whose
    result's size a GPU would have to report back first)."""
    return torch.where(select, values, torch.zeros_like(values)).sum() / select.sum()


def _ratio_stats(part: str, r: Tensor, select: Tensor) -> Metrics:
    inf = torch.full_like(r, float("inf"))
    return {f"ratio/{part}_mean": _masked_mean(r, select), f"ratio/{part}_min": torch.where(select, r, inf).amin(),
            f"ratio/{part}_max": torch.where(select, r, -inf).amax()}


def _fractions(part: str, low: Tensor, high: Tensor, select: Tensor) -> Metrics:
    return {
        f"clip/{part}_low_frac": _masked_mean(low.float(), select),
        f"clip/{part}_high_frac": _masked_mean(high.float(), select),
        f"clip/{part}_frac": _masked_mean((low | high).float(), select),
    }
