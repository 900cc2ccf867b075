"""Algorithm presets by name: the baselines and ablations of docs/spec.md §9, and how an experiment's
per-pair values combine with them.

A preset is an `AlgorithmConfig` whose switches say which HACPO component is on. Each preset
differs from `hacpo` only in the component it names (`defining_values`). This module is the presets'
source and `AlgorithmConfig` the defaults': `configs/algorithm/<name>.yaml` holds, for Hydra, only the
fields in which the preset differs from the file it starts from (tests/test_config.py keeps them equal). An experiment's `PairConfig` (Table 5:
alpha, delta, delta_step) is resolved into the chosen preset by `resolve_algorithm`, and
`composition_problems` refuses what cannot be honoured; both are pure functions of dataclasses.
Deliberately not here: the math (`hacrl_lightning.algorithms` reads the switches and does not import
this module), the check that `algorithm.name` is a preset (`preflight.name_problems`), and Hydra
(`hacrl_lightning/cli.py` finds which keys the command line set and calls these).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Collection

from hacrl_lightning.config import AlgorithmConfig, PairConfig
from hacrl_lightning.errors import Problem, suggest

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
    # the code behind the paper's numbers (docs/spec.md §11), two agents: learner 2 trains its partner's rows
    # first, learner 1's partner advantages span the source's tokens, the KL is a micro-batch token-mean
    "hacpo_paper_main": replace(_HACPO, name="hacpo_paper_main", learner_order="paper_main",
                                partner_advantage_span="source", kl_agg_mode="micro-token-mean"),
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


# ---------------------------------------------------------------------------------------------------
# experiments: per-pair values (PairConfig) on top of the chosen preset

PAIR_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PairConfig))

TUNABLE: frozenset[str] = frozenset({"clip_low", "clip_high"})
"""Defining values that the command line may still tune for one run: grpo with another clip range is
still GRPO. Every other defining value is a component switch (or mode) and may not be changed under the
preset's name. Experiment files may change none of them: their values are shared by every algorithm."""


def defining_values(name: str) -> dict[str, Any]:
    """What makes preset `name` that preset: the fields in which it differs from `hacpo`, with its values
    (`hacpo_alpha0` -> {alpha: 0.0}; `grpo` -> share_rollouts, advantage, ..., clip_low, clip_high)."""
    preset, base = get_preset(name), PRESETS["hacpo"]
    return {f.name: getattr(preset, f.name) for f in fields(AlgorithmConfig)
            if f.name != "name" and getattr(preset, f.name) != getattr(base, f.name)}


def has_hacpo_cross_term(cfg: AlgorithmConfig) -> bool:
    """The HACPO family: learners train on partners' responses with HACPO's cross term, the only term that
    reads alpha, delta and delta_step. Not grpo/gspo/gspo_x2 (no shared rollouts) nor naive (`cross_loss=self`)."""
    return cfg.share_rollouts and cfg.cross_loss == "hacpo"


def pair_fields_taken(name: str) -> tuple[str, ...]:
    """The pair fields preset `name` takes: none without HACPO's cross term; otherwise those it does not
    define (`hacpo_alpha0` takes delta and delta_step, never alpha)."""
    preset = PRESETS.get(name)
    if preset is None or not has_hacpo_cross_term(preset):
        return ()
    defined = defining_values(name)
    return tuple(key for key in PAIR_FIELDS if key not in defined)


def resolve_algorithm(alg: AlgorithmConfig, pair: PairConfig, explicit: Collection[str] = ()) -> AlgorithmConfig:
    """`alg` with the pair's values where they apply: the fields its preset takes (`pair_fields_taken`)
    that the command line did not set. `explicit` holds the dotted keys given on the command line
    (`algorithm.alpha`, `pair.delta`); an explicit `algorithm.<field>` wins over the pair."""
    values = {key: getattr(pair, key) for key in pair_fields_taken(alg.name)
              if getattr(pair, key) is not None and f"algorithm.{key}" not in explicit}
    return replace(alg, **values)


def composition_problems(alg: AlgorithmConfig, pair: PairConfig, explicit: Collection[str] = ()) -> list[Problem]:
    """What cannot be honoured in the composed `alg` + `pair` (before resolving), one Problem each:

    - `algorithm.name` set directly (the values would be another preset's);
    - a defining value of the preset changed by a config file (an experiment's `algorithm:` block), or by
      the command line unless it is TUNABLE (`hacpo_alpha0 algorithm.alpha=3` would run hacpo);
    - an explicit `pair.<field>` that the preset does not take, or that contradicts an explicit
      `algorithm.<field>`.
    """
    if "algorithm.name" in explicit:
        return [Problem("algorithm.name", alg.name, "the preset chosen with algorithm=<name>",
                        f"write algorithm={alg.name} (not algorithm.name=...) so that its values load")]
    if alg.name not in PRESETS:
        return []  # `preflight.name_problems` names the unknown preset
    problems = []
    for key, value in defining_values(alg.name).items():
        got = getattr(alg, key)
        if got == value or (key in TUNABLE and f"algorithm.{key}" in explicit):
            continue
        allowed = f"{value!r}, which defines algorithm={alg.name}"
        if f"algorithm.{key}" in explicit:
            fix = (f"drop algorithm.{key}={got} to run {alg.name}, "
                   f"or run algorithm={_closest_preset(alg)} algorithm.{key}={got}")
        else:
            where = " or give it under `pair:`, which applies only where it fits" if key in PAIR_FIELDS else ""
            fix = (f"a config file (an experiment's `algorithm:` block?) sets algorithm.{key} "
                   f"for every algorithm: drop it{where}")
        problems.append(Problem(f"algorithm.{key}", got, allowed, fix))
    taken = pair_fields_taken(alg.name)
    for key in PAIR_FIELDS:
        value = getattr(pair, key)
        if value is None or f"pair.{key}" not in explicit:
            continue
        if key not in taken:
            takers = [name for name in preset_names() if key in pair_fields_taken(name)]
            why = (f"{alg.name} fixes {key} = {defining_values(alg.name)[key]!r}" if has_hacpo_cross_term(PRESETS[alg.name])
                   else f"{alg.name} has no HACPO cross term, the only term that reads {key}")
            problems.append(Problem(f"pair.{key}", value, f"an algorithm that takes it: {takers}",
                                    f"{why}: drop pair.{key}={value}, or pick one of those algorithms"))
        elif f"algorithm.{key}" in explicit and getattr(alg, key) != value:
            problems.append(Problem(f"pair.{key}", value, f"one value, as pair.{key} or as algorithm.{key}",
                                    f"algorithm.{key}={getattr(alg, key)} is given too: keep only one"))
    return problems


def _closest_preset(cfg: AlgorithmConfig) -> str:
    """The preset whose defining values `cfg` has, the most specific one; `hacpo` (it defines nothing) on a tie."""
    fits = {name: len(values) for name in PRESETS for values in [defining_values(name)]
            if all(getattr(cfg, key) == value for key, value in values.items())}
    best = [name for name, size in fits.items() if size == max(fits.values())]
    return best[0] if len(best) == 1 else "hacpo"
