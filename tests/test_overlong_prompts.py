"""Prompts longer than an agent's max_prompt_len are dropped at load, as the authors' recipe does (verl's
`filter_overlong_prompts=true`; docs/spec.md §11): real zoo agents with their own tokenizers and chat
templates, and a real one-step run that counts the dropped prompts in its output and summary.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch import Callback

from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import DataConfig
from hacrl_lightning.data.filters import drop_overlong_prompts, prompt_lengths
from hacrl_lightning.data.tasks import load_task
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.training import train


def with_prompt_limit(agent, limit):
    """A shallow copy of a session agent whose config says `max_prompt_len=limit` (the agent is not changed)."""
    from copy import copy
    from dataclasses import replace

    clone = copy(agent)
    clone.cfg = replace(agent.cfg, max_prompt_len=limit)
    return clone


def limit_dropping_some(lengths, keep):
    """The smallest prompt limit that keeps at least `keep` of these lengths and drops at least one."""
    fits = [n for n in sorted(set(lengths)) if sum(m <= n for m in lengths) >= keep and max(lengths) > n]
    assert fits, f"no limit keeps {keep} and drops some of {sorted(lengths)}"
    return fits[0]


def test_a_prompt_too_long_for_any_agent_is_dropped(zoo_agents):
    examples = list(load_task(DataConfig(train_size=64))[0])
    a, b = zoo_agents["tiny_a"], zoo_agents["tiny_b"]
    lengths = prompt_lengths({"tiny_a": a, "tiny_b": b}, [ex.prompt for ex in examples])
    limit = limit_dropping_some(lengths["tiny_b"], keep=8)  # some prompts are too long for tiny_b
    agents = {"tiny_a": a, "tiny_b": with_prompt_limit(b, limit)}
    kept, count = drop_overlong_prompts(examples, agents, what="synthetic (train)")
    too_long = [i for i, n in enumerate(lengths["tiny_b"]) if n > limit]
    assert 0 < len(too_long) < len(examples) and max(lengths["tiny_a"]) <= a.max_prompt_len
    assert kept == [ex for i, ex in enumerate(examples) if i not in too_long]  # order kept, nothing else dropped
    assert count == {"dropped": len(too_long), "total": len(examples), "tiny_a": 0, "tiny_b": len(too_long)}


def test_a_data_set_with_nothing_left_is_refused_naming_the_lengths_and_a_fix_that_works(zoo_agents):
    examples = list(load_task(DataConfig(train_size=16))[0])
    agents = {"tiny_a": with_prompt_limit(zoo_agents["tiny_a"], 8), "tiny_b": zoo_agents["tiny_b"]}
    with pytest.raises(ConfigError) as raised:
        drop_overlong_prompts(examples, agents, what="synthetic (train)")
    (problem,) = raised.value.problems  # tiny_b's limit holds every prompt: only tiny_a's is named
    assert problem.key == "agents.tiny_a.max_prompt_len" and problem.value == 8
    assert "all 16 prompts of synthetic (train)" in problem.fix and "data.filter_overlong_prompts=false" in problem.fix
    needed = int(problem.fix.split("max_prompt_len=")[1].split()[0])
    assert needed > 8
    kept, count = drop_overlong_prompts(examples, {**agents, "tiny_a": with_prompt_limit(zoo_agents["tiny_a"], needed)},
                                        what="synthetic (train)")
    assert kept and count["dropped"] == 16 - len(kept)


def test_a_run_drops_overlong_prompts_and_counts_them(tmp_path, zoo_cache, zoo_agents, capsys):
    overrides = ["agents=[tiny_a,tiny_b]", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2",
                 "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=32", "trainer.export_agents=false",
                 "trainer.micro_batch_size=8", "trainer.steps=1", "data.train_size=64", f"zoo_cache={zoo_cache}"]
    train_set, held_out = load_task(compose_config([*overrides, f"run_dir={tmp_path / 'x'}"])[0].data)
    texts = [ex.prompt for ex in train_set]
    lengths = prompt_lengths({"tiny_b": zoo_agents["tiny_b"]}, texts)["tiny_b"]
    limit = limit_dropping_some(lengths, keep=4)
    dropped = sum(n > limit for n in lengths)
    held_dropped = sum(n > limit for n in prompt_lengths({"tiny_b": zoo_agents["tiny_b"]},
                                                          [ex.prompt for ex in held_out])["tiny_b"])
    cfg, _ = compose_config([*overrides, f"agents.tiny_b.max_prompt_len={limit}", f"run_dir={tmp_path / 'run'}"])
    metrics = []

    class KeepMetrics(Callback):
        def on_train_batch_end(self, trainer, module, *args):
            metrics.append(dict(module.last_metrics))

    summary = train(cfg, extra_callbacks=[KeepMetrics()])
    assert summary["status"] == "completed" and 0 < dropped <= 64 - 4
    assert summary["prompts_dropped_overlong"] == {
        "train": {"dropped": dropped, "total": 64, "tiny_a": 0, "tiny_b": dropped},
        "held_out": {"dropped": held_dropped, "total": 32, "tiny_a": 0, "tiny_b": held_dropped}}
    assert f"data: train: dropped {dropped} of 64 prompts longer than an agent's max_prompt_len " \
           f"(too long for tiny_a 0, tiny_b {dropped})" in capsys.readouterr().out
    assert Path(cfg.run_dir, "summary.json").is_file()
    # every kept prompt fits every agent: no view row, own or a partner's, has its prompt cut (docs/spec.md §11)
    assert [m["tiny_a/degenerate/prompt_truncated"] for m in metrics] == [0]
    assert [m["tiny_b/degenerate/prompt_truncated"] for m in metrics] == [0]
