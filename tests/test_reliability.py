"""Faults lose nothing and runs are reproducible, on real tiny zoo agents (docs/reliability.md).

- numerical faults: NaN logits injected by a forward hook on one agent (only while gradients are on,
  i.e. in its update passes) skip exactly that agent's updates, leave its weights and optimizer
  state bit-identical, let the other agent train, and stop the run after too many faulty steps;
- an exception inside an agent's update (lr=1e38: AdamW overflows float32) ends a real `scripts/train.py`
  with one message naming the agent and the setting, exit 1, a `failed` summary;
- crash safety: a real `scripts/train.py` killed with SIGKILL half-way through writing a checkpoint
  (the `HACRL_CRASH_IN_CHECKPOINT` hook) leaves the previous checkpoint loadable, and
  `resume=<run dir>` picks the newest complete one and finishes the run;
- determinism: two runs with the same seed give identical metrics and weights;
- degenerate rollouts (empty, never-stopping, unrepresentable text, over-long prompts, all rewards
  equal), built from the real step's rollouts: every step completes and the metrics count them.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from hacrl_lightning.callbacks.checkpoint import CRASH_ENV, latest_checkpoint
from hacrl_lightning.cli import compose_config
from hacrl_lightning.data.synthetic import format_answer
from hacrl_lightning.datamodule import RolloutDataModule
from hacrl_lightning.module import NonFiniteError
from hacrl_lightning.rewards import exact_match_reward
from hacrl_lightning.run_dir import LOCK_NAME
from hacrl_lightning.training import train

REPO = Path(__file__).resolve().parents[1]

SMALL = ["agents=[tiny_a,tiny_b]", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
         "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false", "trainer.micro_batch_size=8"]
"""P = 4 prompts, G = 2, n = 2: each learner sees 16 responses, 4 mini-batches (updates) per step."""
UPDATES_PER_STEP = 2 * 4 // 2


def config(run_dir: Path, zoo_cache: Path, *overrides: str):
    cfg, _ = compose_config([*SMALL, f"zoo_cache={zoo_cache}", f"run_dir={run_dir}", *overrides])
    return cfg


def same(a, b) -> bool:
    """Exact equality of nested dicts/lists of tensors and numbers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class Recorder(Callback):
    """Per step: every agent's weights and optimizer state before and after, and the step's metrics."""

    def __init__(self):
        self.before, self.after, self.metrics = [], [], []
        self.final: dict[str, torch.Tensor] = {}

    def _state(self, trainer, module):
        return {name: {"weights": {k: v.detach().clone() for k, v in module.agents[name].state_dict().items()},
                       "optimizer": copy.deepcopy(trainer.optimizers[k].state_dict())}
                for k, name in enumerate(module.names)}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before.append(self._state(trainer, module))

    def on_train_batch_end(self, trainer, module, *args):
        self.after.append(self._state(trainer, module))
        self.metrics.append({k: v for k, v in module.last_metrics.items()
                             if not k.startswith(("time/", "throughput/"))})

    def on_train_end(self, trainer, module):
        self.final = {k: v.detach().clone() for k, v in module.state_dict().items()}


class NaNLogits(Callback):
    """A real fault: a forward hook on `agent`'s output layer turns its logits into NaN during the
    given training steps, only while gradients are on (its update passes; rollouts and old log-probs
    run under no_grad and stay finite, as when a backward-only overflow hits)."""

    def __init__(self, agent: str, steps: set[int] | None):
        self.agent, self.steps, self.active = agent, steps, False

    def setup(self, trainer, module, stage):
        head = module.agents[self.agent].model.get_output_embeddings()
        head.register_forward_hook(lambda mod, args, out: out * float("nan")
                                   if self.active and torch.is_grad_enabled() else None)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.active = self.steps is None or module.steps_done in self.steps


# --- numerical faults ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_nonfinite_update_is_skipped_for_that_agent_only_and_the_run_continues(tmp_path, zoo_cache, recwarn):
    recorder = Recorder()
    summary = train(config(tmp_path / "run", zoo_cache, "trainer.steps=3", "trainer.max_nonfinite_skips=1"),
                    extra_callbacks=[NaNLogits("tiny_b", {1}), recorder])
    assert summary["steps"] == 3
    # step 1: tiny_b's weights AND optimizer state are bit-identical, tiny_a's moved
    assert same(recorder.before[1]["tiny_b"], recorder.after[1]["tiny_b"])
    assert not same(recorder.before[1]["tiny_a"]["weights"], recorder.after[1]["tiny_a"]["weights"])
    assert not same(recorder.before[1]["tiny_a"]["optimizer"], recorder.after[1]["tiny_a"]["optimizer"])
    # steps 0 and 2: tiny_b trains normally (the fault was transient)
    for step in (0, 2):
        assert not same(recorder.before[step]["tiny_b"]["weights"], recorder.after[step]["tiny_b"]["weights"])
    assert [m["tiny_b/skipped_updates"] for m in recorder.metrics] == [0.0, UPDATES_PER_STEP, 0.0]
    assert [m["tiny_b/updates"] for m in recorder.metrics] == [UPDATES_PER_STEP, 0.0, UPDATES_PER_STEP]
    assert all(m["tiny_a/skipped_updates"] == 0.0 for m in recorder.metrics)
    rows = summary["agents"]
    assert rows["tiny_b"]["skipped_updates"] == UPDATES_PER_STEP
    assert rows["tiny_b"]["optimizer_updates"] == 2 * UPDATES_PER_STEP
    assert rows["tiny_a"]["optimizer_updates"] == 3 * UPDATES_PER_STEP and rows["tiny_a"]["skipped_updates"] == 0
    warned = [str(w.message) for w in recwarn if "non-finite" in str(w.message)]
    assert len(warned) == 1 and "agent 'tiny_b'" in warned[0] and "at step 1" in warned[0]


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_repeated_nonfinite_steps_stop_the_run_with_a_clear_error(tmp_path, zoo_cache):
    """max_nonfinite_skips=1: one faulty step is tolerated, the second in a row stops the run."""
    recorder = Recorder()
    with pytest.raises(NonFiniteError, match=r"agent 'tiny_b'.* 2 steps in a row \(last: step 1\).*"
                                             r"trainer.max_nonfinite_skips=1.*resume"):
        train(config(tmp_path / "run", zoo_cache, "trainer.steps=4", "trainer.max_nonfinite_skips=1"),
              extra_callbacks=[NaNLogits("tiny_b", None), recorder])
    assert len(recorder.before) == 2 and len(recorder.after) == 1  # stopped inside step 1
    assert same(recorder.before[0]["tiny_b"], recorder.after[0]["tiny_b"])


@pytest.mark.slow
def test_an_exception_in_an_update_ends_the_run_naming_the_agent_and_the_setting(tmp_path, zoo_cache):
    """lr=1e38 is finite, so the config takes it, but AdamW overflows float32 at the first update: on main a
    RuntimeError traceback from inside torch.optim; now one message naming the agent, the step and the lr,
    exit 1, a `failed` summary and the lock released."""
    run = tmp_path / "run"
    result = run_script([*SMALL, "trainer.steps=2", "agents.tiny_a.lr=1e38", f"zoo_cache={zoo_cache}", f"run_dir={run}"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "agent 'tiny_a'" in error and "training step 1" in error and "overflow" in error
    assert "agents.tiny_a.lr=1e+38 is far above" in error and "overwrite=true" in error
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("UpdateFailed: agent 'tiny_a'")
    assert summary["steps"] == 0 and not (run / LOCK_NAME).exists()


# --- determinism --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_seed_gives_identical_metrics_and_weights(tmp_path, zoo_cache):
    runs = []
    for name in ("first", "second"):
        recorder = Recorder()
        train(config(tmp_path / name, zoo_cache, "trainer.steps=2", "seed=7"), extra_callbacks=[recorder])
        runs.append(recorder)
    first, second = runs
    assert len(first.metrics) == 2 and first.metrics == second.metrics  # every float, exactly
    assert first.final.keys() == second.final.keys() and len(first.final) > 0
    for key, value in first.final.items():
        assert torch.equal(value, second.final[key]), key
    assert not same(first.before[0]["tiny_a"]["weights"], first.after[1]["tiny_a"]["weights"])  # it did train


# --- degenerate rollouts ------------------------------------------------------------------------------


def degenerate_rollout(monkeypatch):
    """Replace tiny_a's rollouts of step 0 with constructed degenerate ones, and make every reward of
    step 1 equal, before the views are built; everything else (generation, scoring of the rest, the
    exchange, losses, updates) is the real code."""
    real_rollout, real_gather = RolloutDataModule.rollout, RolloutDataModule.gather
    current = {}

    def rollout(dm: RolloutDataModule, examples, *, step: int):
        current["step"] = step
        return real_rollout(dm, examples, step=step)

    def gather(dm: RolloutDataModule, examples, rollouts):
        examples, rollouts, stats = real_gather(dm, examples, rollouts)
        n, group = len(dm.names), dm.group_size
        if current["step"] == 0:
            a = dm.agents["tiny_a"]
            never_stops = a.encode_response(["1" * a.max_response_len])[0][: a.max_response_len]
            for p, example in enumerate(examples):
                for i in range(group):
                    r = rollouts[(p * n + 0) * group + i]
                    text, ids, finish = format_answer(example.gold), None, "stop"
                    if (p, i) == (0, 0):
                        text, ids = "", [a.eos_token_id]                     # empty: EOS first
                    elif (p, i) == (0, 1):
                        text, ids, finish = a.decode_response(never_stops), never_stops, "length"
                    elif (p, i) == (1, 0):
                        text = "7 <|im_end|> 8"                              # tiny_b's special token, as text
                    r.response, r.finish_reason = text, finish
                    r.token_ids = ids if ids is not None else a.encode_response([text])[0] + [a.eos_token_id]
                    r.reward = float(exact_match_reward(text, example.gold))
        else:
            for r in rollouts:
                r.reward = 1.0
        return examples, rollouts, stats

    monkeypatch.setattr(RolloutDataModule, "rollout", rollout)
    monkeypatch.setattr(RolloutDataModule, "gather", gather)


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_degenerate_rollouts_complete_the_step_and_are_counted(tmp_path, zoo_cache, monkeypatch):
    degenerate_rollout(monkeypatch)
    recorder = Recorder()
    # tiny_b's prompt limit is below every chat-templated prompt: with the overlong filter off (it would drop
    # them all), all its prompts are left-truncated
    summary = train(config(tmp_path / "run", zoo_cache, "trainer.steps=2", "agents.tiny_b.max_prompt_len=12",
                           "data.filter_overlong_prompts=false"),
                    extra_callbacks=[recorder])
    assert summary["steps"] == 2
    first, second = recorder.metrics
    rows = 4 * 2 * 2  # P * n * G rows in each learner's view
    assert first["tiny_a/degenerate/empty_frac"] == 1 / 8
    assert first["tiny_a/truncated_frac"] == 1 / 8
    # "<|im_end|>" is a special token of tiny_b; spelled by a partner it stays text (split_special_tokens), so
    # tiny_b gets the text back and does not end the response there
    assert first["tiny_b/degenerate/unrepresentable"] == 0.0
    assert first["tiny_a/degenerate/unrepresentable"] == 0.0  # tiny_a's byte-fallback chars represent any text
    assert first["tiny_b/degenerate/prompt_truncated"] == rows and first["tiny_a/degenerate/prompt_truncated"] == 0
    assert second["rollout/equal_reward_frac"] == 1.0
    for name in ("tiny_a", "tiny_b"):
        assert second[f"{name}/degenerate/zero_adv_frac"] == 1.0 and second[f"{name}/reward"] == 1.0
        for metrics in (first, second):  # every update happened and every number is finite
            assert metrics[f"{name}/updates"] == UPDATES_PER_STEP and metrics[f"{name}/skipped_updates"] == 0
            assert all(v == v and abs(v) != float("inf") for k, v in metrics.items() if k.startswith(name)
                       and "ratio" not in k and "clip" not in k), metrics


# --- crash safety -------------------------------------------------------------------------------------


def run_script(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_then_resume_picks_the_newest_complete_one(tmp_path, zoo_cache):
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=3", "trainer.checkpoint_every=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    killed = run_script(args, env={CRASH_ENV: "2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    checkpoints = run / "checkpoints"
    partial = checkpoints / "step_0000002.ckpt.partial"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_0000001.ckpt", "step_0000002.ckpt.partial"]
    with pytest.raises(Exception):  # the half-written file is not a checkpoint
        torch.load(partial, weights_only=False)
    previous = torch.load(checkpoints / "step_0000001.ckpt", weights_only=False)
    assert previous["hacrl"]["steps_done"] == 1 and len(previous["optimizer_states"]) == 2
    assert latest_checkpoint(run) == checkpoints / "step_0000001.ckpt"

    resumed = run_script([*args, f"resume={run}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    assert summary["agents"]["tiny_a"]["optimizer_updates"] == 3 * UPDATES_PER_STEP  # 1 before the kill, 2 after
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step_000000{s}.ckpt" for s in (1, 2, 3)]
    assert torch.load(latest_checkpoint(run), weights_only=False)["hacrl"]["steps_done"] == 3
