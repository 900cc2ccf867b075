"""How `training.build_system` wires a run, on one real step of the tiny zoo pair: the module trains on
the steps of the rollout source it is handed (not on whatever the trainer holds), and the callbacks'
hooks and the module's `on_train_batch_end` run in the order docs/training.md states
("The order of the hooks")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch import Callback

from hacrl_lightning.cli import compose_config
from hacrl_lightning.training import build_system, build_trainer

HOOKS = ("on_train_start", "on_train_batch_start", "on_train_batch_end", "on_train_end")


class RecordingSource:
    """A rollout source that hands on the DataModule's steps and records which it was asked for."""

    def __init__(self, datamodule):
        self.datamodule, self.steps = datamodule, []

    def rollout(self, examples, *, step):
        self.steps.append(step)
        return self.datamodule.rollout(examples, step=step)


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
    source = RecordingSource(datamodule)
    module.rollouts = source
    calls: dict[str, list[str]] = defaultdict(list)
    for callback in callbacks:
        _record(callback, Callback, calls)
    _record(module, pl.LightningModule, calls)
    build_trainer(cfg, Path(run_dir), callbacks).fit(module, datamodule=datamodule)
    return module, source, calls


def test_the_module_trains_on_the_steps_of_the_source_it_is_handed(one_step):
    module, source, _ = one_step
    assert source.steps == [0] and module.steps_done == 1


def test_the_hooks_run_in_the_documented_order(one_step):
    _, _, calls = one_step
    progress = ["PlainProgress"] if "PlainProgress" in calls["on_train_batch_end"] else []  # not on a terminal
    # after a step: the stop decision first; the capability window and clip schedule report; the engines get
    # the new weights; the step's clock stops; evaluation (not part of the step); the checkpoint last, after
    # the stop decision and the evaluation it saves; then the module's one logger write of the step
    assert calls["on_train_batch_end"] == ["StopOnSignal", "CapabilityCallback", "StepwiseClipCallback",
                                           "WeightSyncCallback", "StepTimer", *progress, "HeldOutEvalCallback",
                                           "StepCheckpoint", "HACRLModule"]
    # before training: signals count from the start (a signal during the first evaluation stops after step 1)
    assert calls["on_train_start"][0] == "StopOnSignal" and "HeldOutEvalCallback" in calls["on_train_start"]
    # before a step: the clip schedule starts the step's mini-batch count, the clock starts, the module turns
    # dropout off, in callback order, the module last
    assert calls["on_train_batch_start"] == ["StepwiseClipCallback", "StepTimer", "HACRLModule"]
    # at the end: the final evaluation before the final checkpoint, which saves it
    ends = calls["on_train_end"]
    assert ends.index("HeldOutEvalCallback") < ends.index("StepCheckpoint")
