"""Run one training job from a validated `TrainConfig`: agents, Lightning Trainer, exports, summary.

`train(cfg)` is what `scripts/train.py` (and `scripts/compare.py`) call: it claims the run directory,
loads the agents, wires the module, DataModule, callbacks and TensorBoard logger, fits (resuming or
forking when asked; stopping cleanly on SIGINT/SIGTERM), exports each agent as a standalone Hugging
Face directory and writes `summary.json` (how the run ended, its clocks, every agent's figures) in the
run directory, before `trainer.keep_at_end` deletes any checkpoint (a summary that cannot be written deletes
nothing). Checkpoints go through `LocalCheckpointIO` (written where they live, never first in `$TMPDIR`). Deliberately not here: Hydra (the scripts compose the config), the rules of what a
run directory and a resume may hold (`run_dir.py`, `resume.py`) and any training math.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import threading
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.algorithms.capability import CapabilityWindow
from hacrl_lightning.callbacks.capability import CapabilityCallback
from hacrl_lightning.callbacks.checkpoint import CHECKPOINT_RE, LocalCheckpointIO, StepCheckpoint, latest_checkpoint, \
    newest_weights, resume_checkpoint
from hacrl_lightning.callbacks.interrupt import RunInterrupted, StopOnSignal, catch_signals, signals_deferred
from hacrl_lightning.callbacks.no_signal import NoSignalWarning
from hacrl_lightning.callbacks.clip_schedule import StepwiseClipCallback
from hacrl_lightning.callbacks.hparams import ConfigHParams
from hacrl_lightning.callbacks.progress import PlainProgress, interactive
from hacrl_lightning.callbacks.timing import StepTimer
from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
from hacrl_lightning.callbacks.weight_sync import WeightSyncCallback
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.console import quiet_libraries
from hacrl_lightning.data.records import PromptDataset
from hacrl_lightning.errors import ConfigError, Problem, RunFailed
from hacrl_lightning.files import write_atomically
from hacrl_lightning.data.tasks import load_task, task_check_texts
from hacrl_lightning.compiling import compile_agent, compile_wanted
from hacrl_lightning.datamodule import RolloutDataModule
from hacrl_lightning.module import HACRLModule, UpdateSettings
from hacrl_lightning.offload import Residency
from hacrl_lightning.placement import Placement, launch_rank, on_every_rank
from hacrl_lightning.resume import adapt_checkpoint, config_dict, resume_changes
from hacrl_lightning.run_dir import claim_run_dir, linked_exports_problem, run_dir_of
from hacrl_lightning.strategies import lightning_precision, make_strategy


DIAGNOSTICS = ("cross_nograd_frac_correct", "cross_nograd_frac_wrong", "self_nograd_frac_correct",
               "self_nograd_frac_wrong", "cross_grad_share", "grad_cos_self_cross", "grad_norm_self", "grad_norm_cross")
"""The `{agent}/diag/*` metrics a summary's `diagnostics` block averages over steps (docs/training.md#diagnostics)."""


def load_agents(cfg: TrainConfig, task: tuple[PromptDataset, PromptDataset] | None = None, *,
                only: tuple[str, ...] | None = None) -> dict[str, Agent]:
    """Every configured agent (or those in `only`: this rank's, `trainer.placement=split`), in config order
    (= optimizer order), checked lossless on the task's texts (`task`: the (train, held-out) sets when already
    loaded). Weights load in fp32, whatever an agent's `dtype`: they are the master weights (docs/training.md)."""
    texts = task_check_texts(task if task is not None else load_task(cfg.data))
    return {name: Agent.load(name, agent_cfg, zoo_cache=cfg.zoo_cache, check_texts=texts, dtype=torch.float32)
            for name, agent_cfg in cfg.agents.items() if only is None or name in only}


def run_placement(cfg: TrainConfig) -> Placement:
    """Which agents live on this process's rank (`placement.py`); under `split` with sizes left to the plan,
    groups in proportion to each agent's parameter count (from its config.json; nothing loads)."""
    weights = None
    if cfg.trainer.placement == "split" and not all(agent.ranks for agent in cfg.agents.values()):
        from hacrl_lightning.architecture import architecture_of

        weights = {name: architecture_of(name, agent, zoo_cache=cfg.zoo_cache).parameters
                   for name, agent in cfg.agents.items()}
    return Placement.of(cfg, rank=launch_rank(cfg.trainer.devices), weights=weights)


def run_engine_shares(cfg: TrainConfig, placement: Placement) -> dict[str, float] | None:
    """Each agent's vLLM engine memory share (`placement.engine_shares`: on vLLM's CPU build summed over this
    machine's engines, those left unset scaled to fit, said once), None for the transformers backend. Shares
    that cannot fit raise `ConfigError` (the preflight refuses them before; the machine may have filled since)."""
    if cfg.rollout.backend != "vllm":
        return None
    import psutil

    from hacrl_lightning.errors import Problem
    from hacrl_lightning.placement import engine_shares
    from hacrl_lightning.rollout.vllm import vllm_platform

    engines = placement.engines_on_node(cfg.trainer.devices if cfg.trainer.strategy == "fsdp" else 1)
    memory = psutil.virtual_memory()
    shares, problems, line = engine_shares({name: agent.gpu_memory_utilization for name, agent in cfg.agents.items()},
                                           engines, total_bytes=memory.total, available_bytes=memory.available,
                                           platform=vllm_platform() or "cuda")
    if problems:
        raise ConfigError([Problem(*p) for p in problems])
    if line and placement.rank == 0:
        print(line, flush=True)
    return shares


def update_settings(cfg: TrainConfig) -> UpdateSettings:
    """The update loop's sizes and limits from the run config."""
    mini_batch_size = (cfg.trainer.mini_batch_prompts // cfg.algorithm.rollout_multiplier) * cfg.responses_per_prompt
    return UpdateSettings(mini_batch_size=mini_batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
                          micro_batch_tokens=cfg.trainer.micro_batch_tokens,
                          max_nonfinite_skips=cfg.trainer.max_nonfinite_skips, precision=cfg.trainer.precision,
                          seed=cfg.seed, diagnostics_every=cfg.trainer.diagnostics_every)


def make_datamodule(cfg: TrainConfig, agents: dict[str, Agent],
                    task: tuple[PromptDataset, PromptDataset] | None = None, *,
                    datamodule_class: type[RolloutDataModule] = RolloutDataModule,
                    placement: Placement | None = None, residency: Residency | None = None) -> RolloutDataModule:
    """The run's DataModule over `agents` (`task`: the loaded (train, held-out) sets, else loaded here;
    `datamodule_class`: a subclass, for the benchmark's fixed-length sampling; `placement`: which agents
    live where, default all here; `residency`: `trainer.offload_idle`'s, shared with the module)."""
    train_set, eval_set = task if task is not None else load_task(cfg.data)
    return datamodule_class(agents, train_set=train_set, eval_set=eval_set, data=cfg.data, rollout=cfg.rollout,
                             responses_per_prompt=cfg.responses_per_prompt, share_rollouts=cfg.algorithm.share_rollouts,
                             steps=cfg.trainer.steps, seed=cfg.seed, engine_dir=Path(cfg.run_dir) / "engine_dirs",
                             engine_logprobs=cfg.algorithm.rollout_is_cap > 0,
                             mismatch_every=cfg.trainer.mismatch_every, placement=placement,
                             residency=residency)


def build_system(cfg: TrainConfig, run_dir: Path, *, started: float | None = None,
                 datamodule_class: type[RolloutDataModule] = RolloutDataModule
                 ) -> tuple[HACRLModule, RolloutDataModule, list[pl.Callback], dict]:
    """The run's module, DataModule and core callbacks (capability window, clip schedule, weight sync,
    step timer, plain progress lines when stdout is not a terminal, held-out evaluation, stop on a signal,
    checkpoints), each given the values it uses; the task loads once. Returns them and the callbacks by
    role (`timer`, `evaluation`, `stop`) for the summary (`started`: the session's start for the run
    clock, default now; `datamodule_class`: see `make_datamodule`). `train` and `bench.py step` build their
    runs with it."""
    task = load_task(cfg.data)
    placement = run_placement(cfg)
    agents = load_agents(cfg, task, only=placement.local)
    names = list(placement.names)
    window = CapabilityWindow(len(names), **cfg.algorithm.capability_settings())
    settings = update_settings(cfg)
    residency = Residency(enabled=cfg.trainer.offload_idle)
    datamodule = make_datamodule(cfg, agents, task, datamodule_class=datamodule_class, placement=placement,
                                 residency=residency)
    datamodule.engine_shares = run_engine_shares(cfg, placement)
    module = HACRLModule(agents, algorithm=cfg.algorithm, update=settings, placement=placement, residency=residency)
    roles = {"timer": StepTimer(started=started),
             "evaluation": HeldOutEvalCallback(datamodule, every=cfg.trainer.eval_every,
                                               samples=cfg.trainer.eval_samples),
             "stop": StopOnSignal(), "no_signal": NoSignalWarning(names, steps=cfg.trainer.no_signal_steps),
             "capability": CapabilityCallback(window, names)}
    callbacks = [
        roles["stop"],  # first: a signal during the initial evaluation already counts as "stop after this step"
        # before each step, in this order or any: they hand the step's omega and clip bounds forward on its batch
        roles["capability"],
        StepwiseClipCallback(delta=cfg.algorithm.delta, delta_step=cfg.algorithm.delta_step,
                             mini_batch_size=settings.mini_batch_size),
        WeightSyncCallback(datamodule, residency),
        roles["timer"],  # after weight sync (part of a step), before evaluation (not part of it)
        roles["no_signal"],
        *([] if interactive() else [PlainProgress(every=cfg.trainer.progress_every, steps=cfg.trainer.steps,
                                                  timer=roles["timer"])]),
        roles["evaluation"],
        # last: it saves the step after the stop decision
        StepCheckpoint(run_dir / "checkpoints", every=cfg.trainer.checkpoint_every, steps=cfg.trainer.steps,
                       last=cfg.trainer.keep_at_end,
                       minutes=cfg.trainer.checkpoint_minutes),
    ]
    if compile_wanted(cfg.trainer.compile, cfg.trainer.accelerator):  # after the module copied the KL references
        for agent in [*module.agents.values(), *module.references.values()]:
            compile_agent(agent)
        roles["timer"].compiled = True  # the compile's seconds kept out of the step's clock
    decode = str(cfg.rollout.hf_compile).lower()  # as `rollout.hf.decode_compiled` decides: `auto` not when sharded
    if cfg.rollout.backend == "hf" and cfg.rollout.hf_cache == "static" and \
            compile_wanted(decode, cfg.trainer.accelerator) and (decode != "auto" or cfg.trainer.strategy != "fsdp"):
        roles["timer"].compiled = True  # the decode step's compile (rollout.hf_compile) too
    return module, datamodule, callbacks, roles


def build_trainer(cfg: TrainConfig, run_dir: Path, callbacks: list[pl.Callback]) -> pl.Trainer:
    logger = TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False)
    tr = cfg.trainer
    return pl.Trainer(
        accelerator=tr.accelerator, devices=tr.devices, num_nodes=tr.num_nodes, strategy=make_strategy(tr),
        precision=lightning_precision(tr), max_epochs=1, logger=logger, callbacks=[*callbacks, ConfigHParams(cfg)],
        log_every_n_steps=tr.log_every, enable_checkpointing=False, use_distributed_sampler=False,
        plugins=[LocalCheckpointIO()],  # checkpoints written where they live, not first in $TMPDIR
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=str(run_dir),
        enable_progress_bar=interactive(),  # not a terminal: PlainProgress prints lines instead
    )


def train(cfg: TrainConfig, *, extra_callbacks: list[pl.Callback] = (), started: float | None = None,
          config_yaml: str | None = None) -> dict[str, Any]:
    """Fit, export and summarise one run; returns the summary (also written to summary.json).

    The run directory is claimed first (`run_dir.claim_run_dir`: locked, and refused when it holds another
    run unless this resumes it or `cfg.overwrite`); a resume is checked against the run's saved
    `run_config.json` (`resume.resume_changes`) and starts from the newest checkpoint that loads. A `resume`
    from another run's directory forks that run into `cfg.run_dir` (the other run is only read). Any
    failure (or signal) before training starts (Lightning's `on_train_start`) removes the directory
    again if this run created it.
    SIGINT/SIGTERM stop the run after the current step with a checkpoint (`callbacks.interrupt`); the
    summary's `status` is then `interrupted` (`completed` when all steps ran). `started`: when the process
    began (epoch seconds; the summary's wall time counts from it). `config_yaml`: the command line's
    resolved config, saved as `config.yaml` (`config.resumed.yaml` when continuing a run).
    `extra_callbacks` are appended to the run's own."""
    started = time.time() if started is None else started
    quiet_libraries()
    _file_size_limit_raises()
    rank = launch_rank(cfg.trainer.devices)
    run_dir = Path(cfg.run_dir).resolve()
    with catch_signals():
        linked = linked_exports_problem(run_dir, export_agents=cfg.trainer.export_agents)
        if linked:
            raise ConfigError([linked])
        source, skipped = resume_checkpoint(cfg.resume) if cfg.resume else (None, [])
        continuing = source is not None and run_dir_of(source) == run_dir
        run = claim_run_dir(run_dir, resuming=continuing, overwrite=cfg.overwrite, rank=rank)
        try:
            if rank == 0 and (unwritable := checkpoints_problem(run_dir)):
                raise ConfigError([unwritable])
            changes = _check_resume(cfg, source) if source is not None else {}
            pl.seed_everything(cfg.seed, workers=True, verbose=False)
            module, datamodule, callbacks, roles = build_system(cfg, run_dir, started=started)
            trainer = build_trainer(cfg, run_dir, [*callbacks, *extra_callbacks])
            if "agents" in changes:  # resume_agents=change: the checkpoint takes this run's agent set as it loads
                _adapt_on_load(trainer, module, added=set(changes["agents"][1]) - set(changes["agents"][0]))
        except BaseException:
            run.abandon()
            raise
        try:
            status, error = "completed", None
            try:
                if rank == 0:
                    _record_start(run_dir, cfg, config_yaml, continuing=continuing, source=source, skipped=skipped,
                                  changes=changes)
                trainer.fit(module, datamodule=datamodule, ckpt_path=str(source) if source else None)
            except BaseException as err:
                if not roles["stop"].started:  # failed in the fit's set-up: nothing trained, nothing left behind
                    run.abandon()
                    raise
                if not isinstance(err, RunInterrupted):
                    status, error = "failed", f"{type(err).__name__}: {err}"
                    _write_failed_summary(trainer, run_dir, make_summary(cfg, module, roles, {}, status=status,
                                                                         error=error, overlong=datamodule.overlong))
                    raise
                status, roles["stop"].signum = "interrupted", err.signum  # a second signal: stopped mid-step
            if roles["stop"].signum or module.steps_done < cfg.trainer.steps:
                status = "interrupted"
            exports = {}
            try:
                if cfg.trainer.export_agents and status == "completed":
                    exports, signum = _export_agents(module, run_dir, trainer)
                    if signum:  # the training is complete and checkpointed; the exports are not
                        status, roles["stop"].signum = "interrupted", signum
            except RunInterrupted as err:  # a second signal: stopped at once
                status, roles["stop"].signum = "interrupted", err.signum
            except ExportFailed as err:
                status, error = "failed", f"{type(err).__name__}: {err}"
                _write_failed_summary(trainer, run_dir, make_summary(cfg, module, roles, {}, status=status, error=error,
                                                                     overlong=datamodule.overlong))
                raise
            prune = cfg.trainer.keep_at_end != "checkpoint" and status == "completed"
            try:  # the summary first: nothing is deleted until it is on disk
                summary = make_summary(cfg, module, roles, exports, status=status, resumed_from=source, skipped=skipped,
                                       changes=changes, overlong=datamodule.overlong, pruned=prune)
                _write_summary(trainer, run_dir, summary)
            except Exception as err:  # noqa: BLE001 - named in one line; every checkpoint is kept
                raise RunFailed(f"summary.json not written in {run_dir} ({type(err).__name__}: {err}). The training is "
                                f"complete and its checkpoints are kept (trainer.keep_at_end={cfg.trainer.keep_at_end} "
                                f"deletes them only once the summary is written). Fix: remove the cause, then run the "
                                f"same command with resume={run_dir}") from None
            if prune and rank == 0:
                for path in _checkpoint_files(run_dir / "checkpoints"):  # the weights, or the exports, are what stays
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            return summary
        finally:
            run.release()


def _check_resume(cfg: TrainConfig, checkpoint: Path) -> dict[str, tuple[Any, Any]]:
    """The allowed changes of resuming `checkpoint` with `cfg`; raises ConfigError for the refused ones.
    Compares with the `run_config.json` of the checkpoint's run (a run saved before that file existed is not
    compared)."""
    saved_path = run_dir_of(checkpoint) / "run_config.json"
    if not saved_path.is_file():
        return {}
    summary_path = run_dir_of(checkpoint) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    step = CHECKPOINT_RE.match(checkpoint.name)
    at_step = int(step.group(1)) if step else 0
    # finished at this checkpoint: an extension killed while exporting leaves the earlier session's summary
    completed = summary.get("status") == "completed" and summary.get("steps") == at_step
    problems, changes = resume_changes(json.loads(saved_path.read_text()), cfg, completed=completed, at_step=at_step)
    if problems:
        raise ConfigError(problems)
    return changes


def _adapt_on_load(trainer: pl.Trainer, module: HACRLModule, *, added: set[str]) -> None:
    """A resume with another agent set: the checkpoint takes the run's agents as it loads (`resume.adapt_checkpoint`).
    On one device through `LocalCheckpointIO.adapt`: a new agent's weights those its preset loaded, its optimizer
    state and LR schedule those `configure_optimizers` makes (computed as the checkpoint loads; Lightning makes the
    run's own optimizers again after). Under `split` the strategy reads each kept agent's state and leaves the
    `added` ones as they are (`SplitStrategy.fresh`)."""
    from hacrl_lightning.strategies import SplitStrategy

    if isinstance(trainer.strategy, SplitStrategy):
        trainer.strategy.fresh = frozenset(added)
        trainer.strategy.adapt = partial(adapt_checkpoint, names=module.names, weights={}, optimizers={},
                                         schedules={}, counters=module.counters)
        return

    def adapt(checkpoint: dict) -> dict:
        optimizers, schedules = module.configure_optimizers()
        fresh = {name: (opt.state_dict(), sched["scheduler"].state_dict())
                 for name, opt, sched in zip(module.local, optimizers, schedules)}
        return adapt_checkpoint(checkpoint, module.names, weights=module.state_dict(),
                                optimizers={name: opt for name, (opt, _) in fresh.items()},
                                schedules={name: sched for name, (_, sched) in fresh.items()}, counters=module.counters)
    trainer.strategy.checkpoint_io.adapt = adapt


def checkpoints_problem(run_dir: Path) -> Problem | None:
    """The run's `checkpoints/` folder (a link to another disk included) when this user cannot write it: found
    before any step is trained (a real file created and removed there, so a read-only mount counts even for root),
    not as a failed save after one."""
    folder = run_dir / "checkpoints"
    if not folder.exists() and not folder.is_symlink():
        return None  # made inside the run directory, which the claim has just written
    try:
        probe = folder / f".write_probe.{os.getpid()}"
        probe.touch()
        probe.unlink()
        return None
    except OSError as err:
        return Problem("run_dir", str(run_dir), "a run directory whose checkpoints/ folder this user can write",
                       f"cannot write {folder} ({err.strerror}); nothing was trained: make it writable "
                       f"(chmod u+w {folder}, or remount it read-write), or choose another run_dir")


def _file_size_limit_raises() -> None:
    """A file size limit (`ulimit -f`) kills a process that writes past it (SIGXFSZ) unless the signal is ignored;
    ignored, the write fails with EFBIG, which a checkpoint's message names (`checkpoint._cause`). Only where a
    limit is set, and only from the main thread (where signal handlers are installed)."""
    import resource

    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _checkpoint_files(directory: Path) -> list[Path]:
    """The run's checkpoints (`step_*.ckpt`, files or distributed folders, and `.partial` ones)."""
    return sorted(directory.glob("step_*.ckpt*")) if directory.is_dir() else []


class ExportFailed(RunFailed):
    """An agent's export failed after a completed training (on some rank; raised on every rank)."""


def _export_agents(module: HACRLModule, run_dir: Path, trainer: pl.Trainer) -> tuple[dict[str, str], int | None]:
    """Every agent's export (each a collective under FSDP2: its mesh gathers it), and the signal that stopped them
    (None: none). After each agent the ranks agree (one all_gather): a signal on any rank stops the exports on every
    rank, a failure on any rank fails the run on every rank (`ExportFailed`, naming the rank and its error), so no
    rank is left waiting in a gather that another has left."""
    exports: dict[str, str] = {}
    with signals_deferred("finishing this agent's export, then stopping (the training is checkpointed)") as asked:
        for name, agent in module.agents.items():  # the same count on every rank: all agents, or one under split
            error = None
            try:
                exports[name] = str(agent.export(run_dir / "exports" / name))
            except Exception as err:  # noqa: BLE001 - every rank must hear of it before any raises
                error = f"{type(err).__name__}: {err}"
            outcomes = on_every_rank((asked.signum, name, error))  # under split each rank names its own agent
            failed = [(rank, agent_name, text) for rank, (_, agent_name, text) in enumerate(outcomes) if text]
            if failed:
                rank, agent_name, text = failed[0]
                where = f" on rank {rank}" if len(outcomes) > 1 else ""
                raise ExportFailed(f"the export of {agent_name}{where} failed ({text}). The training is complete and "
                                   f"checkpointed. Fix: remove the cause, then run the same command with "
                                   f"resume={run_dir}: it exports again (from the newest full checkpoint, the last "
                                   "step's unless trainer.keep_at_end kept only its weights)")
            signum = max(s or 0 for s, _, _ in outcomes)
            if signum:
                return exports, signum
    return _every_export(module, exports), None


def _every_export(module: HACRLModule, exports: dict[str, str]) -> dict[str, str]:
    """Under `split` each rank exported its own agent: every agent's export path, in agent order."""
    if not module.placement.is_split:
        return exports
    import torch.distributed as dist

    shares: list = [None] * module.placement.world
    dist.all_gather_object(shares, exports)
    merged = {name: path for share in shares for name, path in share.items()}
    return {name: merged[name] for name in module.names}


def _record_start(run_dir: Path, cfg: TrainConfig, config_yaml: str | None, *, continuing: bool,
                  source: Path | None, skipped: list, changes: dict) -> None:
    """Rank zero, once training is about to start: the config files, and what a resume skipped or changed."""
    for path, reason in skipped:
        aside = ""
        if continuing:  # our own run: keep the damaged file, under a name no later resume picks
            path.rename(path.with_name(path.name + ".damaged"))
            aside = f" (kept as {path.name}.damaged)"
        print(f"resume: {path} does not load ({reason}); using {source} instead{aside}", file=sys.stderr)
    if changes:
        print("resume: changed " + ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items()))
    if continuing and "agents" in changes:
        _keep_agents_change(run_dir, source, cfg, config_yaml)
    if config_yaml is not None:
        write_atomically(run_dir / ("config.resumed.yaml" if continuing else "config.yaml"), config_yaml)
    if not continuing:  # the settings the run was started with (a continued run keeps its own)
        write_atomically(run_dir / "run_config.json", json.dumps(config_dict(cfg), indent=2) + "\n")


def _keep_agents_change(run_dir: Path, source: Path, cfg: TrainConfig, config_yaml: str | None) -> None:
    """A run continued with another agent set (`resume_agents=change`): the checkpoint it continues from is kept
    (linked, else copied) with the run's `config.yaml` in `checkpoints/before_agents_change/<checkpoint>/`, where no
    pruning or resume looks, so a dropped agent's state stays on disk and evaluates there (`evaluate.py
    agents=[<that folder>]`); `config.yaml` and `run_config.json` take the new agents (evaluate.py rebuilds the run's
    agents from the one, a later resume is compared with the other)."""
    folder = run_dir / "checkpoints" / "before_agents_change" / source.name.removesuffix(".ckpt")
    keep = folder / source.name
    if not keep.exists():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(source, keep, copy_function=os.link) if source.is_dir() else os.link(source, keep)
        except OSError:  # another filesystem, or one without hard links
            shutil.copytree(source, keep, dirs_exist_ok=True) if source.is_dir() else shutil.copy2(source, keep)
    if config_yaml is not None and (run_dir / "config.yaml").is_file():
        if not (folder / "config.yaml").exists():
            shutil.copy2(run_dir / "config.yaml", folder / "config.yaml")
        write_atomically(run_dir / "config.yaml", config_yaml)
    saved_path = run_dir / "run_config.json"
    saved = json.loads(saved_path.read_text())
    saved["agents"] = config_dict(cfg)["agents"]
    write_atomically(saved_path, json.dumps(saved, indent=2) + "\n")


def _write_summary(trainer: pl.Trainer, run_dir: Path, summary: dict[str, Any]) -> None:
    if trainer.is_global_zero:
        write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")


def _write_failed_summary(trainer: pl.Trainer, run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json of a failed run; where it cannot be written (the disk that ended the run is full), its
    status and reason go to stderr instead, and the run's own error is what propagates."""
    try:
        _write_summary(trainer, run_dir, summary)
    except OSError as err:
        print(f"summary.json not written ({err}): status failed: {summary['error']}", file=sys.stderr)


def _iso(seconds: float) -> str:
    """`seconds` as local ISO time with its offset; in UTC where the local zone cannot be written (a `TZ` whose
    offset is out of range, such as `UTC+24:30`, which `datetime` refuses): a finished run never fails on it."""
    try:
        return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def make_summary(cfg: TrainConfig, module: HACRLModule, roles: dict[str, pl.Callback], exports: dict[str, str], *,
                 status: str, error: str | None = None, resumed_from: Path | None = None, skipped: list = (),
                 changes: dict | None = None, overlong: dict | None = None, pruned: bool = False) -> dict[str, Any]:
    """summary.json: how the run ended, its clocks over all sessions, each agent's counters and held-out
    figures (before and after; `final` is the last evaluation, which an interrupted run may not have
    reached), the evaluation history, what a resume started from, and the prompts dropped at set-up for being
    too long for an agent (`overlong`: per split, from `RolloutDataModule.overlong`). `pruned`: the full checkpoints
    are deleted right after the summary is written (`trainer.keep_at_end`), so it names none."""
    evaluation, timer, stop = roles["evaluation"], roles["timer"], roles["stop"]
    presence = roles.get("capability")
    agents = {}
    for name in module.names:
        agents[name] = {  # an agent added by a resume: its first evaluation, at the step it joined
            "initial": next((row["scores"][name] for row in evaluation.history if name in row["scores"]), {}),
            "present_from_step": presence.joined.get(name, 0) if presence else 0,
            "final": evaluation.final.get(name, {}),
            "steps": module.steps_done,
            **module.counters[name],
            "export": exports.get(name),
            "diagnostics": diagnostics_summary(module.diagnostics, name),
            "rollout_logp_diff": mismatch_summary(module.diagnostics, name),
        }
    checkpoints = None if pruned else _newest_checkpoint(Path(cfg.run_dir).resolve())
    weights = newest_weights(Path(cfg.run_dir).resolve())
    return {
        "status": status,
        "signal": signal.Signals(stop.signum).name if stop.signum else None,
        "error": error,
        "algorithm": cfg.algorithm.name,
        "seed": cfg.seed,
        "steps": module.steps_done,
        "steps_wanted": cfg.trainer.steps,
        "started_at": _iso(timer.started_at),
        "ended_at": _iso(time.time()),
        "wall_s": round(timer.wall_s, 2),
        "train_s": round(timer.train_s, 2),
        "step_s": round(timer.step_s, 4),
        "sessions": timer.sessions,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "skipped_checkpoints": [str(path) for path, _ in skipped],
        "resume_changes": {key: list(pair) for key, pair in (changes or {}).items()},
        "last_checkpoint": str(checkpoints) if checkpoints else None,
        "weights_checkpoint": str(weights) if weights else None,
        "run_dir": str(Path(cfg.run_dir).resolve()),
        "prompts_dropped_overlong": overlong,
        "agents": agents,
        "agents_left": dict(presence.left) if presence else {},
        "no_signal": list(roles["no_signal"].stretches) if "no_signal" in roles else [],
        "eval_history": evaluation.history,
    }


def diagnostics_summary(history: dict[str, list[tuple[int, float]]], agent: str) -> dict[str, Any]:
    """An agent's diagnostics over the run (docs/training.md#diagnostics): the mean over the steps that
    measured each `{agent}/diag/*` metric (None: never measured; `steps` says how many did), and per partner
    ω (the factor on the agent's cross term from that partner) at the first and last step and its mean."""
    out: dict[str, Any] = {key: None for key in DIAGNOSTICS}
    steps: dict[str, int] = {key: 0 for key in DIAGNOSTICS}
    omega: dict[str, dict[str, float]] = {}
    for key, pairs in history.items():
        values = [value for _, value in pairs]
        if key.startswith(f"{agent}/diag/") and values:
            name = key.split("/diag/", 1)[1]
            out[name], steps[name] = sum(values) / len(values), len(values)
        elif key.startswith(f"{agent}/omega/") and values:
            omega[key.split("/omega/", 1)[1]] = {"first": values[0], "last": values[-1],
                                                 "mean": sum(values) / len(values)}
    return {**out, "steps_measured": steps, "omega": omega}


def mismatch_summary(history: dict[str, list[tuple[int, float]]], agent: str) -> dict[str, float] | None:
    """An agent's rollout/trainer mismatch over the run (`{agent}/rollout/logp_diff_*`, docs/training.md#the-vllm-backend):
    the mean of the per-step means, the largest per-step max, and the last step's mean; None when its engine never
    reported log-probs (the transformers backend, which samples from the trainer's own model)."""
    means = [value for _, value in history.get(f"{agent}/rollout/logp_diff_mean", [])]
    maxima = [value for _, value in history.get(f"{agent}/rollout/logp_diff_max", [])]
    if not means:
        return None
    return {"mean": sum(means) / len(means), "max": max(maxima), "last_mean": means[-1], "steps": len(means)}


def _newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of `run_dir`, or None."""
    try:
        return latest_checkpoint(run_dir)
    except FileNotFoundError:
        return None
