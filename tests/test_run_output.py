"""What a run shows while and after it runs: plain progress lines when stdout is not a terminal, names
that say sampled train reward vs greedy held-out accuracy, and TensorBoard's hparams and step axis."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.prompts_per_step=2", "trainer.mini_batch_prompts=2", "rollout.group_size=2", "data.eval_size=4",
        "trainer.export_agents=false"]


# Progress lines to a pipe while the run goes on: tests/test_training.py::test_train_script_end_to_end (its
# scripts/train.py writes to a pipe).


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_tensorboard_has_the_config_as_hparams_and_eval_points_on_the_training_steps(tmp_path, zoo_cache):
    """The real event files: the resolved config as hparams (from the typed TrainConfig), and each held-out
    evaluation at the step after which it ran, the step of that step's training scalars (initial: 0)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from lightning.pytorch import Callback

    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.training import train

    bar = {}

    class KeepBar(Callback):
        def on_train_end(self, trainer, pl_module):
            bar.update(trainer.progress_bar_metrics)

    cfg, _ = compose_config(["trainer.steps=3", "trainer.eval_every=2", "agents.tiny_b.lr=3e-5", *TINY,
                             f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    train(cfg, extra_callbacks=[KeepBar()])
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["algorithm.name"].string_value == "hacpo"
    assert hparams["agents.tiny_b.lr"].number_value == pytest.approx(3e-5)
    assert hparams["trainer.steps"].number_value == 3 and hparams["seed"].number_value == 0
    experiment = plugin_data_pb2.HParamsPluginData.FromString(events.PluginTagToContent("hparams")["_hparams_/experiment"])
    assert {m.name.tag for m in experiment.experiment.metric_infos} == {"tiny_a/eval/acc", "tiny_b/eval/acc"}

    for agent in ("tiny_a", "tiny_b"):
        assert [e.step for e in events.Scalars(f"{agent}/reward")] == [1, 2, 3]
        assert [e.step for e in events.Scalars(f"{agent}/eval/acc")] == [0, 2, 3]  # before training, after 2, after 3
    # the bar names the sampled training reward as such (the held-out accuracy is greedy, printed apart)
    assert {"tiny_a train reward", "tiny_b train reward"} <= set(bar)


def test_final_table_names_greedy_held_out_accuracy(script_main, capsys):
    script_main("train")  # loads scripts/train.py
    print_summary = sys.modules["scripts_train"].print_summary
    row = {"initial": {"acc": 0.25}, "final": {"acc": 0.5}, "rollouts_generated": 8, "responses_trained": 16,
           "optimizer_updates": 2}
    print_summary({"agents": {"tiny_a": row}, "steps": 2, "wall_s": 1.0, "run_dir": "/r"})
    header, first = capsys.readouterr().out.splitlines()[:2]
    assert "held-out acc (greedy) before" in header and "held-out acc (greedy) after" in header
    assert first.split()[:3] == ["tiny_a", "0.250", "0.500"]
