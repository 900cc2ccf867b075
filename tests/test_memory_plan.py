"""The per-GPU memory plan (`hacrl_lightning.memory`, the architectures of `hacrl_lightning.architecture`,
`scripts/plan.py`) against what can be measured here.

- Parameter counts and tensor counts equal the zoo's real models (five architectures) and the models built
  from every shipped hub architecture (on the meta device) exactly.
- The training state (fp32 weights, gradients, AdamW state, the KL reference) equals, byte for byte, what
  the tiny agents hold after one real training step.
- The logits and activation peak of one micro-batch is within 20 % of torch's CPU memory profiler: a
  mid-size random Qwen3 with the real 151,936-token vocabulary (one chunk's logits dominate: the log-probs are
  made a chunk of positions at a time), and the same with a small vocabulary (the blocks' activations dominate),
  with and without gradient checkpointing.
- The refusal: on a GPU (`on_gpu`, testable without one) a run that cannot fit is refused by the preflight
  with the table and ranked changes, and train.py stops before any model loads; bad input is a clear error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

from hacrl_lightning.architecture import (Architecture, UnknownArchitecture, arch_file, architecture_of,
                                          run_architectures)
from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import AgentConfig
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.memory import (GIB, LARGER_PASSES_HEADROOM, LOGPROB_TOKENS, activation_peak, fixes, larger_passes,
                                   learner_rows, memory_problems, plan_memory, with_changes)

REPO = Path(__file__).resolve().parents[1]
ZOO = ("tiny_a", "tiny_b", "tiny_c", "tiny_d", "tiny_e", "tiny_qwen3", "tiny_llama32")
HUB_PRESETS = sorted(p.stem for p in (REPO / "agents").glob("*.yaml")
                     if "zoo:" not in p.read_text() and "model: pypi:" not in p.read_text())
PUBLISHED = {"Qwen/Qwen3-1.7B": 1_720_574_976, "Qwen/Qwen3-4B": 4_022_468_096, "Qwen/Qwen3-8B-Base": 8_190_735_360,
             "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400, "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
             "meta-llama/Meta-Llama-3-8B-Instruct": 8_030_261_248}
"""Parameter counts of the hub models (the model cards' 1.7B, 4.0B, 8.2B, 1.24B, 3.21B, 8.03B)."""
SMALL = ["trainer.steps=1", "trainer.eval_every=0", "data.eval_size=2", "trainer.export_agents=false",
         "trainer.checkpoint_every=0", "trainer.checkpoint_minutes=0", "trainer.diagnostics_every=0",
         "data.prompts_per_step=2", "rollout.group_size=2", "trainer.mini_batch_prompts=1"]


def count(model: torch.nn.Module) -> tuple[int, int]:
    params = list(model.parameters())  # shared (tied) tensors once
    return sum(p.numel() for p in params), len(params)


@pytest.mark.parametrize("preset", ZOO)
def test_parameter_counts_are_the_zoo_models_exactly(preset, zoo_cache):
    arch = architecture_of(preset, AgentConfig(model=f"zoo:{preset}"), zoo_cache=zoo_cache)
    directory = Path(arch_dir := _zoo_dir(preset, zoo_cache))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(arch_dir))
    assert (arch.parameters, arch.parameter_tensors) == count(model), directory


def _zoo_dir(preset: str, zoo_cache) -> str:
    from hacrl_lightning.agents.sources import resolve_source

    return resolve_source(preset, f"zoo:{preset}", key="model", zoo_cache=zoo_cache)


@pytest.mark.parametrize("preset", HUB_PRESETS)
def test_every_hub_preset_has_its_architecture_offline(preset):
    from omegaconf import OmegaConf

    agent = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AgentConfig), OmegaConf.load(REPO / "agents" / f"{preset}.yaml")))
    arch = architecture_of(preset, agent)
    config = json.loads(arch_file(agent.model).read_text())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    assert (arch.parameters, arch.parameter_tensors) == count(model)
    base = agent.model.removesuffix("-Base").removesuffix("-Instruct-2507")
    if agent.model in PUBLISHED or base in PUBLISHED:
        assert arch.parameters == PUBLISHED.get(agent.model, PUBLISHED.get(base))
    assert agent.max_prompt_len + agent.max_response_len <= arch.max_positions


class StateBytes(Callback):
    """What each agent holds after the run's last update: parameters, gradients, AdamW state, KL reference."""

    def on_train_end(self, trainer, pl_module):
        nbytes = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
        self.result = {}
        for k, (name, agent) in enumerate(pl_module.agents.items()):
            params = list(agent.parameters())
            state = pl_module.optimizers()[k].state
            self.result[name] = {
                "master_weights": nbytes(params),
                "gradients": nbytes(p.grad for p in params if p.grad is not None),
                "adamw": nbytes(t for p in params for t in state[p].values()),
                "kl_reference": nbytes(pl_module.references[name].parameters()) if name in pl_module.references else 0,
                "updated": all(p.grad is not None for p in params),
            }


@pytest.mark.slow
def test_training_state_is_exact_after_one_real_step(tmp_path, zoo_cache):
    from hacrl_lightning.training import train

    cfg, _ = compose_config(["agents=[tiny_a,tiny_e]", *SMALL, "algorithm.kl_coef=0.001",  # tied and untied
                             f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    record = StateBytes()
    train(cfg, extra_callbacks=[record])
    architectures, problems = run_architectures(cfg)
    plan = plan_memory(cfg, architectures, 80 * GIB)
    assert not problems and plan.world == 1
    for agent in plan.agents:
        measured = record.result[agent.name]
        assert measured.pop("updated"), agent.name  # every parameter took a gradient
        assert measured == {"master_weights": agent.master_weights, "gradients": agent.gradients,
                            "adamw": agent.adamw, "kl_reference": agent.kl_reference}, agent.name
        assert agent.adamw > 2 * agent.master_weights  # the moments and one fp32 step per tensor


def profiled_peak(model, rows: int, tokens: int, chunk: int = LOGPROB_TOKENS) -> int:
    """The peak of the bytes allocated by one forward + backward of `Agent.token_logprobs`'s computation
    (`agents.agent.token_logprobs`, `chunk` positions of logits at a time) above what was there before (torch's CPU
    memory profiler, every allocation and free in time order), the parameters' gradients left out: the plan counts
    those in the training state."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category, MemoryProfileTimeline

    from hacrl_lightning.agents.agent import token_logprobs

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)

    def logprobs():
        return token_logprobs(model, ids, mask, chunk=chunk)

    logprobs().sum().backward()  # warm-up: lazy initialisations stay out of the figure
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        logprobs().sum().backward()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    sizes = torch.tensor(sizes, dtype=torch.float64)
    above = sizes - sizes[0]
    gradients = above[:, _CATEGORY_TO_INDEX[Category.GRADIENT] + 1]
    return int((above.sum(1) - gradients).max())


@pytest.mark.slow
@pytest.mark.parametrize("vocab, layers, rows, tokens, checkpointing, chunk", [
    (151_936, 2, 12, 32, False, 128),  # the real Qwen3 vocabulary: the logits dominate (three chunks of 128 positions)
    (512, 4, 4, 256, False, LOGPROB_TOKENS),  # a small vocabulary: the blocks' activations dominate
    (512, 4, 4, 256, True, LOGPROB_TOKENS),
])
def test_activation_peak_is_within_20_percent_of_the_profiler(vocab, layers, rows, tokens, checkpointing, chunk):
    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=vocab, max_position_embeddings=512,
                         tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()  # checkpointing recomputes in train mode only; Qwen3 has no dropout
    arch = Architecture.from_config(config.to_dict())
    planned = max(activation_peak(arch, rows, tokens, 4, checkpointed=checkpointing, chunk=chunk),
                  2 * 4 * arch.vocab * arch.hidden)  # the tied embedding's gradient buffers (AgentMemory)
    measured = profiled_peak(model, rows, tokens, chunk)
    assert measured == pytest.approx(planned, rel=0.2), f"plan {planned / 2**20:.1f} MiB, profiler {measured / 2**20:.1f} MiB"
    if vocab > 100_000:  # and one chunk's logits are most of it, so the figure does measure the logits term
        assert activation_peak(arch, rows, tokens, 4, checkpointed=False, chunk=chunk) > 0.9 * measured


def test_the_plan_s_chunk_is_the_agent_s():
    from hacrl_lightning.agents import agent

    assert LOGPROB_TOKENS == agent.LOGPROB_TOKENS


def test_a_plan_grows_and_shards_as_the_run_does():
    cfg, _ = compose_config(["experiment=paper_model", "rollout=vllm"])
    architectures, _ = run_architectures(cfg)
    eight = plan_memory(cfg, architectures, 80 * GIB)
    cfg.trainer.num_nodes = 2
    sixteen = plan_memory(cfg, architectures, 80 * GIB)
    for a, b in zip(eight.agents, sixteen.agents):
        assert b.master_weights == math.ceil(a.parameters / 16) * 4 < a.master_weights
        assert a.kl_reference == a.master_weights  # kl_coef 0.001: one frozen fp32 copy, sharded alike
        assert a.activations_checkpointed < a.activations
        assert a.kv_sequences >= 1 and a.engine == int(0.3 * 80 * GIB)
    assert sixteen.total < eight.total


def test_on_a_gpu_a_run_that_cannot_fit_is_refused_with_ranked_changes(zoo_cache):
    cfg, _ = compose_config(["agents=[tiny_a,tiny_e]", "trainer.gpu_memory_gib=0.004", f"zoo_cache={zoo_cache}"])
    assert memory_problems(cfg, on_gpu=False) == []  # on CPU the plan is informational
    [problem] = memory_problems(cfg, on_gpu=True)
    text = str(problem)
    assert problem.key == "memory_plan" and "does NOT fit" in text and "tiny_e" in text
    assert "1. trainer.micro_batch_size=" in text and "GiB of 0.0" in text
    assert "trainer.ignore_memory_plan=true" in text
    cfg.trainer.ignore_memory_plan = True
    assert memory_problems(cfg, on_gpu=True) == []
    cfg.trainer.ignore_memory_plan, cfg.trainer.gpu_memory_gib = False, 80.0
    assert memory_problems(cfg, on_gpu=True) == []


def test_train_refuses_before_any_model_loads(script_main, capsys, monkeypatch, model_loads, tmp_path, zoo_cache):
    import hacrl_lightning.preflight as preflight

    monkeypatch.setattr(preflight, "_cuda_devices", lambda: 1)  # "a GPU": the plan runs; torch still sees none
    status = script_main("train")(["trainer.accelerator=gpu", "trainer.gpu_memory_gib=0.004",
                                   f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert status == 2 and model_loads == [] and not (tmp_path / "run").exists()
    assert "memory_plan" in err and "trainer.micro_batch_size=" in err and "memory plan per GPU" in err


def test_plan_script_json_and_its_changes_fit(script_main, capsys, tmp_path):
    main = script_main("plan")
    overrides = ["experiment=paper_model", "rollout=vllm"]
    assert main([*overrides, "--json", str(tmp_path / "plan.json")]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "qwen3_4b_base" in out and "llama3_2_3b_instruct" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["fits"] is False and plan["world"] == 8 and plan["changes"]
    assert [c["total"] for c in plan["changes"]] == sorted((c["total"] for c in plan["changes"]), reverse=True)
    assert plan["changes"][-1]["fits"]
    applied = [o for change in plan["changes"] for o in change["overrides"]]
    assert main([*overrides, *applied, "--json", str(tmp_path / "plan.json")]) == 0  # what it says, fits; its own
    fixed = json.loads((tmp_path / "plan.json").read_text())  # file replaced
    assert fixed["fits"] is True and fixed["bytes"]["total"] == plan["changes"][-1]["total"]


def test_a_learner_s_mini_batch_rows_by_hand():
    def rows(*overrides):
        return learner_rows(compose_config(["agents=[tiny_a,tiny_b,tiny_c]", "data.prompts_per_step=16",
                                            "trainer.mini_batch_prompts=8", "rollout.group_size=4", *overrides])[0])

    assert rows() == 8 * 4                                     # 8 prompts x G 4; partners' rows: more mini-batches
    assert rows("algorithm.cross_samples_per_prompt=2") == 8 * 4
    assert rows("trainer=fsdp", "trainer.devices=2") == 8 * 4 // 2  # split over 2 ranks
    assert rows("trainer=fsdp", "trainer.devices=3") == 11          # 32 rows as 11 + 11 + 10
    assert rows("algorithm=gspo_x2", "rollout.group_size=2") == 8 // 2 * 4  # 2G responses, half the prompts


def test_with_room_plan_proposes_the_largest_passes_that_fit_and_what_it_says_plans_as_said(script_main, capsys,
                                                                                             tmp_path):
    overrides = ["experiment=paper_model_qwen3_1_7b_llama3_1b", "trainer.micro_batch_size=2",
                 "trainer.gpu_memory_gib=139"]
    cfg = compose_config(overrides)[0]
    architectures, _ = run_architectures(cfg)
    gpu = 139 * GIB
    proposal = larger_passes(cfg, architectures, gpu)
    assert proposal["overrides"][0] == f"trainer.micro_batch_size={learner_rows(cfg)}"
    assert proposal["tokens"] > proposal["tokens_now"] == 2 * 5120  # 2 rows of the longest 5,120 tokens today
    bigger = with_changes(cfg, [{"overrides": proposal["overrides"]}])
    assert plan_memory(bigger, architectures, gpu).total == proposal["total"] <= LARGER_PASSES_HEADROOM * gpu
    bigger.trainer.micro_batch_tokens = 2 * proposal["tokens"]  # the next doubling: past the headroom
    assert plan_memory(bigger, architectures, gpu).total > LARGER_PASSES_HEADROOM * gpu
    main = script_main("plan")
    assert main([*overrides, "--json", str(tmp_path / "plan.json")]) == 0
    assert f"room for larger passes: {' '.join(proposal['overrides'])}" in capsys.readouterr().out
    assert json.loads((tmp_path / "plan.json").read_text())["larger_passes"]["tokens"] == proposal["tokens"]
    # no proposal where a pass already holds a whole mini-batch, nor for a run that does not fit
    whole = compose_config([*overrides, f"trainer.micro_batch_size={learner_rows(cfg)}"])[0]
    assert larger_passes(whole, architectures, gpu) is None
    assert larger_passes(cfg, architectures, 20 * GIB) is None


def test_plan_script_takes_any_agent_list_with_the_experiments_shared_settings(script_main, capsys, tmp_path):
    """plan.py composes as train.py does: the paper experiment's agent_defaults reach four agents it was not
    written for, and the plan names each."""
    four = "agents=[qwen3_4b_base,llama3.2_3b_instruct,qwen3_1.7b_base,qwen3_8b_base]"
    main = script_main("plan")
    main(["experiment=paper_size", four, "--json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    for key in ("qwen3_4b_base", "llama3_2_3b_instruct", "qwen3_1_7b_base", "qwen3_8b_base"):
        assert key in out
    assert json.loads((tmp_path / "plan.json").read_text())["world"] == 8


def test_plan_script_writes_an_sbatch_script(script_main, capsys):
    assert script_main("plan")(["experiment=paper_model", "rollout=vllm", "trainer.micro_batch_size=1",
                                "--sbatch", "2"]) in (0, 1)
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --ntasks-per-node=8" in out
    assert "srun python scripts/train.py experiment=paper_model rollout=vllm trainer.micro_batch_size=1 " \
           "trainer.num_nodes=2 trainer.devices=8" in out
    assert "sharded over 16" in out


@pytest.mark.parametrize("args,said", [
    (["--sbatch", "0"], "error: --sbatch: got '0'; allowed: a whole number of nodes >= 1; fix: e.g. --sbatch 2"),
    (["--sbatch", "abc"], "error: --sbatch: got 'abc'; allowed: a whole number of nodes >= 1; fix: e.g. --sbatch 2"),
    (["--sbatch", "-2"], "error: --sbatch: got '-2'; allowed: a whole number of nodes >= 1; fix: e.g. --sbatch 2"),
    (["--sbatch"], "error: --sbatch takes a value, e.g. --sbatch 2"),
    (["--json", "a.json", "--json", "b.json"], "error: --json is given twice; give it once, e.g. --json plan.json"),
])
def test_plan_usage_errors_exit_2_with_one_line(script_main, capsys, args, said):
    """Exit status 1 means "does not fit": a flag's bad value is a usage error (2), said in one line."""
    assert script_main("plan")(args) == 2
    assert capsys.readouterr().err.strip() == said


def test_plan_json_never_replaces_a_users_file(script_main, capsys, tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    assert script_main("plan")(["--json", str(mine)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --json: {mine} already exists and was not written by "
                                               "scripts/plan.py; nothing was changed; fix: give a new file name, or "
                                               "move that file away")
    assert mine.read_text() == '{"my": "notes"}\n'
    assert script_main("plan")(["--json", str(tmp_path)]) == 2 and "is a folder" in capsys.readouterr().err


def test_an_unknown_architecture_names_the_file_to_add(script_main, capsys, tmp_path):
    with pytest.raises(UnknownArchitecture, match=r"agents/arch/someorg/Unknown-7B\.json"):
        architecture_of("mine", AgentConfig(model="someorg/Unknown-7B"))
    with pytest.raises(UnknownArchitecture, match="config.json"):
        architecture_of("mine", AgentConfig(model=str(tmp_path)))  # a local directory without config.json
    status = script_main("plan")(["agents=[qwen3_4b,tiny_a]", "agents.qwen3_4b.model=someorg/Unknown-7B"])
    err = capsys.readouterr().err
    assert status == 2 and "agents.qwen3_4b.model" in err and "someorg/Unknown-7B.json" in err


@pytest.mark.parametrize("value", ["0", "-80", "nan"])
def test_a_gpu_memory_that_is_not_positive_is_a_config_error(value):
    with pytest.raises(ConfigError, match="trainer.gpu_memory_gib"):
        compose_config([f"trainer.gpu_memory_gib={value}"])


def _agent(name: str, **figures):
    from hacrl_lightning.memory import AgentMemory

    base = dict(parameters=0, trainable=0, master_weights=0, gradients=0, adamw=0, kl_reference=0, gathered=0, activations=0,
                activations_checkpointed=0, forward_peak=0, checkpointing=False, gradient_buffers=0,
                engine_weights=0, engine_reserve=0, kv_cache=0, kv_sequences=1, engine=0)
    return AgentMemory(name=name, **{**base, **figures})


def test_the_phase_arithmetic_by_hand():
    """Two agents on one GPU with round figures (GiB-free units): what each phase holds, with and without
    offload and sleep, worked out by hand from the rules in `group_phases`' docstring."""
    from hacrl_lightning.memory import MemoryPlan, group_phases

    a = _agent("a", master_weights=10, gradients=10, adamw=20, kl_reference=10, gathered=3, activations=7,
               forward_peak=4, engine_weights=5, engine=12)   # state 50
    b = _agent("b", master_weights=2, gradients=2, adamw=4, kl_reference=0, gathered=1, activations=9,
               forward_peak=1, engine_weights=1, engine=6)    # state 8
    plain = dict(group_phases([a, b], backend="vllm", offload=False, sleep=False))
    # resident 58, engines 18 in every phase
    assert plain == {"rollout a": 76, "rollout b": 76, "old log-probs a": 58 + 18 + 3 + 4,
                     "old log-probs b": 58 + 18 + 1 + 1, "update a": 58 + 18 + 3 + 7, "update b": 58 + 18 + 1 + 9,
                     "weight sync a": 76, "weight sync b": 76}
    shared = dict(group_phases([a, b], backend="vllm", offload=True, sleep=True))
    # nothing resident; a's rollout: its share + b's synced weights; b's: its share alone (a sleeps again)
    assert shared == {"rollout a": 12 + 1, "rollout b": 6,
                      "old log-probs a": 10 + 10 + 3 + 4, "old log-probs b": 2 + 0 + 1 + 1,
                      "update a": 10 + 10 + 20 + 3 + 7, "update b": 2 + 2 + 4 + 1 + 9,
                      "weight sync a": 5 + 10, "weight sync b": 5 + 1 + 2}
    hf = dict(group_phases([_agent("c", master_weights=4, gathered=1, kv_cache=6, activations=2)], backend="hf",
                           offload=True, sleep=False))
    assert hf == {"rollout c": 4 + 1 + 6, "old log-probs c": 4 + 1, "update c": 4 + 1 + 2}
    plan = MemoryPlan(agents=[a, b], gpu_bytes=100, world=2, devices=2, num_nodes=1, micro_batch_size=1,
                      backend="vllm", precision="bf16-mixed", reserve=2, groups=[(["a"], 1), (["b"], 1)],
                      offload=True, sleep=True)
    # split: a's GPU peaks at its update (50), b's at its update (18); the plan is the worst GPU's + reserve
    assert plan.peak == ("a", "update a", 50) and plan.total == 52 and plan.fits
    assert plan.to_json()["phases"][1]["phases"][0] == {"phase": "rollout b", "bytes": 6, "gib": 0.0}


def test_a_cuda_ipc_sync_buffer_is_held_in_every_phase_whatever_sleeps():
    """An engine in its own process synced through CUDA IPC keeps its bucket (`rollout.weight_sync_mb`) in the
    trainer's GPU memory all run: it is in every phase, with and without offload and sleep, and in the plan's
    engines figure, so that state + engines + transient + reserve stays the total."""
    from hacrl_lightning.memory import MemoryPlan, group_phases

    a = _agent("a", master_weights=10, gathered=3, activations=7, engine_weights=5, engine=12, sync_buffer=2)
    b = _agent("b", master_weights=2, gathered=1, activations=9, engine_weights=1, engine=6, sync_buffer=2)
    for offload, sleep in [(False, False), (True, True)]:
        without = dict(group_phases([_agent(**{**vars(x), "sync_buffer": 0}) for x in (a, b)], backend="vllm",
                                    offload=offload, sleep=sleep))
        assert dict(group_phases([a, b], backend="vllm", offload=offload, sleep=sleep)) == \
            {phase: size + 4 for phase, size in without.items()}
    plan = MemoryPlan(agents=[a, b], gpu_bytes=100, world=1, devices=1, num_nodes=1, micro_batch_size=1,
                      backend="vllm", precision="bf16-mixed", reserve=2)
    assert plan.engines == 12 + 6 + 4 and plan.state + plan.engines + plan.transient + plan.reserve == plan.total
    # while a's sync loads, its worker holds its copies too; b's sync phase does not
    copying = _agent(**{**vars(a), "sync_copies": 3})
    phases = dict(group_phases([copying, b], backend="vllm", offload=False, sleep=False))
    assert phases["weight sync a"] == dict(group_phases([a, b], backend="vllm", offload=False,
                                                        sleep=False))["weight sync a"] + 3
    assert phases["weight sync b"] == phases["rollout a"]


@pytest.mark.parametrize("overrides, mib", [([], 256), (["rollout.weight_sync_mb=64"], 64),
                                            (["rollout.weight_sync=file"], 0), (["rollout.vllm_in_process=true"], 0)])
def test_the_plan_counts_the_sync_buffer_of_each_engine_in_its_own_process(overrides, mib):
    cfg, _ = compose_config(["experiment=paper_model", "rollout=vllm", *overrides])
    architectures, _ = run_architectures(cfg)
    plan = plan_memory(cfg, architectures, 80 * GIB)
    assert [a.sync_buffer for a in plan.agents] == [mib * 2**20] * 2
    for agent, arch in zip(plan.agents, (architectures[k] for k in cfg.agents)):
        embedding = arch.vocab * arch.hidden * 2  # bf16 engines
        assert agent.sync_copies == (mib * 2**20 + (embedding if embedding > mib * 2**20 else 0) if mib else 0)


FOUR_AT_SIZE = ["agents=[qwen3_8b_base,llama3_8b,qwen3_4b_base,qwen3_4b]", "trainer=fsdp", "trainer.devices=8",
                "rollout=vllm", "algorithm.kl_coef=0.001", "data.prompts_per_step=128", "rollout.group_size=8",
                "trainer.mini_batch_prompts=64", "trainer.micro_batch_size=8"]
"""The four-agent case of split placement (2026-11-26): two 8B and two 4B agents with the paper's settings on one node of 8 x 80 GB."""


def test_four_agents_at_size_reach_a_layout_that_fits_one_node(script_main, capsys, tmp_path):
    """Every GPU holding every agent's state and engine does not fit; the plan's changes (engine sleep and idle
    offload among them) reach one that fits on the same node, printed phase by phase, and applying them fits."""
    main = script_main("plan")
    assert main([*FOUR_AT_SIZE, "--json", str(tmp_path / "plan.json")]) == 1
    out = capsys.readouterr().out
    assert "the plan with those changes:" in out and "update qwen3_8b_base" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    applied = [o for change in plan["changes"] for o in change["overrides"]]
    assert plan["changes"][-1]["fits"] and not any(o.startswith("trainer.num_nodes=") for o in applied)
    assert "rollout.sleep=true" in applied and "trainer.offload_idle=true" in applied
    assert main([*FOUR_AT_SIZE, *applied, "--json", str(tmp_path / "fixed.json")]) == 0
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    assert fixed["offload_idle"] and fixed["sleep"] and fixed["bytes"]["total"] == plan["changes"][-1]["total"]
    phases = {row["phase"] for group in fixed["phases"] for row in group["phases"]}
    assert {"rollout qwen3_8b_base", "old log-probs qwen3_4b", "update llama3_8b", "weight sync qwen3_4b"} <= phases


def test_a_split_plan_shards_each_agent_over_its_own_group(script_main, capsys, tmp_path):
    main = script_main("plan")
    main([*FOUR_AT_SIZE, "trainer.placement=split", "--json", str(tmp_path / "split.json")])
    split = json.loads((tmp_path / "split.json").read_text())
    assert split["placement"] == "split" and [g["ranks"] for g in split["phases"]] == [2, 2, 2, 2]
    agents = split["agents"]
    # an 8B agent's fp32 master weights over its 2 ranks: 4 bytes x 8.19e9 / 2
    assert agents["qwen3_8b_base"]["master_weights"] == 4 * -(-agents["qwen3_8b_base"]["parameters"] // 2)
    assert [row["phase"] for row in split["phases"][0]["phases"]] == [
        "rollout qwen3_8b_base", "old log-probs qwen3_8b_base", "update qwen3_8b_base", "weight sync qwen3_8b_base"]


@pytest.mark.parametrize("preset", ZOO)
@pytest.mark.parametrize("targets", [["all-linear"], "first_and_last"], ids=["all_linear", "two_named"])
def test_lora_parameter_counts_are_peft_s_exactly(preset, targets, zoo_cache):
    """The adapters' parameters and tensors from the architecture's shapes equal what peft builds on the model,
    for every linear layer and for two named ones (GPT-2's `c_proj` names two layers of each block)."""
    from hacrl_lightning.agents.lora import apply_lora
    from hacrl_lightning.config import LoraConfig

    arch = architecture_of(preset, AgentConfig(model=f"zoo:{preset}"), zoo_cache=zoo_cache)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_zoo_dir(preset, zoo_cache)))
    names = [arch.block_linears()[0][0], arch.block_linears()[-1][0]] if targets == "first_and_last" else targets
    lora = LoraConfig(rank=4, target_modules=names)
    wrapped = apply_lora(model, lora, key=f"agents.{preset}.lora")
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    assert arch.lora_parameters(4, names) == (sum(p.numel() for p in trainable), len(trainable))


@pytest.mark.slow
def test_a_lora_agent_s_training_state_is_exact_after_one_real_step(tmp_path, zoo_cache):
    """tiny_a with adapters on every linear layer, tiny_e (GPT-NeoX) on two named ones, the KL penalty on: the plan's
    master weights (base + adapters), gradients and AdamW state (adapters only) and no reference copy, as measured."""
    from hacrl_lightning.training import train

    cfg, _ = compose_config(["agents=[tiny_a,tiny_e]", *SMALL, "algorithm.kl_coef=0.001", "agents.tiny_a.lora.rank=8",
                             "agents.tiny_e.lora.rank=4", "agents.tiny_e.lora.target_modules=[query_key_value,dense]",
                             f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    record = StateBytes()
    train(cfg, extra_callbacks=[record])
    architectures, problems = run_architectures(cfg)
    plan = plan_memory(cfg, architectures, 80 * GIB)
    for agent in plan.agents:
        measured = record.result[agent.name]
        measured.pop("updated")
        assert measured == {"master_weights": agent.master_weights, "gradients": agent.gradients,
                            "adamw": agent.adamw, "kl_reference": 0}, agent.name
        assert agent.trainable < agent.parameters // 5 and agent.gradients == 4 * agent.trainable


def test_lora_is_proposed_where_it_is_what_makes_a_run_fit():
    """Two 8B agents on one 80 GB GPU: sleep, offload and smaller engine shares leave 140 GiB (the state of the one
    agent updating, 16 bytes a parameter); LoRA on both, no reference copy, fits (62.3 GiB on 2026-11-27)."""
    cfg, _ = compose_config(["agents=[qwen3_8b_base,llama3_8b]", "rollout=vllm", "trainer.micro_batch_size=1"])
    architectures, problems = run_architectures(cfg)
    changes = fixes(cfg, architectures, 80 * GIB)
    assert not problems and not changes[-2]["fits"] and changes[-1]["fits"]
    assert changes[-1]["overrides"] == ["agents.qwen3_8b_base.lora.rank=16", "agents.llama3_8b.lora.rank=16"]
    planned = plan_memory(with_changes(cfg, changes), architectures, 80 * GIB)
    assert planned.fits and all(a.kl_reference == 0 and a.gradients < a.master_weights / 100 for a in planned.agents)


def test_the_plan_names_each_lora_agent_s_adapters_and_their_memory(script_main, capsys, tmp_path):
    """The plan showed LoRA only as small gradient figures (the fourth round of hostile inputs, 2026-11-28): a line per
    LoRA agent names its rank, layers, trainable parameters and their memory, and plan.json holds them too."""
    main = script_main("plan")
    main(["agents=[qwen3_4b,qwen3_8b_base]", "agents.qwen3_4b.lora.rank=16",
          "agents.qwen3_4b.lora.target_modules=[q_proj,v_proj]", "--json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    cfg, _ = compose_config(["agents=[qwen3_4b,qwen3_8b_base]", "agents.qwen3_4b.lora.rank=16",
                             "agents.qwen3_4b.lora.target_modules=[q_proj,v_proj]"])
    architectures, _ = run_architectures(cfg)
    trainable, _ = architectures["qwen3_4b"].lora_parameters(16, ["q_proj", "v_proj"])
    lines = [line for line in out.splitlines() if line.startswith("  LoRA ")]
    assert lines[0].startswith("  LoRA qwen3_4b: rank 16 adapters on q_proj, v_proj of every block: "
                                                   f"{trainable / 1e6:,.2f} M trainable parameters")
    assert f"grads {4 * trainable / GIB:.3f}, AdamW" in lines[0]
    agents = json.loads((tmp_path / "plan.json").read_text())["agents"]
    assert agents["qwen3_4b"]["lora_rank"] == 16 and agents["qwen3_4b"]["lora_layers"] == ["q_proj", "v_proj"]
    assert agents["qwen3_8b_base"]["lora_rank"] == 0
