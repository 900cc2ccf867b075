"""How `training.build_system` wires a run, on one real step of the tiny zoo pair: data flows one way
(the DataModule makes the step, the callbacks hand its omega and clip bounds forward on it, the module
trains on what it receives and calls no callback), and the callbacks' hooks and the module's run in the
order docs/training.md states ("The order of the hooks")."""

from __future__ import annotations

import inspect
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import Callback

from hacrl_lightning.cli import compose_config
from hacrl_lightning.training import build_system, build_trainer

HOOKS = ("on_train_start", "on_train_batch_start", "on_train_batch_end", "on_train_end")


def _record(target, base, calls: dict[str, list[str]]) -> None:
    """Record `target`'s own hooks (those its class overrides from `base`) as they run, by class name."""
    for hook in HOOKS:
        if getattr(type(target), hook) is getattr(base, hook):
            continue
        real = getattr(target, hook)

        def spy(*args, _real=real, _hook=hook, **kwargs):
            calls[_hook].append(type(target).__name__)
            return _real(*args, **kwargs)

        setattr(target, hook, spy)


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, zoo_cache):
    run_dir = tmp_path_factory.mktemp("wiring") / "run"
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "trainer.steps=1", "data.prompts_per_step=2",
                             "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=1",
                             "data.eval_size=2", "trainer.checkpoint_every=1", "trainer.export_agents=false",
                             f"zoo_cache={zoo_cache}", f"run_dir={run_dir}"])
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module, datamodule, callbacks, _ = build_system(cfg, Path(run_dir))
    calls: dict[str, list[str]] = defaultdict(list)
    for callback in callbacks:
        _record(callback, Callback, calls)
    _record(module, pl.LightningModule, calls)
    made, trained = [], []
    real_rollout, real_step = datamodule.rollout, module.training_step

    def rollout(examples, *, step):
        made.append(real_rollout(examples, step=step))
        calls["on_train_batch_start"].append("(DataModule makes the step)")
        return made[-1]

    def training_step(batch, batch_idx):
        trained.append((batch, batch.omega.clone(), batch.cross_lower))
        inside.append(True)
        try:
            return real_step(batch, batch_idx)
        finally:
            inside.pop()

    inside: list[bool] = []
    for callback in callbacks:  # every method of a callback's own notes a call made while the module trains
        for attr in dir(type(callback)):  # (Lightning's hooks, e.g. on_before_backward, are Lightning's to call)
            if (attr.startswith("__") or hasattr(Callback, attr)
                    or not inspect.isfunction(inspect.getattr_static(type(callback), attr))):
                continue
            method = getattr(callback, attr)

            def watched(*args, _real=method, _name=f"{type(callback).__name__}.{attr}", **kwargs):
                if inside:
                    calls["during training_step"].append(_name)
                return _real(*args, **kwargs)

            setattr(callback, attr, watched)

    datamodule.rollout, module.training_step = rollout, training_step
    build_trainer(cfg, Path(run_dir), callbacks).fit(module, datamodule=datamodule)
    return module, made, trained, calls


def test_the_module_trains_on_the_step_the_datamodule_made_with_the_callbacks_values(one_step):
    module, made, trained, _ = one_step
    assert module.steps_done == 1 and len(made) == len(trained) == 1
    batch, omega, lowers = trained[0]
    assert batch is made[0] and batch.step == 0
    # the capability callback's omega (first step: the window has seen one step, warm-up 0 -> ratios of
    # capabilities) and the clip schedule's bounds: 2 agents x 2 prompts x G = 2 = 8 rows, mini-batches of
    # 2 prompts x 2 = 4 rows -> 2 mini-batches, 1 - 0.2 + m * 0.025
    assert omega.shape == (2, 2) and torch.all(omega.diagonal() == 1.0)
    assert lowers == pytest.approx((0.8, 0.825))


def test_the_module_calls_no_callback_during_a_step(one_step):
    *_, calls = one_step
    assert calls["during training_step"] == []


def test_the_hooks_run_in_the_documented_order(one_step):
    *_, calls = one_step
    progress = ["PlainProgress"] if "PlainProgress" in calls["on_train_batch_end"] else []  # not on a terminal
    # after a step: the stop decision first; the capability window reports; the engines get
    # the new weights; the step's clock stops; the no-signal watch reads the step's rewards; evaluation (not part
    # of the step); the checkpoint last, after the stop decision and the evaluation it saves (and the no-signal
    # state); then the module's one logger write of the step
    assert calls["on_train_batch_end"] == ["StopOnSignal", "CapabilityCallback", "WeightSyncCallback", "StepTimer",
                                           "NoSignalWarning", *progress, "HeldOutEvalCallback", "StepCheckpoint",
                                           "HACRLModule"]
    # before training: signals count from the start (a signal during the first evaluation stops after step 1)
    assert calls["on_train_start"][0] == "StopOnSignal" and "HeldOutEvalCallback" in calls["on_train_start"]
    # before a step: the DataModule makes it (Lightning's on_after_batch_transfer), then the callbacks hand the
    # step's omega and clip bounds forward on it and the clock takes the step's start, then the module turns
    # dropout off
    assert calls["on_train_batch_start"] == ["(DataModule makes the step)", "CapabilityCallback",
                                             "StepwiseClipCallback", "StepTimer", "HACRLModule"]
    # at the end: the final evaluation before the final checkpoint, which saves it
    ends = calls["on_train_end"]
    assert ends.index("HeldOutEvalCallback") < ends.index("StepCheckpoint")
