"""hacrl_lightning: N heterogeneous LLM agents trained together with RL from verifiable rewards (HACPO),
on PyTorch Lightning.

    from hacrl_lightning import compose_config, train
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "trainer.steps=10"])
    summary = train(cfg)

The names below are loaded on first use (PEP 562 `__getattr__`), so importing this package, or a
light module such as `hacrl_lightning.config`, imports neither torch, Lightning nor Hydra. The
modules: `config` (typed configs, value checks), `errors`, `presets` (algorithms by name),
`preflight` (name, file and tokenizer checks), `hub` (the model hub as this machine sees it),
`cli` (Hydra composition, the only module that imports Hydra), `entry` (the console scripts),
`agents`, `zoo` (the offline tiny agents: recipes, builds, the cache), `rollout`, `exchange` (responses between agents: each learner's token view of them), `rewards`,
`data`, `algorithms` (pure tensor functions), `reference` (one HACPO
step top to bottom in plain PyTorch + transformers: read it first), `plan` (a step's global
plan of mini-batches and each rank's passes), `architecture` (a model's numbers from its config.json, nothing
loaded), `memory` (the per-GPU memory plan of a run), `loss_stats` (loss metrics reduced
over micro-batches and ranks), `step` (a training step's contract: `PromptBatch`, `StepBatch`),
`step_metrics` (a step's scalars, pure),
`update` (a micro-batch's loss inputs), `placement` (which agents live on which ranks),
`offload` (an idle agent's training state in host memory), `grad_share` (the gradient-share
diagnostic), `cross_ratios` (partners' cross ratios against the clip bounds), `pair_ratios` (a pair's,
before a run), `files` (durable atomic writes), `safe_load` (checkpoints and YAML from others, read without running
their code), `failures` (faults that end a run in one line), `module`, `datamodule`, `callbacks`, `strategies`,
`compiling` (torch.compile of the agents' log-prob passes), `training` (one run,
config to summary), `run_dir` (claiming a run directory), `resume` (what a resume may change),
`console` (a quiet console), `scoring` (a held-out set answered and scored), `collective` (what the agents
know together: union and majority-vote accuracy from answers already scored), `evaluation`, `experiments` (comparisons over seeds), `bench` (benchmarks).
Deliberately not here: any code but this table of names.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # a run, from overrides to a summary
    "compose_config": "hacrl_lightning.cli",
    "compose_evaluate": "hacrl_lightning.cli",
    "train": "hacrl_lightning.training",
    # configuration
    "AgentConfig": "hacrl_lightning.config",
    "AlgorithmConfig": "hacrl_lightning.config",
    "DataConfig": "hacrl_lightning.config",
    "EvaluateConfig": "hacrl_lightning.config",
    "PairConfig": "hacrl_lightning.config",
    "RolloutConfig": "hacrl_lightning.config",
    "TrainConfig": "hacrl_lightning.config",
    "TrainerConfig": "hacrl_lightning.config",
    "ConfigError": "hacrl_lightning.errors",
    "Problem": "hacrl_lightning.errors",
    "check_run": "hacrl_lightning.preflight",
    "validate": "hacrl_lightning.preflight",
    "PRESETS": "hacrl_lightning.presets",
    "get_preset": "hacrl_lightning.presets",
    # the parts
    "Agent": "hacrl_lightning.agents",
    "AgentLoadError": "hacrl_lightning.agents",
    "Rollout": "hacrl_lightning.exchange",
    "make_rollouts": "hacrl_lightning.exchange",
    "view_for": "hacrl_lightning.exchange",
    "Generation": "hacrl_lightning.rollout",
    "SamplingSettings": "hacrl_lightning.rollout",
    "make_engine": "hacrl_lightning.rollout",
    "hacpo_loss": "hacrl_lightning.algorithms",
    "RewardPool": "hacrl_lightning.rewards",
    "get_reward": "hacrl_lightning.rewards",
    "HACRLModule": "hacrl_lightning.module",
    "RolloutDataModule": "hacrl_lightning.datamodule",
    "evaluate_agents": "hacrl_lightning.evaluation",
    "load_eval_agents": "hacrl_lightning.evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hacrl_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
