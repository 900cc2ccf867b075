"""The transformers engine's static KV cache and compiled decode step (`rollout.hf_cache`, `rollout.hf_compile`) on
the tiny zoo agents: today's greedy tokens with either cache, log-probs of the kept rows, few compiled graphs, the
shapes' buckets, the options and the settings' checks."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from conftest import ZOO_AGENTS
from hacrl_lightning.config import AgentConfig, RolloutConfig, TrainConfig, config_problems
from hacrl_lightning.rollout import SamplingSettings, engine_options, make_engine
from hacrl_lightning.rollout.hf import bucket, decode_compiled, padded_width

QUESTIONS = ["What is 12 + 7? Put the answer in \\boxed{}.", "What is 3 - 9? Put the answer in \\boxed{}.",
             "What is 40 + 2?"]
"""Three prompts: a chunk of 3 padded to a batch of 4 (one padding row whose answer is dropped)."""


def engine_pair(agent, **static):
    """Today's engine (dynamic cache) and one with the static cache at the agent's lengths."""
    options = dict(eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id, batch_size=8)
    return (make_engine("hf", agent.model, **options),
            make_engine("hf", agent.model, cache="static", max_len=agent.max_prompt_len + agent.max_response_len,
                        **options, **static))


def greedy(agent) -> SamplingSettings:
    """Greedy answers forced to the agent's whole `max_response_len` (stop tokens masked until then)."""
    length = agent.max_response_len
    return SamplingSettings(max_new_tokens=length, temperature=0.0, min_new_tokens=length)


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name == "tiny_b" else pytest.mark.slow)
                                  for name in ZOO_AGENTS])  # the fast lane: one agent (several seconds each)
def test_static_cache_gives_the_dynamic_caches_greedy_tokens_and_the_kept_rows_logprobs(load_zoo_agent, name):
    agent = load_zoo_agent(name)
    prompts = agent.encode_prompts(QUESTIONS)
    dynamic, static = engine_pair(agent, compile_decode=False)
    expected = [g.token_ids for g in dynamic.generate(prompts, greedy(agent))]
    assert [g.token_ids for g in static.generate(prompts, greedy(agent))] == expected
    assert [len(ids) for ids in expected] == [agent.max_response_len] * 3  # every decode step of the cache
    # sampled, 2 per prompt: 4 prompts' rows generated, 3 kept, grouped, each with the trainer's log-probs
    sampled = static.generate(prompts, SamplingSettings(max_new_tokens=6, n=2, seed=0))
    assert len(sampled) == 6
    for index, gen in enumerate(sampled):
        ids = torch.tensor([prompts[index // 2] + gen.token_ids])
        with torch.no_grad():
            logp = agent.token_logprobs(ids, torch.ones_like(ids))[0, len(prompts[index // 2]):]
        torch.testing.assert_close(torch.tensor(gen.logprobs), logp, atol=1e-4, rtol=0)
    assert static.compile_stats == {"graphs": 0.0, "recompiles": 0.0, "seconds": 0.0}  # compile off: nothing


def test_shapes_are_bucketed_and_compile_is_decided_per_device():
    assert [bucket(count, 16) for count in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    assert bucket(5, 6) == 6  # never past the chunk
    assert padded_width(24, max_new_tokens=24, max_len=120) == 64
    assert padded_width(70, max_new_tokens=24, max_len=120) == 96  # 128 would not leave the 24 new tokens room
    assert padded_width(100, max_new_tokens=24, max_len=120) == 100  # a longer prompt keeps its own width
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [decode_compiled(s, d) for s in ("auto", "true", True, "false") for d in (cpu, cuda)] == \
        [False, True, True, True, True, True, False, False]
    assert not decode_compiled("auto", cuda, sharded=True) and decode_compiled("true", cuda, sharded=True)


def test_engine_options_and_the_settings_checks(load_zoo_agent):
    agent = load_zoo_agent("tiny_a")
    options = engine_options(agent, "hf", batch_size=8, hf_cache="static", hf_compile="true")
    assert (options["cache"], options["compile_decode"], options["max_len"]) == ("static", "true", 96 + 24)
    assert "cache" not in engine_options(agent, "hf", batch_size=8)  # the default: today's engine, unchanged
    with pytest.raises(ValueError, match="rollout.hf_cache='paged'.*allowed"):
        make_engine("hf", agent.model, eos_token_ids=[1], pad_token_id=0, cache="paged")
    base = TrainConfig(agents={"a": AgentConfig(model="zoo:tiny_a")})

    def problems(**rollout):
        return {p.key: p for p in config_problems(replace(base, rollout=RolloutConfig(**rollout)))
                if p.key.startswith("rollout.hf_")}

    assert problems(hf_cache="static", hf_compile="true") == {}
    assert set(problems(hf_cache="paged")) == {"rollout.hf_cache"}
    assert "rollout.hf_cache=static" in problems(hf_compile="true")["rollout.hf_compile"].fix
    assert "rollout=hf" in problems(hf_cache="static", backend="vllm")["rollout.hf_cache"].fix
    assert set(problems(hf_cache="static", hf_compile="sometimes")) == {"rollout.hf_compile"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_decode_gives_the_same_greedy_tokens_with_few_graphs(load_zoo_agent, backend):
    """`eager`: dynamo's capture of the decode step alone (the wiring, and the graphs per shape); `inductor`: the
    compiled kernels (one call: ~50 s of compiling on a 2-core CPU)."""
    if backend == "inductor" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        pytest.skip("torch.compile's inductor builds C++ kernels on CPU and no C++ compiler is on PATH")
    agent = load_zoo_agent("tiny_b")
    names = set(agent.model._no_split_modules)
    blocks = [m for m in agent.model.modules() if type(m).__name__ in names]
    for block in blocks:  # compiled in place, as trainer.compile does: generation runs them eager
        block.compile(backend="eager")
    prompts = agent.encode_prompts(QUESTIONS)
    dynamic, compiled = engine_pair(agent, compile_decode=True, compile_backend=backend)
    settings = greedy(agent)
    expected = [g.token_ids for g in dynamic.generate(prompts, settings)]
    assert [g.token_ids for g in compiled.generate(prompts, settings)] == expected
    first = dict(compiled.compile_stats)
    assert first["graphs"] >= 1 and first["seconds"] > 0 and first["recompiles"] == 0
    assert [g.token_ids for g in compiled.generate(prompts, settings)] == expected
    assert compiled.compile_stats == first  # the same shapes: nothing compiled again
    if backend == "eager":  # other buckets: 1 row (torch specializes sizes 0 and 1: a graph of its own) and 8
        compiled.generate(prompts[:1], settings)  # rows (the batch turns dynamic: one graph more), then no more
        compiled.generate(prompts, SamplingSettings(max_new_tokens=6, n=2, seed=0))
        stats = dict(compiled.compile_stats)
        assert stats["graphs"] <= first["graphs"] + 2 and stats["recompiles"] == stats["graphs"] - first["graphs"]
        assert [g.token_ids for g in compiled.generate(prompts[:2], settings)] == expected[:2]  # 2 rows
        assert compiled.compile_stats == stats
    assert all(block._compiled_call_impl is not None for block in blocks)  # the trainer's compiled blocks restored
