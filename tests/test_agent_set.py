"""Agents that join or leave a trained run (`resume_agents=change`): kept agents continue exactly, a new one starts
from its preset with an empty capability window (docs/spec.md §2), a dropped one's state stays in the old checkpoint.

One chain of real runs on the tiny zoo agents, shared by the tests: tiny_a + tiny_b for 1 step (the run that never
changed, its state at the join step checkpointed), forked there with tiny_c added and trained to step 2, then that run
continued in place with tiny_b dropped to step 3. Under `trainer.placement=split` one launch of 2 gloo ranks
(`agent_set_split.py`) trains and changes its own run. The refusals are in-process and load no model.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

import hacrl_lightning.module as module_mod
from hacrl_lightning.algorithms.capability import step_accuracy
from hacrl_lightning.callbacks.checkpoint import checkpoint_path
from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.resume import config_dict, resume_changes
from hacrl_lightning.training import train

REPO = Path(__file__).resolve().parents[1]
SMALL = ["trainer.steps=2", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
         "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false", "trainer.micro_batch_size=8",
         "trainer.checkpoint_every=1"]


def config(run_dir: Path, zoo_cache, *overrides: str):
    cfg, _ = compose_config([*SMALL, f"zoo_cache={zoo_cache}", f"run_dir={run_dir}", *overrides])
    return cfg


def config_and_yaml(run_dir: Path, zoo_cache, *overrides: str):
    """The config and the resolved YAML scripts/train.py saves as the run's config.yaml (evaluate.py reads it)."""
    from omegaconf import OmegaConf

    cfg, composed = compose_config([*SMALL, f"zoo_cache={zoo_cache}", f"run_dir={run_dir}", *overrides])
    return cfg, OmegaConf.to_yaml(composed, resolve=True)


class Watch(Callback):
    """What the run holds as training starts (the checkpoint loaded), each step's rewards and omega (after the
    capability callback), and each learner's view (through the real `update_learner`)."""

    def __init__(self):
        self.weights, self.optimizers, self.schedules, self.steps, self.views = {}, {}, {}, [], []

    def on_train_start(self, trainer, pl_module):
        self.weights = {key: value.detach().clone() for key, value in pl_module.state_dict().items()}
        self.optimizers = {name: copy.deepcopy(opt.state_dict()) for name, opt in zip(pl_module.local, trainer.optimizers)}
        self.schedules = {name: config.scheduler.state_dict()
                          for name, config in zip(pl_module.local, trainer.lr_scheduler_configs)}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append((pl_module.steps_done + 1, batch.rewards.clone(), batch.omega.clone()))

    def run(self, cfg, config_yaml=None):
        real = module_mod.HACRLModule.update_learner

        def spy(module, k, name, view, *args, **kwargs):
            self.views.append((module.steps_done + 1, name, view.source_idx.clone(), view.is_own.clone()))
            return real(module, k, name, view, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(module_mod.HACRLModule, "update_learner", spy)
            return train(cfg, extra_callbacks=[self], config_yaml=config_yaml)


def same(a, b) -> bool:
    """Bitwise equal nested state (dicts, lists, tensors, numbers)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def owned(state: dict, name: str) -> dict:
    return {key: value for key, value in state.items() if key.startswith((f"agents.{name}.", f"references.{name}."))}


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def omega_by_hand(caps: list[float]) -> torch.Tensor:
    """Eq. 8 written out: clamp(cap_k / cap_j, 0.1, 10), diagonal 1."""
    n = len(caps)
    return torch.tensor([[1.0 if k == j else min(10.0, max(0.1, caps[k] / caps[j])) for j in range(n)]
                         for k in range(n)])


@pytest.fixture(scope="module")
def chain(tmp_path_factory, zoo_cache):
    root = tmp_path_factory.mktemp("agent_set")
    base = root / "base"
    straight = train(config(base, zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=1"))
    joined_watch, dropped_watch = Watch(), Watch()
    joined = joined_watch.run(*config_and_yaml(root / "joined", zoo_cache, "agents=[tiny_a,tiny_b,tiny_c]",
                                               "resume_agents=change", f"resume={checkpoint_path(base / 'checkpoints', 1)}"))
    dropped_dir = root / "dropped"
    shutil.copytree(root / "joined", dropped_dir)  # the joined run stays as it ended, for its own tests
    dropped = dropped_watch.run(*config_and_yaml(dropped_dir, zoo_cache, "agents=[tiny_a,tiny_c]", "resume_agents=change",
                                                 "trainer.steps=3", f"resume={dropped_dir}"))
    return {"root": root, "base": base, "straight": straight, "joined": joined, "joined_watch": joined_watch,
            "dropped": dropped, "dropped_watch": dropped_watch, "dropped_dir": dropped_dir}


@pytest.mark.slow
def test_kept_agents_continue_bitwise_from_the_join_step(chain):
    """At the join the kept agents hold exactly the step-1 state of the run that never changed: weights, AdamW
    state, LR schedule; tiny_c holds its preset's weights and a fresh optimizer."""
    saved = load(checkpoint_path(chain["base"] / "checkpoints", 1))
    watch = chain["joined_watch"]
    for index, name in enumerate(("tiny_a", "tiny_b")):
        assert same(owned(watch.weights, name), owned(saved["state_dict"], name)), name
        assert same(watch.optimizers[name], saved["optimizer_states"][index]), name
        assert same(watch.schedules[name], saved["lr_schedulers"][index]), name
        assert watch.optimizers[name]["state"], name  # a trained AdamW state, not a fresh one
    assert watch.optimizers["tiny_c"]["state"] == {} and watch.schedules["tiny_c"]["last_epoch"] == 0


@pytest.mark.slow
def test_a_new_agent_starts_from_its_preset(chain, zoo_cache):
    from hacrl_lightning.training import load_agents

    cfg = config(chain["root"] / "unused", zoo_cache, "agents=[tiny_c]", "algorithm=grpo")
    preset = {f"agents.tiny_c.{key}": value for key, value in load_agents(cfg)["tiny_c"].state_dict().items()}
    assert same(owned(chain["joined_watch"].weights, "tiny_c"), preset)


@pytest.mark.slow
def test_after_the_join_every_learner_trains_on_the_new_agents_responses(chain):
    """Step 2 of the joined run: tiny_a's and tiny_b's batches hold tiny_c's 8 responses (4 prompts x G=2), tiny_c's
    own batch its own and the partners'; 3 learners x 4 prompts / 2 per mini-batch = 6 updates each."""
    views = [(name, source, own) for step, name, source, own in chain["joined_watch"].views if step == 2]
    assert [name for name, _, _ in views] == ["tiny_a", "tiny_b", "tiny_c"]
    for name, source, own in views:
        assert int((source == 2).sum()) == 8, name
        assert bool(own[source == 2].all()) == (name == "tiny_c")
    row = chain["joined"]["agents"]["tiny_c"]
    assert row["optimizer_updates"] == 6 and row["responses_trained"] == 3 * 4 * 2 and row["rollouts_generated"] == 8


@pytest.mark.slow
def test_the_new_agents_capability_is_its_first_steps_accuracy(chain):
    """The capability rule for an agent without history (docs/spec.md §2), by hand: tiny_c's window starts empty,
    so at its first step its capability is that step's accuracy; tiny_a's and tiny_b's windows continue (step 1's
    accuracy from the checkpoint, then step 2's)."""
    saved = load(checkpoint_path(chain["base"] / "checkpoints", 1))["callbacks"]["CapabilityCallback"]
    assert saved["agents"] == ["tiny_a", "tiny_b"] and len(saved["window"]["history"][0]) == 1
    ((step, rewards, omega),) = chain["joined_watch"].steps
    assert step == 2 and rewards.shape[1] == 3
    acc = step_accuracy(rewards).tolist()
    history = saved["window"]["history"] + [[]]
    caps = [max(sum(h + [a]) / len(h + [a]), 1e-8) for h, a in zip(history, acc)]
    torch.testing.assert_close(omega, omega_by_hand(caps), rtol=1e-6, atol=0)
    ended = load(checkpoint_path(chain["root"] / "joined" / "checkpoints", 2))["callbacks"]["CapabilityCallback"]
    assert ended["window"]["history"] == [history[0] + [acc[0]], history[1] + [acc[1]], [acc[2]]]
    assert ended["joined"] == {"tiny_a": 0, "tiny_b": 0, "tiny_c": 1}


@pytest.mark.slow
def test_summary_and_tensorboard_say_from_which_step_each_agent_is_present(chain):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    joined, dropped = chain["joined"], chain["dropped"]
    assert {name: row["present_from_step"] for name, row in joined["agents"].items()} == \
        {"tiny_a": 0, "tiny_b": 0, "tiny_c": 1}
    assert joined["agents_left"] == {} and joined["resume_changes"]["agents"] == [["tiny_a", "tiny_b"],
                                                                                 ["tiny_a", "tiny_b", "tiny_c"]]
    assert joined["agents"]["tiny_c"]["initial"]  # its first held-out evaluation, at the step it joined
    assert {name: row["present_from_step"] for name, row in dropped["agents"].items()} == {"tiny_a": 0, "tiny_c": 1}
    assert dropped["agents_left"] == {"tiny_b": 2}
    events = EventAccumulator(str(chain["root"] / "joined" / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("tiny_c/present_from_step")] == [(1, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("tiny_a/present_from_step")] == [(1, 0.0)]
    events = EventAccumulator(str(chain["dropped_dir"] / "tensorboard")).Reload()
    assert (2, 2.0) in [(e.step, e.value) for e in events.Scalars("tiny_b/left_at_step")]
    assert [e.step for e in events.Scalars("tiny_a/reward")][-1] == 3


@pytest.mark.slow
def test_a_dropped_agent_leaves_its_state_in_the_old_checkpoint_and_the_rest_continue(chain, zoo_cache):
    """tiny_b dropped at step 2 of the joined run (continued in place): tiny_a and tiny_c start step 3 from exactly
    their step-2 state, the step trains on their two sets of responses only, the step-2 checkpoint (tiny_b in it)
    is kept where no pruning looks, and the run's saved settings now name its agents: the same command without
    resume_agents resumes it. evaluate.py's loader rebuilds the run's agents now, and those of the kept checkpoint."""
    saved = load(checkpoint_path(chain["root"] / "joined" / "checkpoints", 2))
    watch = chain["dropped_watch"]
    for index, name in ((0, "tiny_a"), (2, "tiny_c")):
        assert same(owned(watch.weights, name), owned(saved["state_dict"], name)), name
        assert same(watch.optimizers[name], saved["optimizer_states"][index]), name
    assert not owned(watch.weights, "tiny_b") and list(watch.optimizers) == ["tiny_a", "tiny_c"]
    ((step, rewards, _),) = watch.steps
    assert step == 3 and rewards.shape[1] == 2
    kept = chain["dropped_dir"] / "checkpoints" / "before_agents_change" / "step_0000002" / "step_0000002.ckpt"
    assert same(owned(load(kept)["state_dict"], "tiny_b"), owned(saved["state_dict"], "tiny_b"))
    from hacrl_lightning.evaluation import agents_from_checkpoint

    now, info = agents_from_checkpoint(chain["dropped_dir"], zoo_cache=zoo_cache)
    assert list(now) == ["tiny_a", "tiny_c"] and info["step"] == 3
    before, info = agents_from_checkpoint(kept.parent, zoo_cache=zoo_cache)
    assert list(before) == ["tiny_a", "tiny_b", "tiny_c"] and info["step"] == 2
    assert same(before["tiny_b"].state_dict(), {key.removeprefix("agents.tiny_b."): value for key, value
                                                in owned(saved["state_dict"], "tiny_b").items()})
    assert chain["dropped"]["steps"] == 3 and set(chain["dropped"]["agents"]) == {"tiny_a", "tiny_c"}
    assert list(json.loads((chain["dropped_dir"] / "run_config.json").read_text())["agents"]) == ["tiny_a", "tiny_c"]
    from hacrl_lightning.training import _check_resume

    again = config(chain["dropped_dir"], zoo_cache, "agents=[tiny_a,tiny_c]", "trainer.steps=4",
                   f"resume={chain['dropped_dir']}")
    assert _check_resume(again, checkpoint_path(chain["dropped_dir"] / "checkpoints", 3)) == {"trainer.steps": (2, 4)}


@pytest.mark.slow
def test_under_split_on_two_gloo_ranks_a_kept_agent_continues_and_a_new_one_takes_the_dropped_ones_rank(
        tmp_path, zoo_cache):
    """tiny_a + tiny_b on one rank each for a step, then tiny_b dropped and tiny_c added on its rank: tiny_a starts
    step 2 with exactly the weights and AdamW state it ended step 1 with (read back from the distributed checkpoint
    by its own rank), tiny_c with a fresh optimizer; each learner's step-2 batch holds both agents' 8 responses."""
    done = subprocess.run([sys.executable, str(REPO / "tests" / "agent_set_split.py"), str(tmp_path), str(zoo_cache)],
                          capture_output=True, text=True, timeout=500, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:] + "\n--- stdout:\n" + done.stdout[-1500:]
    lines = done.stdout.splitlines()
    assert "RANK-KEPT tiny_a equal=True" in lines and "RANK-FRESH tiny_c state=0" in lines
    assert {"RANK-ROWS tiny_a tiny_a=8 tiny_c=8", "RANK-ROWS tiny_c tiny_a=8 tiny_c=8"} <= set(lines)
    assert lines.count("RANK-DONE steps=2 updates=[8, 4]") == 2  # tiny_a 4 updates a step, tiny_c from step 2
    summary = json.loads((tmp_path / "changed" / "summary.json").read_text())
    assert {name: row["present_from_step"] for name, row in summary["agents"].items()} == {"tiny_a": 0, "tiny_c": 1}
    assert summary["agents_left"] == {"tiny_b": 1} and summary["status"] == "completed"


# --- refusals: in-process, no model loads ------------------------------------------------------------------


@pytest.mark.slow
def test_another_agent_set_without_the_setting_is_refused_in_one_line_naming_it(chain, zoo_cache, tmp_path):
    cfg = config(tmp_path / "fork", zoo_cache, "agents=[tiny_a,tiny_b,tiny_c]", f"resume={chain['base']}",
                 "trainer.steps=3")
    with pytest.raises(ConfigError) as caught:
        train(cfg)
    (problem,) = caught.value.problems
    assert problem.key == "agents" and "resume_agents=change" in problem.fix and "\n" not in str(problem)
    assert not (tmp_path / "fork").exists()  # nothing left behind


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_with_the_setting_a_kept_agents_own_settings_are_still_compared(zoo_cache, tmp_path):
    """Pure checks and `train`'s own (`_check_resume` over a saved run_config.json): fast, nothing loads."""
    from hacrl_lightning.training import _check_resume

    saved = config_dict(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]"))
    (tmp_path / "run_config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="resume_agents=change"):
        _check_resume(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_c]", "trainer.steps=3"),
                      checkpoint_path(tmp_path / "checkpoints", 2))
    assert _check_resume(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_c]", "trainer.steps=3",
                                "resume_agents=change"), checkpoint_path(tmp_path / "checkpoints", 2)) == \
        {"agents": (["tiny_a", "tiny_b"], ["tiny_a", "tiny_c"]), "trainer.steps": (2, 3)}

    def check(*overrides):
        return resume_changes(saved, config(tmp_path, zoo_cache, "trainer.steps=3", *overrides), at_step=2,
                              completed=True)

    problems, allowed = check("agents=[tiny_a,tiny_b,tiny_c]", "resume_agents=change", "agents.tiny_a.lr=3e-4",
                              "agents.tiny_c.lr=3e-4")
    assert [p.key for p in problems] == ["agents.tiny_a.lr"] and allowed["agents"][1] == ["tiny_a", "tiny_b", "tiny_c"]
    problems, _ = check("agents=[tiny_c,tiny_d]", "resume_agents=change")
    assert [p.key for p in problems] == ["agents"] and "at least one of the run's agents" in problems[0].allowed
    problems, _ = check("agents=[tiny_a,tiny_b,tiny_c]", "resume_agents=change", "trainer.strategy=fsdp")
    assert "resume_agents" in [p.key for p in problems]
    with pytest.raises(ConfigError, match="resume_agents"):
        config(tmp_path, zoo_cache, "resume_agents=maybe")
    with pytest.raises(ConfigError, match="trainer.devices"):  # a third agent under split on 2 ranks: planned, refused
        config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b,tiny_c]", "resume_agents=change", "trainer.strategy=fsdp",
               "trainer.accelerator=cpu", "trainer.devices=2", "trainer.placement=split", f"resume={tmp_path}")
