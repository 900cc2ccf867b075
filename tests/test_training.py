"""The Lightning training system on real tiny zoo agents: the HACPO step, on-policy rollouts, exact resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

import hacrl_lightning.module as module_mod
from conftest import StopAfter
from hacrl_lightning.callbacks.checkpoint import latest_checkpoint
from hacrl_lightning.cli import compose_config
from hacrl_lightning.training import train

REPO = Path(__file__).resolve().parents[1]

THREE = "agents=[tiny_a,tiny_b,tiny_c]"


def config(tmp_path, zoo_cache, *overrides):
    """A small, fast run: 4 prompts per step, G = 2, mini-batches of 2 prompts, no periodic eval."""
    cfg, _ = compose_config([
        "trainer.steps=2", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
        "trainer.eval_every=0", "data.eval_size=8", "trainer.export_agents=false", "trainer.micro_batch_size=8",
        f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}", *overrides,
    ])
    return cfg


def snapshot(module) -> dict[str, torch.Tensor]:
    return {name: torch.cat([p.detach().flatten().clone() for p in agent.parameters()])
            for name, agent in module.agents.items()}


class Spy:
    """Records what the real training code does (it calls through; nothing is replaced)."""

    def __init__(self, monkeypatch):
        self.losses: list[tuple[str, float]] = []
        self.steps: list[tuple[str, set[str]]] = []
        self.generated_with: list[dict[str, torch.Tensor]] = []
        self.after_step: list[dict[str, torch.Tensor]] = []
        real_loss = module_mod.hacpo_loss
        spy = self

        def loss_spy(**kwargs):
            spy.losses.append((spy.current, kwargs["cross_lower"]))
            return real_loss(**kwargs)

        monkeypatch.setattr(module_mod, "hacpo_loss", loss_spy)
        real_update = module_mod.HACRLModule.update_learner

        def update_spy(module, k, name, *args, **kwargs):
            spy.current = name
            before = snapshot(module)
            # every optimizer step of this learner: only this learner's weights may move
            opt = module._optimizers()[0][name].optimizer
            handle = opt.register_step_post_hook(lambda *_: spy._check_step(module, name))
            spy._last = before
            try:
                return real_update(module, k, name, *args, **kwargs)
            finally:
                handle.remove()

        monkeypatch.setattr(module_mod.HACRLModule, "update_learner", update_spy)
        from hacrl_lightning.datamodule import RolloutDataModule

        real_rollout = RolloutDataModule.rollout

        def rollout_spy(dm, examples, *, step):
            spy.generated_with.append({name: torch.cat([p.detach().flatten().clone() for p in agent.parameters()])
                                       for name, agent in dm.agents.items()})
            return real_rollout(dm, examples, step=step)

        monkeypatch.setattr(RolloutDataModule, "rollout", rollout_spy)
        real_end = module_mod.HACRLModule.training_step

        def step_spy(module, batch, batch_idx):
            out = real_end(module, batch, batch_idx)
            spy.after_step.append(snapshot(module))
            return out

        monkeypatch.setattr(module_mod.HACRLModule, "training_step", step_spy)

    def _check_step(self, module, name):
        now = snapshot(module)
        changed = {agent for agent in now if not torch.equal(now[agent], self._last[agent])}
        self.steps.append((name, changed))
        self._last = now


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_one_hacpo_step_on_three_agents(tmp_path, zoo_cache, monkeypatch):
    spy = Spy(monkeypatch)
    cfg = config(tmp_path, zoo_cache, THREE, "trainer.steps=1")
    summary = train(cfg)
    n, prompts, mini = 3, 4, 2
    updates = n * prompts // mini  # docs/spec.md §7: n·P / mini_batch_prompts = 6
    for name in ("tiny_a", "tiny_b", "tiny_c"):
        stepped = [changed for who, changed in spy.steps if who == name]
        assert len(stepped) == updates
        assert all(changed <= {name} for changed in stepped), stepped  # only the stepped agent moved
        assert any(changed == {name} for changed in stepped)
        bounds = list(dict.fromkeys(lower for who, lower in spy.losses if who == name))
        assert bounds == pytest.approx([min(1.0, 0.8 + 0.025 * m) for m in range(updates)])  # Eq. 14, m = 0, 1, ...
        row = summary["agents"][name]
        assert row["optimizer_updates"] == updates
        assert row["rollouts_generated"] == prompts * 2
        assert row["responses_trained"] == n * prompts * 2


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_single_agent_algorithm_trains_side_by_side_without_sharing(tmp_path, zoo_cache, monkeypatch):
    spy = Spy(monkeypatch)
    summary = train(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "algorithm=gspo", "trainer.steps=1"))
    for name in ("tiny_a", "tiny_b"):
        assert summary["agents"][name]["responses_trained"] == 4 * 2  # own responses only
        assert summary["agents"][name]["optimizer_updates"] == 4 // 2
    assert all(changed <= {who} for who, changed in spy.steps)  # (all-equal rewards give no gradient)


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_the_clip_schedule_callback_is_the_one_source_of_the_cross_bound(tmp_path, zoo_cache, monkeypatch):
    """The loss receives the bounds the callback gives: change the callback's delta_step (not the
    config) and the bounds of every mini-batch change with it."""
    from hacrl_lightning.callbacks.clip_schedule import StepwiseClipCallback
    from hacrl_lightning.training import build_system, build_trainer

    spy = Spy(monkeypatch)
    cfg = config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=1")
    module, datamodule, callbacks, _ = build_system(cfg, Path(cfg.run_dir))
    (schedule,) = [c for c in callbacks if isinstance(c, StepwiseClipCallback)]
    assert cfg.algorithm.delta_step == 0.025
    schedule.delta_step = 0.1
    build_trainer(cfg, Path(cfg.run_dir), callbacks).fit(module, datamodule=datamodule)
    for name in ("tiny_a", "tiny_b"):  # 2 agents x 4 prompts / 2 prompts per mini-batch = 4 mini-batches
        assert [lower for who, lower in spy.losses if who == name] == pytest.approx([0.8, 0.9, 1.0, 1.0])
    # own rows come first: the cross rows are in mini-batches 2 and 3 (bound 1.0 here, .85/.875 by the config)
    assert module.last_metrics["tiny_a/clip/cross_lower"] == pytest.approx(1.0)


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_rollouts_are_on_policy(tmp_path, zoo_cache, monkeypatch):
    spy = Spy(monkeypatch)
    train(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=3"))
    assert len(spy.generated_with) == 3 and len(spy.after_step) == 3
    for t in range(2):  # step t+1 generates with exactly the weights left by step t
        for name in ("tiny_a", "tiny_b"):
            assert torch.equal(spy.generated_with[t + 1][name], spy.after_step[t][name])
            assert not torch.equal(spy.generated_with[t + 1][name], spy.generated_with[t][name])


@pytest.mark.slow
@pytest.mark.parametrize("lora", [[], ["agents.tiny_a.lora.rank=4", "algorithm.kl_coef=0.01"]], ids=["full", "lora"])
def test_exact_resume(tmp_path, zoo_cache, lora):
    """Interrupted after step 2 and resumed = 4 steps straight: weights and optimizer state bitwise (`lora`: tiny_a
    with an adapter and the KL penalty, its reference the adapter-off model)."""
    straight = train(config(tmp_path / "a", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4", *lora))
    first = config(tmp_path / "b", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4", "trainer.checkpoint_every=2",
                   *lora)
    train(first, extra_callbacks=[StopAfter(2)])  # interrupted half-way, after the step-2 checkpoint
    resumed_cfg = config(tmp_path / "b", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4",
                         f"resume={tmp_path / 'b' / 'run'}", *lora)
    resumed = train(resumed_cfg)
    assert resumed["steps"] == straight["steps"] == 4
    ckpt_a = torch.load(latest_checkpoint(tmp_path / "a" / "run"), weights_only=False)
    ckpt_b = torch.load(latest_checkpoint(tmp_path / "b" / "run"), weights_only=False)
    assert ckpt_a["state_dict"].keys() == ckpt_b["state_dict"].keys()
    assert any(".lora_A." in key for key in ckpt_a["state_dict"]) == bool(lora)
    for key, value in ckpt_a["state_dict"].items():
        assert torch.equal(value, ckpt_b["state_dict"][key]), key
    for opt_a, opt_b in zip(ckpt_a["optimizer_states"], ckpt_b["optimizer_states"]):
        assert opt_a["state"].keys() == opt_b["state"].keys()
        for index, state in opt_a["state"].items():
            for key, value in state.items():
                assert torch.equal(value, opt_b["state"][index][key]), (index, key)
    assert ckpt_a["callbacks"] == ckpt_b["callbacks"] or _same_callback_state(ckpt_a, ckpt_b)
    for name in ("tiny_a", "tiny_b"):
        for key in ("rollouts_generated", "responses_trained", "optimizer_updates"):
            assert straight["agents"][name][key] == resumed["agents"][name][key]
        assert straight["agents"][name]["final"] == resumed["agents"][name]["final"]


@pytest.mark.slow
def test_a_checkpoint_saved_before_the_callbacks_handed_their_values_forward_resumes_exactly(tmp_path, zoo_cache):
    """`fixtures/checkpoint_state_bdd488b.pt` is everything but the weights and optimizer state (callbacks, loops,
    LR schedules, the module's extras) of the step-2 checkpoint that `test_exact_resume`'s interrupted run wrote
    at commit bdd488b, when the module still fed the capability window itself and asked the clip schedule for
    each bound. The weights' and optimizer's format did not change since, so they come from this code's own
    step-2 checkpoint of the same run; resumed from that mix, the run ends exactly where a straight run ends."""
    straight = train(config(tmp_path / "a", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4"))
    first = config(tmp_path / "b", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4", "trainer.checkpoint_every=2")
    train(first, extra_callbacks=[StopAfter(2)])
    path = latest_checkpoint(tmp_path / "b" / "run")
    checkpoint = torch.load(path, weights_only=False)
    old = torch.load(REPO / "tests" / "fixtures" / "checkpoint_state_bdd488b.pt", weights_only=True)
    assert set(old) == set(checkpoint) - {"state_dict", "optimizer_states"}
    assert old["callbacks"]["CapabilityCallback"]["window"]["steps"] == 2
    checkpoint.update(old)
    torch.save(checkpoint, path)
    resumed = train(config(tmp_path / "b", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4",
                           f"resume={tmp_path / 'b' / 'run'}"))
    assert resumed["steps"] == 4
    ckpt_a = torch.load(latest_checkpoint(tmp_path / "a" / "run"), weights_only=False)
    ckpt_b = torch.load(latest_checkpoint(tmp_path / "b" / "run"), weights_only=False)
    for key, value in ckpt_a["state_dict"].items():
        assert torch.equal(value, ckpt_b["state_dict"][key]), key
    assert _same_callback_state(ckpt_a, ckpt_b)
    for name in ("tiny_a", "tiny_b"):
        assert straight["agents"][name]["optimizer_updates"] == resumed["agents"][name]["optimizer_updates"]


def _same_callback_state(a, b) -> bool:
    keys = [k for k in a["callbacks"] if "Capability" in k]
    return all(a["callbacks"][k] == b["callbacks"][k] for k in keys)


@pytest.mark.slow
def test_train_script_end_to_end(tmp_path, zoo_cache):
    """scripts/train.py as a user runs it, its output to a pipe (as `> log`, nohup or a scheduler): a plain
    progress line per step shows while the process is still running, flushed at once, each naming every
    agent's train reward; TensorBoard events with per-agent tags, a checkpoint, exports that load with plain
    transformers, summary.json and the final table."""
    import json
    import subprocess
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "train.py"), "trainer.steps=2", "data.prompts_per_step=4",
         "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=1", "data.eval_size=8",
         "trainer.eval_samples=3", f"zoo_cache={zoo_cache}", f"run_dir={run}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 1/2"):
                break
        # the step-2 evaluation and the exports are still ahead
        assert proc.poll() is None, "the first progress line came only once the run had ended:\n" + "".join(lines)
        rest, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = SimpleNamespace(returncode=proc.returncode, stdout="".join(lines) + rest, stderr="")  # stderr: in stdout
    assert result.returncode == 0, result.stdout[-3000:]
    progress = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in progress] == ["step 1/2", "step 2/2"]
    for line in progress:
        assert "train reward (sampled): tiny_a " in line and " tiny_b " in line and line.rstrip().endswith("s/step")
    assert "Epoch 0/0" not in result.stdout + result.stderr  # no progress bar drawn into the pipe
    assert "held-out acc (greedy) before" in result.stdout and str(run) in result.stdout
    assert [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("eval step")] == [
        "eval step 0", "eval step 1", "eval step 2"]
    console = result.stdout + result.stderr  # a quiet console: none of the libraries' chatter (hacrl_lightning/console.py)
    for chatter in ("litlogger", "GPU available", "eval mode", "weights_only", "Writing model shards",
                    "Loading weights", "LeafSpec", "Trainer.fit` stopped"):
        assert chatter not in console, chatter
    events = EventAccumulator(str(run / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    for agent in ("tiny_a", "tiny_b"):
        for tag in ("reward", "acc", "clip/self_frac", "clip/cross_frac", "ratio/cross_mean", "capability",
                    "resp_len", "grad_norm", "eval/acc", "eval/avg@3"):
            assert f"{agent}/{tag}" in tags, (agent, tag)
    assert "tiny_a/omega/tiny_b" in tags and {"time/rollout", "time/reward", "time/exchange", "time/update"} <= tags
    assert latest_checkpoint(run).name == "step_0000002.ckpt"
    assert (run / "config.yaml").exists()
    summary = json.loads((run / "summary.json").read_text())
    for agent in ("tiny_a", "tiny_b"):
        row = summary["agents"][agent]
        assert row["steps"] == 2 and row["optimizer_updates"] == 2 * (2 * 4 // 2)
        assert 0.0 <= row["initial"]["acc"] <= 1.0 and 0.0 <= row["final"]["acc"] <= 1.0
        assert 0.0 <= row["final"]["avg@3"] <= row["final"]["pass@3"] <= 1.0  # k sampled answers per prompt
        model = AutoModelForCausalLM.from_pretrained(row["export"])
        tokenizer = AutoTokenizer.from_pretrained(row["export"])
        assert model.config.vocab_size >= len(tokenizer) and tokenizer.chat_template
    # what the two agents know together, at every evaluation, from the same greedy answers (collective.py)
    assert sum("| together: union " in line for line in result.stdout.splitlines() if line.startswith("eval step")) == 3
    for key in ("union_acc", "majority_acc", "majority_tied", "union_gain", "majority_gain", "right_wrong/tiny_a/tiny_b"):
        assert [e.step for e in events.Scalars(f"collective/eval/{key}")] == [0, 1, 2], key
    for entry, union in zip(summary["eval_history"], events.Scalars("collective/eval/union_acc")):
        together, a, b = entry["collective"], entry["scores"]["tiny_a"]["acc"], entry["scores"]["tiny_b"]["acc"]
        assert together["agents"] == ["tiny_a", "tiny_b"] and together["problems"] == 8
        assert together["best_single_acc"] == pytest.approx(max(a, b))
        assert union.value == pytest.approx(together["union_acc"])
        a_only, b_only = together["right_wrong"]["tiny_a"]["tiny_b"], together["right_wrong"]["tiny_b"]["tiny_a"]
        assert together["union_acc"] == pytest.approx(a + b_only) == pytest.approx(b + a_only)  # by hand, 2 agents
        assert together["union_gain"] == pytest.approx(together["union_acc"] - max(a, b))
        assert 0.0 <= together["majority_acc"] <= together["union_acc"] and 0.0 <= together["majority_tied"] <= 1.0


@pytest.mark.slow
def test_kl_to_a_frozen_reference_only_when_beta_is_positive(tmp_path, zoo_cache):
    from hacrl_lightning.module import HACRLModule
    from hacrl_lightning.training import load_agents, update_settings

    cfg = config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "algorithm.kl_coef=0.001", "trainer.steps=1")
    initial = load_agents(cfg)
    no_kl = config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]")
    module = HACRLModule(initial, algorithm=no_kl.algorithm, update=update_settings(no_kl))
    assert len(module.references) == 0
    captured = {}

    class Grab(StopAfter):
        def on_train_batch_end(self, trainer, pl_module, *args):
            captured.update(pl_module.last_metrics)
            captured["refs"] = {n: torch.cat([p.flatten() for p in r.parameters()]).clone()
                                for n, r in pl_module.references.items()}
            captured["policy"] = {n: torch.cat([p.flatten() for p in a.parameters()]).clone()
                                  for n, a in pl_module.agents.items()}

    train(cfg, extra_callbacks=[Grab(1)])
    for name in ("tiny_a", "tiny_b"):
        assert captured[f"{name}/loss/kl"] >= 0.0  # k3 is non-negative
        assert not captured["refs"][name].requires_grad
        start = torch.cat([p.flatten() for p in initial[name].parameters()])
        assert torch.equal(captured["refs"][name], start)  # the reference stays at the starting weights
        assert not torch.equal(captured["policy"][name], start)  # while the policy moved


SPLIT = ["trainer.placement=split", "agents.tiny_a.lr=1e-4", "agents.tiny_b.lr=3e-4", "agents.tiny_b.lr_warmup_steps=6"]
"""Two agents, one gloo rank each, with different learning rates and schedules: a resume that gave one agent's
optimizer state or LR schedule to the other would not make the uninterrupted run's weights."""


def _fsdp_run(run: Path, zoo_cache, steps: int, extra: str, *overrides: str) -> str:
    import subprocess

    done = subprocess.run([sys.executable, str(REPO / "tests" / "fsdp_run.py"), str(run), str(zoo_cache), str(steps),
                           extra, *overrides], capture_output=True, text=True, timeout=400, cwd=REPO)
    # stdout's end too: whether each rank printed RANK-DONE (an abort at exit, seen once as "terminate called
    # without an active exception" after a resumed split run, or one during the run)
    assert done.returncode == 0, done.stderr[-3000:] + "\n--- stdout:\n" + done.stdout[-1500:]
    return done.stdout


def _exported(run: Path, name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "exports" / name / "model.safetensors"))


@pytest.mark.slow
def test_keep_at_end_weights_under_fsdp2_keeps_the_exported_weights(tmp_path, zoo_cache):
    """`trainer.keep_at_end=weights` on 2 gloo ranks with per-agent FSDP2 (a checkpoint every step): one distributed
    weights-only checkpoint is left, and evaluate.py's loader reads from it the weights the run exported, bitwise."""
    from omegaconf import OmegaConf

    from hacrl_lightning.evaluation import agents_from_checkpoint

    run = tmp_path / "run"
    out = _fsdp_run(run, zoo_cache, 2, "-", "trainer.keep_at_end=weights")
    assert out.count("RANK-DONE steps=2") == 2
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["weights_step_0000002.ckpt"]
    _, dcfg = compose_config(["agents=[tiny_a,tiny_b]", "trainer.strategy=fsdp", "trainer.accelerator=cpu",
                              "trainer.devices=2", "trainer.steps=2", f"run_dir={run}", f"zoo_cache={zoo_cache}"])
    (run / "config.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))  # scripts/train.py saves it; fsdp_run not
    agents, info = agents_from_checkpoint(run, zoo_cache=zoo_cache)
    assert info["step"] == 2 and (run / "checkpoints" / "weights_step_0000002.ckpt").is_dir()
    for name, agent in agents.items():
        state, exported = agent.model.state_dict(), _exported(run, name)
        assert all(torch.equal(state[key], weight) for key, weight in exported.items()), name


@pytest.mark.slow
def test_a_split_run_interrupted_and_resumed_equals_the_uninterrupted_one(tmp_path, zoo_cache):
    """trainer.placement=split on 2 gloo ranks: 3 steps straight, and 1 step + a resume to 3 (a distributed
    checkpoint whose optimizer states and LR schedules are keyed by agent) end with bitwise equal weights. The
    first step runs with trainer.offload_idle=true (a harmless change on resume): FSDP2's `Module.to` and the
    optimizer state's moves leave the update as it was."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    out = _fsdp_run(straight, zoo_cache, 3, "-", *SPLIT)
    assert out.count("RANK-DONE steps=3") == 2
    _fsdp_run(resumed, zoo_cache, 3, "stop_after_1", *SPLIT, "trainer.offload_idle=true")  # FSDP2 moves: identities
    assert latest_checkpoint(resumed).is_dir()
    out = _fsdp_run(resumed, zoo_cache, 3, "resume", *SPLIT)
    assert out.count("RANK-DONE steps=3 updates=[12, 12]") == 2  # every agent's counters, on every rank
    for name in ("tiny_a", "tiny_b"):
        one, two = _exported(straight, name), _exported(resumed, name)
        assert one.keys() == two.keys()
        for key in one:
            assert torch.equal(one[key], two[key]), f"{name}.{key}"
    start = json.loads((straight / "summary.json").read_text())
    assert start["status"] == "completed" and set(start["agents"]) == {"tiny_a", "tiny_b"}


@pytest.mark.slow
def test_three_agents_on_three_split_ranks_train(tmp_path, zoo_cache):
    out = _fsdp_run(tmp_path / "run", zoo_cache, 2, "-", "agents=[tiny_a,tiny_b,tiny_c]", "trainer.placement=split",
                    "trainer.devices=3", "data.prompts_per_step=3", "trainer.mini_batch_prompts=1")
    # n·P/mini_batch_prompts = 3·3/1 updates per learner and step
    assert out.count("RANK-DONE steps=2 updates=[18, 18, 18]") == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert all(Path(row["export"]).is_dir() for row in summary["agents"].values())


@pytest.mark.slow
def test_keep_at_end_exports_leaves_only_the_exports_of_a_completed_run(tmp_path, zoo_cache):
    """`trainer.keep_at_end=exports`: no checkpoint after the last step, the step-1 and step-2 ones removed once the
    exports are written; an interrupted run with the same setting keeps its checkpoint (it can resume)."""
    summary = train(config(tmp_path / "a", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=3",
                           "trainer.checkpoint_every=1", "trainer.keep_at_end=exports", "trainer.export_agents=true"))
    run = tmp_path / "a" / "run"
    assert summary["status"] == "completed" and summary["last_checkpoint"] is None
    assert list((run / "checkpoints").iterdir()) == []
    assert all((run / "exports" / name / "model.safetensors").is_file() for name in ("tiny_a", "tiny_b"))
    cfg = config(tmp_path / "b", zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=3", "trainer.checkpoint_every=2",
                 "trainer.keep_at_end=exports", "trainer.export_agents=true")
    interrupted = train(cfg, extra_callbacks=[StopAfter(2)])
    assert interrupted["status"] == "interrupted"
    assert [p.name for p in (tmp_path / "b" / "run" / "checkpoints").iterdir()] == ["step_0000002.ckpt"]


class FinalWeights(Callback):
    """Keeps a copy of every agent's weights when training ends."""

    def on_train_end(self, trainer, pl_module):
        self.weights = {name: {k: v.detach().clone() for k, v in agent.state_dict().items()}
                        for name, agent in pl_module.agents.items()}


@pytest.mark.slow
def test_keep_at_end_weights_leaves_one_weights_only_checkpoint_that_evaluates_and_cannot_resume(tmp_path, zoo_cache):
    """`trainer.keep_at_end=weights`: after the last step one checkpoint of the weights alone (no optimizer state, a
    third of a full one with AdamW's two moments), the earlier full ones removed; evaluate.py's loader reads the final
    weights from it bitwise; `resume=` the run is refused, naming the file and why, and the checkpoint is left."""
    from hacrl_lightning.evaluation import agents_from_checkpoint
    from hacrl_lightning.safe_load import load_checkpoint_file

    from omegaconf import OmegaConf

    final = FinalWeights()
    cfg, dcfg = compose_config(["trainer.steps=3", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2",
                                "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=8",
                                "trainer.checkpoint_every=1", "trainer.keep_at_end=weights", f"zoo_cache={zoo_cache}",
                                f"run_dir={tmp_path / 'run'}"])
    summary = train(cfg, extra_callbacks=[final], config_yaml=OmegaConf.to_yaml(dcfg, resolve=True))  # as the script
    run = tmp_path / "run"
    kept = run / "checkpoints" / "weights_step_0000003.ckpt"
    assert summary["status"] == "completed" and summary["last_checkpoint"] is None
    assert summary["weights_checkpoint"] == str(kept)
    assert [p.name for p in (run / "checkpoints").iterdir()] == [kept.name]
    contents = load_checkpoint_file(kept)
    assert "optimizer_states" not in contents and contents["hacrl"]["steps_done"] == 3
    weight_bytes = sum(t.numel() * t.element_size() for agent in final.weights.values() for t in agent.values())
    assert kept.stat().st_size < 1.5 * weight_bytes
    agents, info = agents_from_checkpoint(run, zoo_cache=zoo_cache)
    assert info["step"] == 3 and info["file"] == str(kept.resolve())
    for name, agent in agents.items():
        assert all(torch.equal(agent.state_dict()[k], w) for k, w in final.weights[name].items()), name
    for given in (run, kept):  # the run, or the file itself (which Lightning would fail on with a KeyError)
        with pytest.raises(FileNotFoundError, match=r"weights_step_0000003\.ckpt.*keep_at_end=weights"):
            train(config(tmp_path, zoo_cache, "agents=[tiny_a,tiny_b]", "trainer.steps=4", f"resume={given}"))
    assert kept.is_file()
