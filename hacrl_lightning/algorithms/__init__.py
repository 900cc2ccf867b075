"""The HACPO algorithm core: pure tensor functions, no Lightning, no models, no Hydra.

See docs/algorithms.md for each function beside the paper equation it implements. The trainer's
calls per step: `CapabilityWindow.update/omega` -> `compute_advantages` -> `select_cross_samples`
-> `hacpo_loss` per mini-batch.
"""

from hacrl_lightning.algorithms.advantages import (
    compute_advantages,
    group_advantages,
    hacpo_advantages,
    hacpo_baseline,
)
from hacrl_lightning.algorithms.capability import CapabilityWindow, capability_ratios, step_accuracy
from hacrl_lightning.algorithms.losses import (
    MAX_ABS_LOG_RATIO,
    aggregate_loss,
    cross_clip_lower,
    hacpo_cross_term,
    kl_penalty,
    log_ratio_from_means,
    ppo_clip_term,
    sequence_log_ratio,
    sequence_mean_logp,
    token_log_ratio,
    truncated_is_weight,
)
from hacrl_lightning.algorithms.metrics import avg_at_k, pass_at_k, unbiased_pass_at_k
from hacrl_lightning.algorithms.objective import hacpo_loss
from hacrl_lightning.algorithms.sampling import select_cross_samples

__all__ = [
    "MAX_ABS_LOG_RATIO",
    "CapabilityWindow",
    "aggregate_loss",
    "avg_at_k",
    "capability_ratios",
    "compute_advantages",
    "cross_clip_lower",
    "group_advantages",
    "hacpo_advantages",
    "hacpo_baseline",
    "hacpo_cross_term",
    "hacpo_loss",
    "kl_penalty",
    "log_ratio_from_means",
    "pass_at_k",
    "ppo_clip_term",
    "select_cross_samples",
    "sequence_log_ratio",
    "sequence_mean_logp",
    "step_accuracy",
    "token_log_ratio",
    "truncated_is_weight",
    "unbiased_pass_at_k",
]
