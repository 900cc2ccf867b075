"""Rollout engines on real tiny zoo agents: log-prob parity with training, grouping, EOS, seeds, fresh weights."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from conftest import ZOO_AGENTS
from hacrl_lightning.rollout import Generation, SamplingSettings, close_engines, engine_options, make_engine
from hacrl_lightning.rollout.hf import HFEngine, split_response
from hacrl_lightning.rollout.vllm import require_vllm, sampling_params_kwargs, to_generations

QUESTIONS = ["What is 12 + 7? Put the answer in \\boxed{}.", "What is 3 - 9? Put the answer in \\boxed{}."]


def engine_for(agent, batch_size=64):
    return make_engine("hf", agent.model, eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id,
                       batch_size=batch_size)


def forward_logprobs(agent, prompt_ids, generation, temperature):
    """The trainer's log-probs of the generated tokens: one forward pass over prompt + response."""
    ids = torch.tensor([prompt_ids + generation.token_ids])
    with torch.no_grad():
        logp = agent.token_logprobs(ids, torch.ones_like(ids), temperature=temperature)[0]
    return logp[len(prompt_ids):]


@pytest.mark.parametrize("name", ZOO_AGENTS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_training_forward_and_samples_are_grouped(load_zoo_agent, name, temperature):
    agent = load_zoo_agent(name)
    agent.eval()
    prompts = agent.encode_prompts(QUESTIONS)
    n = 3
    # batch_size 4 forces two generate() chunks: grouping must survive chunking
    gens = engine_for(agent, batch_size=4).generate(prompts, SamplingSettings(max_new_tokens=12, n=n, temperature=temperature, seed=0))
    assert len(gens) == len(prompts) * n
    for index, gen in enumerate(gens):
        prompt = prompts[index // n]  # result[p * n + i] belongs to prompt p
        expected = forward_logprobs(agent, prompt, gen, temperature)
        assert len(gen.logprobs) == len(gen.token_ids) > 0
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ZOO_AGENTS)
def test_stop_at_own_eos_length_otherwise_and_seeds_reproduce(load_zoo_agent, name):
    agent = load_zoo_agent(name)
    engine = engine_for(agent)
    prompts = agent.encode_prompts(QUESTIONS)
    settings = SamplingSettings(max_new_tokens=agent.max_response_len, n=4, seed=123)
    gens = engine.generate(prompts, settings)
    eos = set(agent.eos_token_ids)
    for gen in gens:
        body = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        assert not eos & set(body)  # nothing after (or before) the first EOS
        if gen.finish_reason == "stop":
            assert gen.token_ids[-1] in eos
        else:
            assert len(gen.token_ids) == agent.max_response_len
    assert any(g.finish_reason == "stop" for g in gens)  # warm-started agents do finish
    short = engine.generate(prompts, SamplingSettings(max_new_tokens=2, n=2, seed=1))
    assert all(g.finish_reason == "length" and len(g.token_ids) == 2 for g in short if g.token_ids[-1] not in eos)
    again = engine.generate(prompts, settings)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    other = engine.generate(prompts, SamplingSettings(max_new_tokens=agent.max_response_len, n=4, seed=124))
    assert [g.token_ids for g in other] != [g.token_ids for g in gens]


def test_greedy_needs_one_sample_and_global_rng_is_untouched(load_zoo_agent):
    agent = load_zoo_agent("tiny_a")
    engine = engine_for(agent)
    prompts = agent.encode_prompts(QUESTIONS)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    greedy = engine.generate(prompts, SamplingSettings(max_new_tokens=10, temperature=0.0, seed=5))
    assert torch.equal(torch.rand(3), expected)  # the engine's seed does not leak into the caller's RNG
    assert len(greedy) == 2
    with pytest.raises(ValueError, match="greedy"):
        engine.generate(prompts, SamplingSettings(max_new_tokens=4, n=2, temperature=0.0))


def test_generation_after_an_update_uses_the_new_weights(load_zoo_agent):
    agent = load_zoo_agent("tiny_b")
    engine = engine_for(agent)
    prompts = agent.encode_prompts(QUESTIONS[:1])
    settings = SamplingSettings(max_new_tokens=8, n=2, seed=3)
    before = engine.generate(prompts, settings)
    # one optimizer step that pushes the sampled responses' likelihood down hard
    optimizer = torch.optim.SGD(agent.parameters(), lr=5.0)
    for gen in before:
        ids = torch.tensor([prompts[0] + gen.token_ids])
        (agent.token_logprobs(ids, torch.ones_like(ids))[0, len(prompts[0]):].sum()).backward()
    optimizer.step()
    engine.sync_weights(agent.model)  # a no-op for the HF backend: it shares the module
    after = engine.generate(prompts, settings)
    for gen in after:
        torch.testing.assert_close(torch.tensor(gen.logprobs), forward_logprobs(agent, prompts[0], gen, 1.0),
                                   atol=1e-4, rtol=0)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]


def test_hf_engine_refuses_another_module_and_split_response():
    model = torch.nn.Linear(2, 2)
    engine = HFEngine(model, eos_token_ids=[5], pad_token_id=0)
    with pytest.raises(ValueError, match="shares the training module"):
        engine.sync_weights(torch.nn.Linear(2, 2))
    assert split_response([1, 5, 5, 0], [-1.0, -2.0, -3.0, -4.0], {5}, 4) == Generation([1, 5], "stop", [-1.0, -2.0])
    assert split_response([1, 2, 3], [-1.0] * 3, {5}, 3) == Generation([1, 2, 3], "length", [-1.0] * 3)


def test_unknown_backend_and_vllm_without_gpu_give_clear_errors():
    with pytest.raises(ValueError, match="rollout=hf"):
        make_engine("sglang", torch.nn.Linear(1, 1))
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match=r"\[vllm\].*rollout=hf"):
        require_vllm()


def test_vllm_sampling_mapping_and_output_conversion():
    settings = SamplingSettings(max_new_tokens=16, n=4, temperature=0.9, top_p=1.0, top_k=0, seed=11, stop_token_ids=(9,))
    kwargs = sampling_params_kwargs(settings, stop_token_ids=[2])
    assert kwargs == dict(n=4, temperature=0.9, top_p=1.0, top_k=-1, max_tokens=16, seed=11, stop_token_ids=[2, 9],
                          logprobs=0, detokenize=False, ignore_eos=False)
    # FakeRequestOutput: vLLM cannot exist on this machine, so its output objects are stood in for
    step = lambda token, lp: {token: SimpleNamespace(logprob=lp)}  # noqa: E731
    fake = [SimpleNamespace(outputs=[
        SimpleNamespace(token_ids=[4, 2], logprobs=[step(4, -0.1), step(2, -0.2)], finish_reason="stop", stop_reason=None),
        SimpleNamespace(token_ids=[4], logprobs=[step(4, -0.3)], finish_reason="stop", stop_reason=2),
        SimpleNamespace(token_ids=[4, 4], logprobs=[step(4, -0.1), step(4, -0.1)], finish_reason="length", stop_reason=None),
    ])]
    gens = to_generations(fake, stop_token_ids=[2])
    assert gens[0] == Generation([4, 2], "stop", [-0.1, -0.2]) and gens[2] == Generation([4, 4], "length", [-0.1, -0.1])
    # a stop token vLLM left out is appended without a log-prob (NaN: the mismatch metric skips it)
    assert gens[1].token_ids == [4, 2] and gens[1].logprobs[0] == -0.3 and math.isnan(gens[1].logprobs[1])


def test_vllm_engine_options_export_the_agent_with_its_memory_share(load_zoo_agent, tmp_path):
    """Training with rollout=vllm: each agent is exported to a HF dir the engine loads (no GPU needed)."""
    agent = load_zoo_agent("tiny_a")
    assert engine_options(agent, "hf", batch_size=8) == dict(
        eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id, batch_size=8)
    options = engine_options(agent, "vllm", batch_size=8, seed=3, export_to=tmp_path / "tiny_a")
    assert options["model_dir"] == tmp_path / "tiny_a" and (tmp_path / "tiny_a" / "config.json").is_file()
    assert agent.cfg.gpu_memory_utilization is None and options["gpu_memory_utilization"] == 0.3  # unset: the default
    assert options["max_model_len"] == agent.max_prompt_len + agent.max_response_len and options["seed"] == 3
    assert engine_options(agent, "vllm", batch_size=8, gpu_memory_utilization=0.4,
                          export_to=tmp_path / "b")["gpu_memory_utilization"] == 0.4


@pytest.mark.parametrize("name, tied", [("tiny_a", True), ("tiny_e", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_file_sync_writes_weights_that_load_back(load_zoo_agent, tmp_path, name, tied, dtype):
    """The file path of the vLLM weight sync (engine in its own process): the pushed weights, cast to the
    engine's dtype, load back with transformers as the trainer's weights. A tied agent pushed in its own
    dtype shares `lm_head.weight` with `embed_tokens.weight`, which safetensors refused."""
    from transformers import AutoModelForCausalLM

    from hacrl_lightning.rollout.vllm import full_state_items, write_weights

    agent = load_zoo_agent(name)
    assert agent.model.config.tie_word_embeddings is tied
    agent.export(tmp_path / "engine")
    with torch.no_grad():
        for param in agent.model.parameters():
            param.add_(0.01)  # a trained model: other weights than the exported ones
    items = ((k, t.to(dtype)) for k, t in full_state_items(agent.model))
    write_weights(tmp_path / "engine", items)
    assert [p.name for p in (tmp_path / "engine").glob("model*.safetensors*")] == ["model.safetensors"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "engine", dtype=torch.float32).state_dict()
    for key, value in agent.model.state_dict().items():
        torch.testing.assert_close(loaded[key], value.to(dtype).float(), rtol=0, atol=0, msg=key)


class _ClosingEngine:
    """An engine whose close waits for every other engine's close to begin (a barrier of all of them), as an
    engine in its own process mostly waits for that process: closed one after another, the first would wait
    forever (here: a broken barrier after 30 s)."""

    in_process = False

    def __init__(self, barrier: threading.Barrier, fails: bool = False):
        self.barrier, self.fails, self.closed = barrier, fails, False

    def close(self) -> None:
        self.barrier.wait(timeout=30)
        self.closed = True
        if self.fails:
            raise RuntimeError("engine 1 could not stop")


def test_engines_close_side_by_side_every_one_even_when_one_fails():
    barrier = threading.Barrier(3)
    engines = [_ClosingEngine(barrier), _ClosingEngine(barrier, fails=True), _ClosingEngine(barrier)]
    with pytest.raises(RuntimeError, match="engine 1 could not stop"):
        close_engines(engines)
    assert all(engine.closed for engine in engines)
    inside = _ClosingEngine(threading.Barrier(1))  # an engine in this process: closed here, alone
    inside.in_process = True
    close_engines([inside, _ClosingEngine(threading.Barrier(1))])
    assert inside.closed
    close_engines([])
