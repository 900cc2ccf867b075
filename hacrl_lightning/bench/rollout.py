"""`bench.py rollout`: generation throughput per agent and backend (tokens/s, responses/s).

    python scripts/bench.py rollout [--agents tiny_a,tiny_b,tiny_c] [--prompts 16] [--group 8]
                                    [--max-new-tokens 24] [--repeats 3] [--backend hf|vllm|all] [--json out.json]
                                    [--few-shot 2]

Prompts are the synthetic task's held-out problems in each agent's chat template (`--few-shot k`: after k worked
examples, as `data.few_shot=k` trains: `--agents smollm2_135m_instruct --few-shot 2`); the prompt count,
G and lengths are printed beside the figures (median of `--repeats` timed calls after a warm-up).
The vLLM backend is measured where vLLM serves a platform: CUDA, or its CPU build (`.venv-vllm`), where each
engine's KV cache gets 1% of the machine's memory.
Deliberately not here: training (`bench.step`) and checking what is generated (tests do).
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.bench.report import print_table
from hacrl_lightning.cli import compose_config
from hacrl_lightning.data.tasks import load_task
from hacrl_lightning.rollout import make_engine
from hacrl_lightning.rollout.engine import SamplingSettings

COLUMNS = ["agent", "backend", "prompts", "group", "prompt_len_mean", "max_new_tokens", "resp_len_mean", "seconds",
           "tokens_per_s", "responses_per_s"]


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_a,tiny_b,tiny_c")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0: each agent's max_response_len")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="all", choices=["hf", "vllm", "all"])
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--few-shot", type=int, default=0, help="worked examples before each question (data.few_shot)")


def backends(choice: str) -> list[str]:
    if choice != "all":
        return [choice]
    from hacrl_lightning.rollout.vllm import vllm_platform

    return ["hf", "vllm"] if vllm_platform() else ["hf"]


def engine_for(backend: str, agent: Agent, workdir: Path):
    options = dict(eos_token_ids=agent.eos_token_ids)
    if backend == "hf":
        return make_engine("hf", agent.model, pad_token_id=agent.pad_token_id, batch_size=256, **options)
    model_dir = agent.export(workdir / agent.name)
    from hacrl_lightning.rollout.vllm import vllm_platform

    share = 0.2 if vllm_platform() == "cuda" else 0.01
    return make_engine("vllm", agent.model, model_dir=model_dir, gpu_memory_utilization=share, dtype=agent.cfg.dtype,
                       max_model_len=agent.max_prompt_len + agent.max_response_len, **options)


def run(args) -> dict:
    cfg, _ = compose_config([f"agents=[{args.agents}]", "algorithm=gspo", f"data.few_shot={args.few_shot}"],
                            preflight=args.few_shot > 0)  # the preflight fits preset lengths to the examples
    _, held_out = load_task(cfg.data)
    questions = [ex.prompt for ex in list(held_out)[: args.prompts]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, agent_cfg in cfg.agents.items():
            agent = Agent.load(name, agent_cfg, zoo_cache=cfg.zoo_cache).to(device)
            prompts = agent.encode_prompts(questions)
            max_new = args.max_new_tokens or agent.max_response_len
            for backend in backends(args.backend):
                engine = engine_for(backend, agent, Path(workdir))
                settings = SamplingSettings.for_agent(agent.cfg, n=args.group, seed=0, max_new_tokens=max_new)
                engine.generate(prompts[:2], settings)  # warm-up
                times, tokens = [], []
                for r in range(args.repeats):
                    start = time.perf_counter()
                    gens = engine.generate(prompts, replace(settings, seed=r))
                    times.append(time.perf_counter() - start)
                    tokens.append(sum(len(g.token_ids) for g in gens))
                seconds = statistics.median(times)
                rows.append({
                    "agent": name, "backend": backend, "device": device, "prompts": len(prompts), "group": args.group,
                    "prompt_len_mean": sum(map(len, prompts)) / len(prompts), "max_new_tokens": max_new,
                    "resp_len_mean": statistics.mean(tokens) / (len(prompts) * args.group),
                    "seconds": seconds, "tokens_per_s": statistics.mean(tokens) / seconds,
                    "responses_per_s": len(prompts) * args.group / seconds,
                })
    return {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {device}",
            "torch": torch.__version__, "rollout": rows}


def print_report(result: dict) -> None:
    print(f"machine: {result['machine']} | torch {result['torch']}")
    print_table(result["rollout"], COLUMNS)
