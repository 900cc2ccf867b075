"""vLLM engines sleep between rollouts (`rollout.sleep`): the order of sleep, wake and sync, and who calls them.

vLLM's sleep mode exists only on CUDA (its CPU build has none, and the preflight refuses it there: the vLLM
lane's tests/test_vllm.py), so `FakeSleepingLLM` stands in for a CUDA `vllm.LLM`: a fake named as such,
recording the calls `VLLMEngine` makes of it. Which generation is followed by a sleep is checked on the real DataModule with real
transformers engines, each given a recording `rest`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hacrl_lightning.rollout.vllm import VLLMEngine


class FakeSleepingLLM:
    """A fake of a CUDA `vllm.LLM` with `enable_sleep_mode=True` (not available on this machine): records calls."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method, kwargs=None):
        self.calls.append(("rpc", method))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        return []


def fake_engine(tmp_path: Path, *, sleeps: bool) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.model_dir, engine.eos_token_ids, engine.dtype = tmp_path, (2,), torch.float32
    engine.in_process, engine.platform, engine.sleeps, engine.state = False, "cuda", sleeps, "awake"
    engine.shared_memory = None  # the file sync: its rpc is what the fake records
    engine.stale = False
    engine._vllm = SimpleNamespace(SamplingParams=lambda **kwargs: kwargs)
    engine.llm = FakeSleepingLLM()
    (tmp_path / "config.json").write_text("{}")
    return engine


def sampling():
    from hacrl_lightning.rollout import SamplingSettings

    return SamplingSettings(n=1, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4, seed=0)


def test_a_sleeping_engine_wakes_weights_then_syncs_and_wakes_its_cache_when_it_generates(tmp_path):
    engine = fake_engine(tmp_path, sleeps=True)
    model = torch.nn.Linear(2, 2)
    engine.generate([[1, 2]], sampling())
    engine.rest()
    assert engine.llm.calls == [("generate", 1), ("sleep", 2)]  # level 2: the weights are re-sent anyway
    with pytest.raises(RuntimeError, match="sleeps"):  # no weights until a sync: never answer with garbage
        engine.generate([[1, 2]], sampling())
    engine.llm.calls.clear()
    engine.sync_weights(model)
    assert engine.llm.calls == [("wake_up", ("weights",)), ("rpc", "reload_weights"), ("reset_prefix_cache",)]
    assert engine.state == "weights" and (tmp_path / "model.safetensors").is_file()
    engine.llm.calls.clear()
    engine.generate([[1, 2]], sampling())  # its turn: the KV cache only now
    engine.generate([[1, 2]], sampling())  # (an evaluation after the rollout: awake already)
    assert engine.llm.calls == [("wake_up", ("kv_cache",)), ("generate", 1), ("generate", 1)]


def test_a_parked_engine_wakes_its_weights_from_host_memory_for_the_first_rollout(tmp_path):
    """Built engines park at level 1 (the next one's build and the trainer find the GPU free); the first
    rollout, before any sync, wakes the weights kept in host memory, then the KV cache."""
    engine = fake_engine(tmp_path, sleeps=True)
    engine.park()
    engine.generate([[1, 2]], sampling())
    assert engine.llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("generate", 1)]
    engine.llm.calls.clear()
    engine.park()
    engine.sync_weights(torch.nn.Linear(2, 2))  # a sync first (an engine parked again): weights woken, then filled
    assert engine.llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("rpc", "reload_weights"),
                                ("reset_prefix_cache",)]


def test_without_sleep_rest_does_nothing(tmp_path):
    engine = fake_engine(tmp_path, sleeps=False)
    engine.rest()
    engine.sync_weights(torch.nn.Linear(2, 2))
    assert engine.llm.calls == [("rpc", "reload_weights"), ("reset_prefix_cache",)]


@pytest.mark.slow
def test_engines_rest_after_training_rollouts_not_after_evaluation(zoo_cache):
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.training import load_agents, make_datamodule

    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "rollout.group_size=2", f"zoo_cache={zoo_cache}"])
    dm = make_datamodule(cfg, load_agents(cfg))
    dm.setup("fit")
    rests = []
    for name, engine in dm.engines.items():
        engine.rest = lambda name=name: rests.append(name)  # the transformers engine has no sleep: record the call
    dm.rollout(list(dm.train_set)[:2], step=0)
    assert rests == ["tiny_a", "tiny_b"]  # each right after its own generation
    dm.evaluate(limit=2)
    assert rests == ["tiny_a", "tiny_b"]  # an evaluation is followed by the next step's rollout, not a sync
    dm.teardown("fit")


def test_an_engine_whose_sync_failed_refuses_to_generate_until_a_sync_completes(tmp_path, monkeypatch):
    """A push that fails half way may leave the engine with part old, part new weights: it does not answer
    with them (one line saying why) until the next sync completes."""
    engine = fake_engine(tmp_path, sleeps=False)
    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(engine, "_push", lambda model: (_ for _ in ()).throw(OSError("no space left")))
    with pytest.raises(OSError, match="no space left"):
        engine.sync_weights(model)
    with pytest.raises(RuntimeError, match="last weight sync failed"):
        engine.generate([[1, 2]], sampling())
    monkeypatch.setattr(engine, "_push", lambda model: None)
    engine.sync_weights(model)
    engine.generate([[1, 2]], sampling())
    assert engine.llm.calls[-1] == ("generate", 1)
