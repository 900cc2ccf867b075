"""`bench.py rollout`: generation throughput per agent and backend (tokens/s, responses/s).

    python scripts/bench.py rollout [--agents tiny_a,tiny_b,tiny_c] [--prompts 16] [--group 8]
                                    [--max-new-tokens 24] [--repeats 3] [--backend hf|vllm|all] [--json out.json]
                                    [--few-shot 2] [--hf-cache dynamic|static|both] [--hf-compile auto|true|false]

Prompts are the synthetic task's held-out problems in each agent's chat template (`--few-shot k`: after k worked
examples, as `data.few_shot=k` trains: `--agents smollm2_135m_instruct --few-shot 2`); the prompt count,
G and lengths are printed beside the figures (median of `--repeats` timed calls after a warm-up).
The vLLM backend is measured where vLLM serves a platform: CUDA, or its CPU build (`.venv-vllm`), where each
engine's KV cache gets 1% of the machine's memory. The transformers engine is measured with the KV cache of
`--hf-cache` (`rollout.hf_cache`; `both`: a row each, for a comparison) and, for the static one, the decode step
compiled as `--hf-compile` says (`rollout.hf_compile`, rollout/hf.py): its warm-up is one whole call (so the
timed calls see shapes already compiled), and the seconds torch spends compiling are `compile_s`, out of `seconds`;
`graphs_timed` counts the graphs compiled during the timed calls (0: no recompile). The static cache is
`cache_len` long: the longest prompt in whole 64-column buckets (at most `max_prompt_len`) plus the new tokens, as
in a run whose `max_prompt_len` fits the prompts (each decode step attends over the whole cache).
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
from hacrl_lightning.rollout.hf import decode_compiled, padded_width

COLUMNS = ["agent", "backend", "hf_cache", "cache_len", "compiled", "prompts", "group", "prompt_len_mean",
           "max_new_tokens", "resp_len_mean", "seconds", "tokens_per_s", "responses_per_s", "compile_s", "graphs_timed"]


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_a,tiny_b,tiny_c")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0: each agent's max_response_len")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="all", choices=["hf", "vllm", "all"])
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--few-shot", type=int, default=0, help="worked examples before each question (data.few_shot)")
    parser.add_argument("--hf-cache", default="dynamic", choices=["dynamic", "static", "both"],
                        help="the transformers engine's KV cache (rollout.hf_cache); both: a row each")
    parser.add_argument("--hf-compile", default="auto", choices=["auto", "true", "false"],
                        help="static cache: compile the decode step (rollout.hf_compile; auto: on CUDA)")


def backends(choice: str, hf_cache: str = "dynamic") -> list[tuple[str, str]]:
    """(backend, its KV cache: the transformers engine's `rollout.hf_cache`, vLLM's `paged`) of each row."""
    if choice == "all":
        from hacrl_lightning.rollout.vllm import vllm_platform

        choices = ["hf", "vllm"] if vllm_platform() else ["hf"]
    else:
        choices = [choice]
    caches = ["dynamic", "static"] if hf_cache == "both" else [hf_cache]
    return [(backend, cache) for backend in choices for cache in (caches if backend == "hf" else ["paged"])]


def engine_for(backend: str, agent: Agent, workdir: Path, cache: str = "dynamic", compile_decode: str = "auto",
               cache_len: int = 0):
    options = dict(eos_token_ids=agent.eos_token_ids)
    if backend == "hf":
        return make_engine("hf", agent.model, pad_token_id=agent.pad_token_id, batch_size=256, cache=cache,
                           compile_decode=compile_decode, max_len=cache_len, **options)
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
            # the static cache of a run whose max_prompt_len fits these prompts (`data.few_shot`'s preflight fits it)
            cache_len = padded_width(max(map(len, prompts)), max_new_tokens=0, max_len=agent.max_prompt_len) + max_new
            for backend, cache in backends(args.backend, args.hf_cache):
                engine = engine_for(backend, agent, Path(workdir), cache, args.hf_compile, cache_len)
                settings = SamplingSettings.for_agent(agent.cfg, n=args.group, seed=0, max_new_tokens=max_new)
                engine.generate(prompts if cache == "static" else prompts[:2], settings)  # warm-up (static: its shapes)
                stats = getattr(engine, "compile_stats", {"graphs": 0.0, "seconds": 0.0})
                warm_graphs = stats["graphs"]
                times, tokens = [], []
                for r in range(args.repeats):
                    compiling = stats["seconds"]
                    start = time.perf_counter()
                    gens = engine.generate(prompts, replace(settings, seed=r))
                    times.append(time.perf_counter() - start - (stats["seconds"] - compiling))
                    tokens.append(sum(len(g.token_ids) for g in gens))
                seconds = statistics.median(times)
                static = cache == "static"
                rows.append({
                    "agent": name, "backend": backend, "hf_cache": cache, "cache_len": cache_len if static else 0,
                    "compiled": static and decode_compiled(args.hf_compile, torch.device(device)),
                    "compile_s": stats["seconds"], "graphs_timed": stats["graphs"] - warm_graphs, "device": device,
                    "prompts": len(prompts), "group": args.group,
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
