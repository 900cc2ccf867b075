"""Algorithm presets by name: the baselines and ablations of HACPO_SPEC §9.

A preset is an `AlgorithmConfig` whose switches say which HACPO component is on. Each preset
differs from `hacpo` only in the component it names; `configs/algorithm/<name>.yaml` holds the
same values for Hydra (a test keeps the two equal). Deliberately not here: the math (see
`advantages.py` and `losses.py`), which reads the switches.
"""

from __future__ import annotations

from dataclasses import replace

from hacrl_lightning.config import AlgorithmConfig, suggest

_HACPO = AlgorithmConfig(name="hacpo")
_GSPO = replace(
    _HACPO, name="gspo", share_rollouts=False, advantage="group", capability_baseline=False,
)

PRESETS: dict[str, AlgorithmConfig] = {
    "hacpo": _HACPO,
    # Table 2: omega ≡ 1 in the baseline only
    "hacpo_no_adv": replace(_HACPO, name="hacpo_no_adv", capability_baseline=False),
    # Table 3: no omega factor on the cross term only
    "hacpo_no_omega": replace(_HACPO, name="hacpo_no_omega", omega_factor=False),
    # Table 4: no exponential importance weight
    "hacpo_alpha0": replace(_HACPO, name="hacpo_alpha0", alpha=0.0),
    # Figure 4: fixed lower bound 1 - delta
    "hacpo_no_stepwise": replace(_HACPO, name="hacpo_no_stepwise", delta_step=0.0),
    # Figure 4: cross ratio unclipped
    "hacpo_no_clip": replace(_HACPO, name="hacpo_no_clip", cross_clip=False),
    # shared rollouts with no mechanism: unweighted joint baseline, own-response GSPO term for cross
    # responses (so no alpha, no stepwise bound, no omega factor)
    "naive": replace(
        _HACPO, name="naive", capability_baseline=False, cross_loss="self",
        alpha=0.0, delta_step=0.0, omega_factor=False,
    ),
    "gspo": _GSPO,
    # 2G responses per prompt, half the prompts per mini-batch: HACPO's update count at twice the rollouts
    "gspo_x2": replace(_GSPO, name="gspo_x2", rollout_multiplier=2),
    "grpo": replace(
        _GSPO, name="grpo", ratio_level="token", clip_low=0.2, clip_high=0.28, loss_agg_mode="token-mean",
    ),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> AlgorithmConfig:
    """The preset called `name`; an unknown name raises KeyError listing the valid ones."""
    if name not in PRESETS:
        raise KeyError(f"unknown algorithm {name!r}: {suggest(name, PRESETS)}")
    return replace(PRESETS[name])
