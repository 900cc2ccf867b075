"""LoRA agents (`agents.<key>.lora`): only the adapter trains, the base with the adapter off is the KL reference,
exports merge the adapter (and keep it alone beside), and `served_items` equals peft's own merge."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from lightning.pytorch import Callback

from conftest import agent_preset
from hacrl_lightning.agents import Agent
from hacrl_lightning.agents.agent import AgentLoadError
from hacrl_lightning.agents.lora import ADAPTER_DIR, adapter_disabled, is_lora, served_state_dict
from hacrl_lightning.cli import compose_config
from hacrl_lightning.presets import PRESETS
from hacrl_lightning.training import train

PROMPTS = ["What is 3 + 4?", "What is 12 + 9?", "What is 7 + 5?", "What is 20 + 22?"]


def lora_agent(name: str, zoo_cache, **lora) -> Agent:
    return Agent.load(name, agent_preset(name, lora={"rank": 4, **lora}), zoo_cache=zoo_cache, dtype=torch.float32)


def trained_adapter(agent: Agent, seed: int = 0) -> Agent:
    """B drawn away from 0 (as training moves it): the adapter now changes the model's outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in agent.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return agent


def batch(agent: Agent) -> tuple[torch.Tensor, torch.Tensor]:
    rows = agent.encode_prompts(PROMPTS)
    width = max(map(len, rows))
    ids = torch.tensor([[agent.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def greedy(model, agent: Agent) -> list[list[int]]:
    ids, mask = batch(agent)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                             pad_token_id=agent.pad_token_id)
    return out[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("name", ["tiny_a", "tiny_e", "tiny_c"])  # tied (Qwen3), untied (GPT-NeoX), GPT-2's Conv1D
def test_served_weights_equal_peft_s_own_merge(name, zoo_cache):
    agent = trained_adapter(lora_agent(name, zoo_cache))
    served = served_state_dict(agent.model, agent.model.state_dict())
    merged = copy.deepcopy(agent.model).merge_and_unload().state_dict()
    assert served.keys() == merged.keys()
    for key, value in merged.items():  # one fp32 product and add each side: the same rounding
        torch.testing.assert_close(served[key], value, rtol=0, atol=1e-6, msg=key)
    moved = [k for k, v in merged.items() if not torch.equal(v, dict(agent.model.get_base_model().named_parameters())
                                                              .get(k.replace(".weight", ".base_layer.weight"), v))]
    assert moved, "the adapter changed no weight: the check above compared nothing"


def test_a_fresh_adapter_computes_the_base_and_only_the_adapter_trains(zoo_cache):
    base = Agent.load("tiny_a", agent_preset("tiny_a"), zoo_cache=zoo_cache, dtype=torch.float32)
    agent = lora_agent("tiny_a", zoo_cache, target_modules=["q_proj", "v_proj"])
    assert is_lora(agent.model) and not is_lora(base.model)
    ids, mask = batch(agent)
    assert torch.equal(agent.token_logprobs(ids, mask).detach(), base.token_logprobs(ids, mask).detach())  # B = 0
    trainable = [n for n, p in agent.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "v_proj"}


def test_the_reference_with_the_adapter_off_is_the_base_model(zoo_cache):
    """With the adapter switched off a trained LoRA agent scores as a frozen copy of its base, bitwise (the
    same base weights through the same layers; the adapter's branch is skipped, not added as zero)."""
    base = Agent.load("tiny_a", agent_preset("tiny_a"), zoo_cache=zoo_cache, dtype=torch.float32)
    agent = trained_adapter(lora_agent("tiny_a", zoo_cache))
    ids, mask = batch(agent)
    with torch.no_grad():
        on = agent.token_logprobs(ids, mask)
        with adapter_disabled(agent.model):
            off = agent.token_logprobs(ids, mask)
        frozen = base.token_logprobs(ids, mask)
    assert torch.equal(off, frozen)
    assert not torch.allclose(on, frozen, atol=1e-3)  # the adapter does change the scores


def test_the_merged_export_and_the_adapter_alone_answer_as_the_trained_lora_model(zoo_cache, tmp_path):
    agent = trained_adapter(lora_agent("tiny_a", zoo_cache))
    expected = greedy(agent.model, agent)
    with adapter_disabled(agent.model):
        assert greedy(agent.model, agent) != expected  # the adapter changes the greedy answers
    directory = agent.export(tmp_path / "tiny_a")
    assert (directory / "model.safetensors").is_file() and (directory / ADAPTER_DIR / "adapter_config.json").is_file()
    assert json.loads((directory / ADAPTER_DIR / "adapter_config.json").read_text())["base_model_name_or_path"] \
        == "zoo:tiny_a"
    merged = Agent.load("tiny_a", agent_preset("tiny_a", model=str(directory)), zoo_cache=zoo_cache)
    adapter = Agent.load("tiny_a", agent_preset("tiny_a", model=str(directory / ADAPTER_DIR)), zoo_cache=zoo_cache)
    assert not is_lora(merged.model) and not is_lora(adapter.model)  # plain transformers models
    assert greedy(merged.model, merged) == expected
    assert greedy(adapter.model, adapter) == expected
    from transformers import AutoModelForCausalLM  # a deployment: transformers alone

    assert greedy(AutoModelForCausalLM.from_pretrained(directory), agent) == expected


def test_a_target_the_model_lacks_is_refused_naming_the_ones_it_has(zoo_cache):
    with pytest.raises(AgentLoadError) as err:
        lora_agent("tiny_a", zoo_cache, target_modules=["q_proj", "query_key_value"])
    message = str(err.value)
    assert "agents.tiny_a.lora.target_modules" in message and "'query_key_value'" in message
    assert "'q_proj'" in message and "'down_proj'" in message and "lm_head" not in message


def test_a_rank_above_the_targeted_layers_width_is_refused_before_loading_and_at_load(zoo_cache, model_loads):
    """`lora.rank=100000` on a 0.9 MB model trained and wrote a 3.7 GB checkpoint (the fourth round of hostile
    inputs, 2026-11-28): the preflight refuses it from config.json, naming the key, the value, the limit and the fix."""
    from hacrl_lightning.errors import ConfigError
    from hacrl_lightning.architecture import architecture_of

    width = architecture_of("tiny_b", agent_preset("tiny_b"), zoo_cache=zoo_cache).lora_width(["all-linear"])
    model_loads.clear()
    with pytest.raises(ConfigError) as err:
        compose_config(["agents=[tiny_b]", "algorithm=gspo", "agents.tiny_b.lora.rank=100000", f"zoo_cache={zoo_cache}"],
                       preflight=True)
    assert model_loads == []
    assert (f"agents.tiny_b.lora.rank: got 100000; allowed: at most {width}, the fewest in or out features of its "
            "targeted layers") in str(err.value) and f"fix: set agents.tiny_b.lora.rank={min(width, 16)}" in str(err.value)
    compose_config(["agents=[tiny_b]", "algorithm=gspo", f"agents.tiny_b.lora.rank={width}", f"zoo_cache={zoo_cache}"], preflight=True)
    with pytest.raises(AgentLoadError, match=rf"agents.tiny_b.lora.rank={width + 1} is above {width}, .*Fix: set "
                                             rf"agents.tiny_b.lora.rank={min(width, 16)}"):
        lora_agent("tiny_b", zoo_cache, rank=width + 1)  # a model whose architecture the plan did not know


class Weights(Callback):
    """Every agent's state dict and its optimizer's state count at the start and the end of training."""

    def on_train_start(self, trainer, pl_module):
        self.before = {n: {k: v.detach().clone() for k, v in a.model.state_dict().items()}
                       for n, a in pl_module.agents.items()}
        self.module = pl_module

    def on_train_end(self, trainer, pl_module):
        self.after = {n: {k: v.detach().clone() for k, v in a.model.state_dict().items()}
                      for n, a in pl_module.agents.items()}
        opts = pl_module.optimizers()
        self.optimizer_tensors = {n: len(o.optimizer.state) for n, o in zip(pl_module.local, opts)}


def run(tmp_path, zoo_cache, *overrides):
    cfg, _ = compose_config([
        "agents=[tiny_a,tiny_b]", "agents.tiny_a.lora.rank=4", "trainer.steps=2", "data.prompts_per_step=4",
        "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=8",
        "trainer.micro_batch_size=8", f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}", *overrides])
    weights = Weights()
    summary = train(cfg, extra_callbacks=[weights])
    return summary, weights


def assert_only_the_adapter_moved(weights: Weights, lora: str = "tiny_a") -> None:
    before, after = weights.before[lora], weights.after[lora]
    adapters = [k for k in before if ".lora_A." in k or ".lora_B." in k]
    assert adapters and len(adapters) < len(before)
    for key in before:
        if key in adapters:
            assert not torch.equal(before[key], after[key]), f"adapter {key} did not move"
        else:
            assert torch.equal(before[key], after[key]), f"base weight {key} changed"
    assert weights.optimizer_tensors[lora] == len(adapters)  # AdamW state for the adapter only


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_a_mixed_run_trains_only_the_adapter_of_the_lora_agent_and_every_weight_of_the_other(tmp_path, zoo_cache,
                                                                                              script_main, capsys):
    """Then evaluate.py scores the merged export and the adapter alone as the run's own final evaluation did."""
    summary, weights = run(tmp_path, zoo_cache, "algorithm.kl_coef=0.01", "trainer.export_agents=true")
    assert_only_the_adapter_moved(weights)
    full_before, full_after = weights.before["tiny_b"], weights.after["tiny_b"]
    assert all(not torch.equal(full_before[k], full_after[k]) for k in full_before if k.endswith("q_proj.weight"))
    assert weights.optimizer_tensors["tiny_b"] == len(list(weights.module.agents["tiny_b"].parameters()))
    assert list(weights.module.references) == ["tiny_b"]  # the KL reference: a copy for tiny_b only
    assert weights.module.adapter_references == {"tiny_a"}
    assert summary["status"] == "completed"
    export = tmp_path / "run" / "exports" / "tiny_a"
    assert (export / "model.safetensors").is_file() and (export / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "run" / "exports" / "tiny_b" / ADAPTER_DIR).exists()
    for entry in (export, export / ADAPTER_DIR):
        out = tmp_path / f"eval_{entry.name}"
        capsys.readouterr()
        status = script_main("evaluate")([f"agents=[{entry}]", "benchmarks=[synthetic]", "reward_workers=0", "limit=8",
                                          f"output_dir={out}", f"zoo_cache={zoo_cache}"])
        assert status == 0, capsys.readouterr()
        results = json.loads((out / "results.json").read_text())
        assert results["agents"]["tiny_a"]["scores"]["synthetic"]["avg@1"] == summary["agents"]["tiny_a"]["final"]["acc"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_every_algorithm_preset_trains_a_lora_agent(algorithm, tmp_path, zoo_cache):
    """The composition matrix with a LoRA agent (and the experiments' KL penalty, so the adapter-off reference runs)."""
    _, weights = run(tmp_path, zoo_cache, f"algorithm={algorithm}", "algorithm.kl_coef=0.001",
                     "trainer.export_agents=false")
    assert_only_the_adapter_moved(weights)


def test_the_adapter_starts_the_same_whatever_the_process_s_random_state(zoo_cache):
    """A is drawn from a generator of the agent's own (every rank and the reference loop start alike), and loading
    leaves the process's generator where it was."""
    torch.manual_seed(1)
    first = lora_agent("tiny_a", zoo_cache)
    after_first = torch.rand(3)
    torch.manual_seed(2)
    second = lora_agent("tiny_a", zoo_cache)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after_first)
    for (key, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), key
    assert any(".lora_A." in key and a.abs().sum() > 0 for key, a in first.model.state_dict().items())


@pytest.fixture(scope="module")
def lora_export(zoo_cache, tmp_path_factory):
    """A trained LoRA tiny_b exported: the merged weights, and the adapter alone in adapter/."""
    return trained_adapter(lora_agent("tiny_b", zoo_cache)).export(tmp_path_factory.mktemp("lora") / "tiny_b")


def _broken_adapter(source, target, damage):
    import shutil

    shutil.copytree(source, target)
    damage(target)
    return target


def _set_base(folder, base):
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(config))


def test_malformed_adapter_folders_are_one_line_each(lora_export, tmp_path, zoo_cache):
    """Four kinds of malformed adapter folders (the fourth round of hostile inputs, 2026-11-28): each a line naming
    the folder, what is wrong and the fix, never a traceback from peft or json."""
    from hacrl_lightning.evaluation import load_eval_agents

    adapter = lora_export / ADAPTER_DIR
    weights = adapter / "adapter_model.safetensors"
    cases = {
        "no_config": (lambda d: (d / "adapter_config.json").unlink(), "adapter_model.safetensors without its "
                      "adapter_config.json"),
        "not_json": (lambda d: (d / "adapter_config.json").write_text("{not json"), "adapter_config.json is not JSON"),
        "no_weights": (lambda d: (d / "adapter_model.safetensors").unlink(), "is an incomplete export (no weights"),
        "cut_short": (lambda d: (d / "adapter_model.safetensors").write_bytes(weights.read_bytes()[:-64]),
                      "adapter_model.safetensors is damaged or cut short"),
        "targets": (lambda d: (d / "adapter_config.json").write_text(json.dumps(
            {**json.loads((adapter / "adapter_config.json").read_text()), "target_modules": ["c_attn"]})),
            "its target_modules ['c_attn'] are not layers of its base 'zoo:tiny_b'"),
    }
    for name, (damage, said) in cases.items():
        folder = _broken_adapter(adapter, tmp_path / name, damage)
        with pytest.raises(AgentLoadError) as err:
            load_eval_agents([str(folder)], zoo_cache=str(zoo_cache))
        message = str(err.value)
        assert str(folder) in message and said in message and "Fix:" in message and "\n" not in message, name
    agents, _, _ = load_eval_agents([str(adapter)], zoo_cache=str(zoo_cache))  # the whole one loads
    assert list(agents) == ["adapter"] or len(agents) == 1


def test_an_adapter_on_its_own_merged_export_is_refused(lora_export, tmp_path, zoo_cache):
    """An adapter whose recorded base is its merged export would score base + 2 x adapter: refused, naming the
    folder, the base and the fix."""
    from hacrl_lightning.evaluation import load_eval_agents

    folder = _broken_adapter(lora_export / ADAPTER_DIR, tmp_path / "twice", lambda d: _set_base(d, str(lora_export)))
    with pytest.raises(AgentLoadError, match=rf"LoRA adapter folder {folder}: its base '{lora_export}' is not the "
                                             r"model it was trained on .*count it twice\)\. Fix: set base_model"):
        load_eval_agents([str(folder)], zoo_cache=str(zoo_cache))
