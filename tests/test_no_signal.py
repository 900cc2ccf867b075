"""The no-signal warning: an agent whose rewards are all one value for `trainer.no_signal_steps` steps in a row is
named, with the value and what usually fixes it, in the console and in summary.json; the default run gets none."""

from __future__ import annotations

import json
import warnings

import pytest

from hacrl_lightning.callbacks.no_signal import NoSignalWarning, no_signal_message
from hacrl_lightning.cli import compose_config
from hacrl_lightning.training import train


def small(tmp_path, zoo_cache, *overrides):
    cfg, _ = compose_config(["trainer.steps=4", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2",
                             "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=4",
                             "trainer.export_agents=false", "trainer.checkpoint_every=0", f"zoo_cache={zoo_cache}",
                             f"run_dir={tmp_path / 'run'}", *overrides])
    return cfg


@pytest.mark.slow
def test_every_reward_zero_is_named_with_its_fix_once_per_stretch(tmp_path, zoo_cache):
    """A reward of one's own that never pays (as SmolLM2 without few-shot earned: it never boxes its answers)."""
    reward = tmp_path / "never.py"
    reward.write_text("def never(response, gold):\n    return 0.0\n")
    cfg = small(tmp_path, zoo_cache, f"data.reward={reward}:never", "trainer.no_signal_steps=3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(cfg)
    said = [str(w.message) for w in caught if "carry no learning signal" in str(w.message)]
    assert len(said) == 2  # each agent once, at its third step, not again at the fourth
    for name, text in zip(("tiny_a", "tiny_b"), said):
        assert text == no_signal_message(name, 0.0, 3)
        assert f"agent {name!r}" in text and "was 0 in the last 3 steps" in text and "data.few_shot" in text
        assert f"agents.{name}.max_response_len" in text
    assert summary["no_signal"] == [{"agent": "tiny_a", "value": 0.0, "first_step": 1, "last_step": 4},
                                    {"agent": "tiny_b", "value": 0.0, "first_step": 1, "last_step": 4}]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["no_signal"] == summary["no_signal"]


@pytest.mark.slow
def test_the_default_run_gets_no_such_warning(tmp_path, zoo_cache):
    cfg = small(tmp_path, zoo_cache, "trainer.steps=6", "data.prompts_per_step=8", "rollout.group_size=4",
                "trainer.mini_batch_prompts=4")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(cfg)
    assert not [w for w in caught if "carry no learning signal" in str(w.message)]
    assert summary["no_signal"] == []


class Batch:
    def __init__(self, rewards):
        self.rewards = rewards


class Module:
    steps_done = 0


class Trainer:
    is_global_zero = True


def test_a_streak_restarts_when_the_value_changes_and_resumes_from_its_state():
    import torch

    callback, module = NoSignalWarning(["a", "b"], steps=2), Module()
    ones, zeros = torch.ones(2, 2, 2), torch.zeros(2, 2, 2)
    mixed = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]] * 2)                             # a mixed, b all 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rewards in (zeros, ones, ones, mixed):
            module.steps_done += 1
            callback.on_train_batch_end(Trainer(), module, None, Batch(rewards), 0)
        state = callback.state_dict()
        resumed = NoSignalWarning(["a", "b"], steps=2)
        resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint keeps it
        module.steps_done += 1
        resumed.on_train_batch_end(Trainer(), module, None, Batch(mixed), 0)
    assert [s for s in resumed.stretches] == [{"agent": "a", "value": 1.0, "first_step": 2, "last_step": 3},
                                              {"agent": "b", "value": 1.0, "first_step": 2, "last_step": 3},
                                              {"agent": "b", "value": 0.0, "first_step": 4, "last_step": 5}]
    assert len([w for w in caught if "no learning signal" in str(w.message)]) == 3
    assert "too easy" in no_signal_message("a", 1.0, 2)
