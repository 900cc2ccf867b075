"""`Agent`: loading (zoo, local dir, hub id), chat prompts, log-probs, export, and clear refusals."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hacrl_lightning.agents import Agent, AgentLoadError, LossyTokenizerError
from hacrl_lightning.zoo.builder import greedy_responses
from hacrl_lightning.config import AgentConfig, DataConfig
from hacrl_lightning.data import synthetic_examples

from conftest import agent_preset, save_lossy_wordpiece

QUESTIONS = [ex.prompt for ex in synthetic_examples(DataConfig(), "eval", 6)]


@pytest.fixture(scope="module")
def exported(zoo_agents, tmp_path_factory) -> Path:
    """tiny_b exported as a standalone Hugging Face directory (stands in for a downloaded hub model)."""
    return zoo_agents["tiny_b"].export(tmp_path_factory.mktemp("export") / "tiny_b")


def test_an_agent_is_a_module_holding_only_the_model(zoo_agents):
    agent = zoo_agents["tiny_a"]
    agents = torch.nn.ModuleDict(zoo_agents)
    assert dict(agent.named_children()).keys() == {"model"}
    assert all(key.startswith("model.") for key in agent.state_dict())
    assert sum(p.numel() for p in agents.parameters()) == sum(
        p.numel() for a in zoo_agents.values() for p in a.model.parameters())
    assert agent.tokenizer.padding_side == "left" and agent.pad_token_id is not None
    assert agent.eos_token_id in agent.eos_token_ids


def test_prompts_use_the_agents_chat_template_and_are_left_truncated(load_zoo_agent):
    agent = load_zoo_agent("tiny_b", system_prompt="Be brief.")
    rendered = agent.render_prompts(QUESTIONS[:1])[0]
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert rendered.endswith(f"{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n")
    ids = agent.encode_prompts([QUESTIONS[0]])[0]
    assert agent.tokenizer.decode(ids) == rendered
    assert agent.encode_prompts(QUESTIONS) == [agent.encode_prompts([q])[0] for q in QUESTIONS]
    short = load_zoo_agent("tiny_b", max_prompt_len=5)
    full = short.encode_prompts(QUESTIONS[:1], truncate=False)[0]
    assert short.encode_prompts([QUESTIONS[0]])[0] == full[-5:] and len(full) > 5


def test_chat_template_override_and_kwargs(load_zoo_agent):
    template = ("{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
                "{% if add_generation_prompt %}{{ tag }}:{% endif %}")
    agent = load_zoo_agent("tiny_c", chat_template=template, chat_template_kwargs={"tag": "ans"})
    assert agent.render_prompts(["1 + 1?"]) == ["[1 + 1?]ans:"]


def test_token_logprobs_are_next_token_logprobs_whatever_the_padding(zoo_agents):
    agent = zoo_agents["tiny_a"]
    rows = [agent.encode_prompts([q])[0] + agent.encode_response(["\\boxed{1}"])[0] for q in QUESTIONS[:3]]
    rows[1] = rows[1][:-7]  # different lengths
    width = max(map(len, rows))
    with torch.no_grad():
        expected = []
        for row in rows:
            ids = torch.tensor([row])
            logits = agent.model(input_ids=ids).logits[0].float() / 0.7
            expected.append(torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1))
        for side in ("left", "right"):
            pad = [[agent.pad_token_id] * (width - len(r)) for r in rows]
            ids = torch.tensor([p + r if side == "left" else r + p for p, r in zip(pad, rows)])
            mask = torch.tensor([[0] * len(p) + [1] * len(r) if side == "left" else [1] * len(r) + [0] * len(p)
                                 for p, r in zip(pad, rows)])
            got = agent.token_logprobs(ids, mask, temperature=0.7)
            assert got.shape == ids.shape and got.dtype == torch.float32
            for b, row in enumerate(rows):
                real = got[b][mask[b].bool()]
                assert real[0] == 0.0
                torch.testing.assert_close(real[1:], expected[b], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["tiny_a", "tiny_c"])  # Qwen3 and GPT-2 (Conv1D) blocks
@pytest.mark.parametrize("keeps", [True, False], ids=["logits_to_keep", "sliced"])
def test_log_probs_from_the_first_response_column_are_the_full_ones_there_with_the_same_gradients(
        load_zoo_agent, name, keeps):
    """`first_target`: the output layer runs on the response positions only (transformers' `logits_to_keep`, or the
    full logits sliced where a model lacks it). Right-padded rows of different prompt lengths, as an update sees
    them: from the first response column on, the log-probs and the gradients of a response-only loss equal the full
    computation's to fp32 round-off (the output layer's matmul may sum fewer rows in another order), and are 0
    before it."""
    from hacrl_lightning.agents.agent import first_target_column

    agent = load_zoo_agent(name)
    agent._logits_to_keep = keeps
    prompts = [agent.encode_prompts([q])[0] for q in QUESTIONS[:3]]
    answers = agent.encode_response(["\\boxed{12}", "\\boxed{7}", "\\boxed{345}"])
    width = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ids = torch.full((3, width), agent.pad_token_id)
    mask, targets = torch.zeros(3, width, dtype=torch.long), torch.zeros(3, width, dtype=torch.bool)
    for b, (p, a) in enumerate(zip(prompts, answers)):
        ids[b, : len(p) + len(a)] = torch.tensor(p + a)
        mask[b, : len(p) + len(a)] = 1
        targets[b, len(p): len(p) + len(a)] = True
    first = first_target_column(targets)
    assert first == min(map(len, prompts)) > 1
    results = []
    for first_target in (1, first):
        agent.zero_grad(set_to_none=True)
        logp = agent.token_logprobs(ids, mask, temperature=0.7, first_target=first_target)
        (logp * targets).sum().backward()
        results.append((logp.detach(), {k: p.grad.clone() for k, p in agent.named_parameters()}))
    (full, full_grads), (kept, kept_grads) = results
    assert kept.shape == full.shape and bool((kept[:, :first] == 0).all())
    torch.testing.assert_close(kept[:, first:], full[:, first:], atol=1e-6, rtol=1e-5)
    for key, grad in full_grads.items():
        torch.testing.assert_close(kept_grads[key], grad, atol=1e-6, rtol=1e-5, msg=key)


def test_gradients_flow_through_token_logprobs(load_zoo_agent):
    agent = load_zoo_agent("tiny_c")
    ids = torch.tensor([agent.encode_prompts([QUESTIONS[0]])[0]])
    agent.token_logprobs(ids, torch.ones_like(ids)).sum().backward()
    assert all(p.grad is not None for p in agent.parameters() if p.requires_grad)


def test_dtype_is_applied(load_zoo_agent):
    agent = load_zoo_agent("tiny_c", dtype="bfloat16")
    assert {p.dtype for p in agent.parameters()} == {torch.bfloat16}
    ids = torch.tensor([agent.encode_prompts([QUESTIONS[0]])[0]])
    assert agent.token_logprobs(ids, torch.ones_like(ids)).dtype == torch.float32


def test_export_loads_and_generates_identically_with_plain_transformers(zoo_agents, exported):
    agent = zoo_agents["tiny_b"]
    model = AutoModelForCausalLM.from_pretrained(exported)
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert json.loads((exported / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer.chat_template == agent.tokenizer.chat_template
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, padding=True, return_tensors="pt",
                                        return_dict=True)
    out = model.generate(**enc, do_sample=False, max_new_tokens=agent.max_response_len)
    plain = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert plain == greedy_responses(agent, QUESTIONS)
    assert any(text.startswith("\\boxed{") for text in plain)


def test_export_writes_a_tokenizer_config_that_transformers_v4_reads(zoo_agents, exported):
    """v4 reads `extra_special_tokens` as a dict (v5 writes a list: "'list' object has no attribute
    'keys'"), adds `token_type_ids` unless told the input names, and takes `model_max_length` as the
    context; loader-only keys mean nothing on disk; files are readable by all."""
    agent = zoo_agents["tiny_b"]
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert isinstance(config.get("extra_special_tokens", {}), dict)
    assert config["additional_special_tokens"] == ["<|im_start|>"]
    assert config["model_max_length"] == agent.model.config.max_position_embeddings == agent.context_length == 256
    assert not {"is_local", "local_files_only"} & set(config)
    assert config["model_input_names"] == ["input_ids", "attention_mask"]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in exported.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    reloaded = AutoTokenizer.from_pretrained(exported)  # v5 reads v4's key back: still a special token
    assert "<|im_start|>" in reloaded.all_special_tokens and reloaded.model_max_length == 256
    assert reloaded("<|im_start|>", add_special_tokens=False)["input_ids"] == [
        agent.tokenizer.convert_tokens_to_ids("<|im_start|>")]


V4_PYTHON = os.environ.get("HACRL_V4_PYTHON", "")
"""A Python with transformers 4.57 (and torch, protobuf): not a project dependency; docs/agents.md says how."""
V4_GREEDY = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tokenizer = AutoModelForCausalLM.from_pretrained(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[1])
messages = [[{"role": "user", "content": q}] for q in json.loads(sys.argv[2])]
enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, padding=True, return_tensors="pt",
                                    return_dict=True)
out = model.generate(**enc, do_sample=False, max_new_tokens=int(sys.argv[3]))
import transformers
print(json.dumps({"version": transformers.__version__, "max_length": tokenizer.model_max_length,
                  "greedy": tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)}))
"""


@pytest.mark.skipif(not V4_PYTHON, reason="set HACRL_V4_PYTHON to a Python with transformers 4.57 (docs/agents.md)")
@pytest.mark.parametrize("name", ["tiny_a", "tiny_b", "tiny_c"])
def test_export_loads_and_generates_identically_in_transformers_v4(zoo_agents, tmp_path, name):
    agent = zoo_agents[name]
    directory = agent.export(tmp_path / name)
    result = subprocess.run([V4_PYTHON, "-c", V4_GREEDY, str(directory), json.dumps(QUESTIONS),
                             str(agent.max_response_len)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    v4 = json.loads(result.stdout.splitlines()[-1])
    assert v4["version"].startswith("4.") and v4["max_length"] == agent.context_length
    assert v4["greedy"] == greedy_responses(agent, QUESTIONS)


def test_a_local_directory_loads_like_a_hub_model(zoo_agents, exported):
    agent = Agent.load("local_b", AgentConfig(model=str(exported), max_response_len=24))
    original = zoo_agents["tiny_b"]
    ids = torch.tensor([original.encode_prompts([QUESTIONS[0]])[0]])
    assert agent.encode_prompts([QUESTIONS[0]])[0] == ids[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(agent.token_logprobs(ids, torch.ones_like(ids)),
                                   original.token_logprobs(ids, torch.ones_like(ids)))


def test_pad_defaults_to_eos(exported, tmp_path):
    copy = Path(shutil.copytree(exported, tmp_path / "no_pad"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    agent = Agent.load("nopad", AgentConfig(model=str(copy)))
    assert agent.pad_token_id == agent.eos_token_id


def test_an_unreachable_hub_model_fails_fast_and_says_how_to_use_a_local_dir(monkeypatch):
    for offline in ("1", None):
        if offline:
            monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        else:
            monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        start = time.perf_counter()
        with pytest.raises(AgentLoadError) as info:
            Agent.load("qwen", AgentConfig(model="hacrl-lightning-tests/no-such-model"))
        assert time.perf_counter() - start < 30
        message = str(info.value)
        assert "agent 'qwen'" in message and "agents.qwen.model=/path/to/dir" in message


@pytest.mark.parametrize("model,match", [
    ("./no/such/dir", "is not a directory"),
    ("zoo:tiny_z", r"zoo preset 'tiny_z' is unknown.*tiny_a"),
])
def test_bad_sources_are_named(model, match):
    with pytest.raises(AgentLoadError, match=match):
        Agent.load("x", AgentConfig(model=model))


def test_a_lossy_tokenizer_is_refused_with_an_example(exported, tmp_path):
    save_lossy_wordpiece(tmp_path / "wordpiece", ["\\", "boxed", "{", "}", "answer", "is", "##ed"])
    cfg = AgentConfig(model=str(exported), tokenizer=str(tmp_path / "wordpiece"))
    with pytest.raises(LossyTokenizerError) as info:
        Agent.load("wp", cfg, check_texts=["answer is \\boxed{19}"])
    message = str(info.value)
    assert "agent 'wp'" in message and "\\\\boxed{19}" in message and "lossy" in message


@pytest.mark.slow
def test_another_models_tokenizer_is_refused_before_the_weights_load(monkeypatch):
    """tiny_a's model (356 embedding rows) with tiny_qwen3's tokenizer (151,669 tokens): on main this
    loaded and died in the first forward with `IndexError: index out of range in self`."""
    loads = []
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(a) or real(cls, *a, **k)))
    with pytest.raises(AgentLoadError) as info:
        Agent.load("a", AgentConfig(model="zoo:tiny_a", tokenizer="zoo:tiny_qwen3"), check_texts=())
    message = str(info.value)
    assert "agent 'a': agents.a.tokenizer='zoo:tiny_qwen3'" in message, message
    assert "151,669 tokens" in message and "356 rows" in message and "drop agents.a.tokenizer" in message
    assert loads == []


def test_a_tokenizer_without_chat_template_needs_one(exported, tmp_path):
    copy = Path(shutil.copytree(exported, tmp_path / "no_template"))
    (copy / "chat_template.jinja").unlink()
    with pytest.raises(AgentLoadError, match=r"no chat template.*agents.bare.chat_template="):
        Agent.load("bare", AgentConfig(model=str(copy)))
    agent = Agent.load("bare", AgentConfig(model=str(copy), chat_template="{{ messages[0]['content'] }}="))
    assert agent.render_prompts(["2+2"]) == ["2+2="]


def test_paper_presets_name_hub_models_and_bfloat16():
    for name in ("qwen3_1.7b", "llama3_8b", "qwen3_4b_base"):
        cfg = agent_preset(name)
        assert "/" in cfg.model and cfg.dtype == "bfloat16" and cfg.lr == pytest.approx(1e-6)
