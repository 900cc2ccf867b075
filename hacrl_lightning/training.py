"""Run one training job from a validated `TrainConfig`: agents, Lightning Trainer, exports, summary.

`train(cfg)` is what `scripts/train.py` (and `scripts/compare.py`) call: it loads the agents,
wires the module, DataModule, callbacks and TensorBoard logger, fits (resuming when asked),
exports each agent as a standalone Hugging Face directory and writes `summary.json` in the run
directory. Deliberately not here: Hydra (the scripts compose the config) and any training math.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.algorithms.capability import CapabilityWindow
from hacrl_lightning.callbacks.capability import CapabilityCallback
from hacrl_lightning.callbacks.checkpoint import StepCheckpoint, latest_checkpoint
from hacrl_lightning.callbacks.clip_schedule import StepwiseClipCallback
from hacrl_lightning.callbacks.hparams import ConfigHParams
from hacrl_lightning.callbacks.progress import PlainProgress, interactive
from hacrl_lightning.callbacks.timing import StepTimer
from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
from hacrl_lightning.callbacks.weight_sync import WeightSyncCallback
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.console import quiet_libraries
from hacrl_lightning.data.records import PromptDataset
from hacrl_lightning.data.tasks import load_task, task_check_texts
from hacrl_lightning.datamodule import RolloutDataModule
from hacrl_lightning.module import HACRLModule, UpdateSettings
from hacrl_lightning.strategies import lightning_precision, make_strategy


def load_agents(cfg: TrainConfig, task: tuple[PromptDataset, PromptDataset] | None = None) -> dict[str, Agent]:
    """Every configured agent, in config order (= optimizer order), checked lossless on the task's texts
    (`task`: the (train, held-out) sets when already loaded). Weights load in fp32, whatever an agent's
    `dtype`: they are the master weights (docs/training.md)."""
    texts = task_check_texts(task if task is not None else load_task(cfg.data))
    return {name: Agent.load(name, agent_cfg, zoo_cache=cfg.zoo_cache, check_texts=texts, dtype=torch.float32)
            for name, agent_cfg in cfg.agents.items()}


def update_settings(cfg: TrainConfig) -> UpdateSettings:
    """The update loop's sizes and limits from the run config."""
    mini_batch_size = (cfg.trainer.mini_batch_prompts // cfg.algorithm.rollout_multiplier) * cfg.responses_per_prompt
    return UpdateSettings(mini_batch_size=mini_batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
                          max_nonfinite_skips=cfg.trainer.max_nonfinite_skips, precision=cfg.trainer.precision,
                          seed=cfg.seed)


def make_datamodule(cfg: TrainConfig, agents: dict[str, Agent],
                    task: tuple[PromptDataset, PromptDataset] | None = None) -> RolloutDataModule:
    """The run's DataModule over `agents` (`task`: the loaded (train, held-out) sets, else loaded here)."""
    train_set, eval_set = task if task is not None else load_task(cfg.data)
    return RolloutDataModule(agents, train_set=train_set, eval_set=eval_set, data=cfg.data, rollout=cfg.rollout,
                             responses_per_prompt=cfg.responses_per_prompt, share_rollouts=cfg.algorithm.share_rollouts,
                             steps=cfg.trainer.steps, seed=cfg.seed, engine_dir=Path(cfg.run_dir) / "engine_dirs")


def build_system(cfg: TrainConfig, run_dir: Path) -> tuple[HACRLModule, RolloutDataModule, list[pl.Callback], dict]:
    """The run's module, DataModule and core callbacks (capability window, clip schedule, weight sync,
    step timer, plain progress lines when stdout is not a terminal, held-out evaluation, checkpoints), each
    given the values it uses; the task loads once.
    Returns them and the callbacks by role (`timer`, `evaluation`) for the summary."""
    task = load_task(cfg.data)
    agents = load_agents(cfg, task)
    names = list(agents)
    window = CapabilityWindow(len(names), **cfg.algorithm.capability_settings())
    clip_schedule = StepwiseClipCallback(delta=cfg.algorithm.delta, delta_step=cfg.algorithm.delta_step)
    module = HACRLModule(agents, algorithm=cfg.algorithm, update=update_settings(cfg), capability=window,
                         clip_schedule=clip_schedule)
    datamodule = make_datamodule(cfg, agents, task)
    roles = {"timer": StepTimer(),
             "evaluation": HeldOutEvalCallback(every=cfg.trainer.eval_every, samples=cfg.trainer.eval_samples)}
    callbacks = [
        CapabilityCallback(window, names),
        clip_schedule,
        WeightSyncCallback(),
        roles["timer"],  # after weight sync (part of a step), before evaluation (not part of it)
        *([] if interactive() else [PlainProgress(every=cfg.trainer.progress_every, steps=cfg.trainer.steps,
                                                  timer=roles["timer"])]),
        roles["evaluation"],
        StepCheckpoint(run_dir / "checkpoints", every=cfg.trainer.checkpoint_every),
    ]
    return module, datamodule, callbacks, roles


def build_trainer(cfg: TrainConfig, run_dir: Path, callbacks: list[pl.Callback]) -> pl.Trainer:
    logger = TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False)
    tr = cfg.trainer
    return pl.Trainer(
        accelerator=tr.accelerator, devices=tr.devices, num_nodes=tr.num_nodes, strategy=make_strategy(tr),
        precision=lightning_precision(tr), max_epochs=1, logger=logger, callbacks=[*callbacks, ConfigHParams(cfg)],
        log_every_n_steps=tr.log_every, enable_checkpointing=False, use_distributed_sampler=False,
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=str(run_dir),
        enable_progress_bar=interactive(),  # not a terminal: PlainProgress prints lines instead
    )


def train(cfg: TrainConfig, *, extra_callbacks: list[pl.Callback] = ()) -> dict[str, Any]:
    """Fit, export and summarise one run; returns the summary (also written to summary.json).

    `extra_callbacks` are appended to the run's own (capability window, clip schedule, weight
    sync, held-out evaluation, checkpoints)."""
    started = time.perf_counter()
    quiet_libraries()
    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)

    module, datamodule, callbacks, roles = build_system(cfg, run_dir)
    evaluation, timer = roles["evaluation"], roles["timer"]
    trainer = build_trainer(cfg, run_dir, [*callbacks, *extra_callbacks])
    ckpt_path = str(latest_checkpoint(cfg.resume)) if cfg.resume else None
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)

    exports = {}
    if cfg.trainer.export_agents:
        for name, agent in module.agents.items():
            exports[name] = str(agent.export(run_dir / "exports" / name))
    summary = make_summary(cfg, module, evaluation, exports, wall_s=time.perf_counter() - started, timer=timer)
    if trainer.is_global_zero:
        tmp = run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, run_dir / "summary.json")
    return summary


def make_summary(cfg: TrainConfig, module: HACRLModule, evaluation: HeldOutEvalCallback,
                 exports: dict[str, str], *, wall_s: float, timer: StepTimer) -> dict[str, Any]:
    agents = {}
    for name in module.names:
        agents[name] = {
            "initial": evaluation.initial.get(name, {}),
            "final": evaluation.final.get(name, {}),
            "steps": module.steps_done,
            **module.counters[name],
            "export": exports.get(name),
        }
    return {
        "algorithm": cfg.algorithm.name,
        "seed": cfg.seed,
        "steps": module.steps_done,
        "wall_s": round(wall_s, 2),
        "train_s": round(timer.train_s, 2),
        "step_s": round(timer.step_s, 4),
        "run_dir": str(Path(cfg.run_dir).resolve()),
        "agents": agents,
        "eval_history": evaluation.history,
    }
