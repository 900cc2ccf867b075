"""Benchmarks that print figures (never asserted by tests).

    python scripts/bench.py rollout [--agents tiny_a,tiny_b,tiny_c] [--prompts 16] [--group 8]
                                    [--max-new-tokens 24] [--repeats 3] [--backend hf|vllm|all]
    python scripts/bench.py step [--n 2,3,4] [--groups 4,8,16] [--steps 3] [--json bench.json]

    python scripts/bench.py rewards [--items 1000] [--adversarial 10] [--workers 1 2] [--timeout 2]

    python scripts/bench.py exchange [--agents tiny_qwen3,tiny_llama32] [--synthetic 500] [--stress 200]

`rollout`: generation throughput per agent and backend (tokens/s, responses/s) on prompts of the
synthetic task, with the prompt count, G and lengths printed beside the figures. The vLLM backend
is measured only where vllm and a GPU are present.
`rewards`: math_verify items/s in-process and through RewardPool with 1 and 2 workers, on ordinary
answers and on the same mixed with hostile ones (each of those costs a worker the timeout).

`step`: full framework HACPO training steps against a bare PyTorch + transformers loop doing the
same work (`scripts/bench_step.py`), with the per-phase breakdown, tokens/s, peak RSS, and scaling
in n and G; figures in docs/PERFORMANCE.md.

`exchange`: partners' responses crossing between two agents' tokenizers, both directions (by
default the paper's real Qwen3 and Llama 3.2 tokenizers): rows exact or marked, and why, on the
math fixtures' texts, synthetic answers and stress texts (`scripts/bench_exchange.py`); figures in
docs/agents.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_exchange  # noqa: E402
import bench_step  # noqa: E402
from hydra_config import compose_config  # noqa: E402

from hacrl_lightning.agents.agent import Agent  # noqa: E402
from hacrl_lightning.data.tasks import load_task  # noqa: E402
from hacrl_lightning.rollout.engine import SamplingSettings, make_engine  # noqa: E402


def backends(choice: str) -> list[str]:
    if choice != "all":
        return [choice]
    found = ["hf"]
    try:
        import vllm  # noqa: F401

        if torch.cuda.is_available():
            found.append("vllm")
    except ImportError:
        pass
    return found


def engine_for(backend: str, agent: Agent, workdir: Path):
    options = dict(eos_token_ids=agent.eos_token_ids)
    if backend == "hf":
        return make_engine("hf", agent.model, pad_token_id=agent.pad_token_id, batch_size=256, **options)
    model_dir = agent.export(workdir / agent.name)
    return make_engine("vllm", agent.model, model_dir=model_dir, gpu_memory_utilization=0.2,
                       max_model_len=agent.max_prompt_len + agent.max_response_len, **options)


def bench_rollout(args) -> dict:
    cfg, _ = compose_config([f"agents=[{args.agents}]", "algorithm=gspo"])
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
                settings = SamplingSettings(max_new_tokens=max_new, n=args.group, seed=0)
                engine.generate(prompts[:2], settings)  # warm-up
                times, tokens = [], []
                for r in range(args.repeats):
                    start = time.perf_counter()
                    gens = engine.generate(prompts, SamplingSettings(max_new_tokens=max_new, n=args.group, seed=r))
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


def math_items(n: int, adversarial: int) -> tuple[list[str], list[str], list[str]]:
    """n (response, gold) pairs of unique ordinary answers (fractions, decimals, sets, ...) and the
    indices' kinds, with `adversarial` hostile responses (power towers, nested braces) spread through."""
    responses, golds, kinds = [], [], []
    for i in range(n):
        a, b = i + 2, i + 3
        response, gold = [
            (f"so \\boxed{{\\frac{{{a}}}{{{b}}}}}", f"{a}/{b}"), (f"\\boxed{{{a / 4}}}", f"\\frac{{{a}}}{{4}}"),
            (f"\\boxed{{{a + 1}}}", f"{a}"), (f"\\boxed{{\\{{{a}, {b}\\}}}}", f"\\{{{b},{a}\\}}"),
            (f"\\boxed{{({a}, {b}]}}", f"({a},{b})"), (f"$x = {a}$, \\boxed{{x^2 + {a}}}", f"{a} + x^2"),
        ][i % 6]
        responses.append(response), golds.append(gold), kinds.append("ordinary")
    hostile = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}"]
    for k in range(adversarial):
        index = (k * n) // max(1, adversarial) + 1
        responses[index], golds[index], kinds[index] = hostile[k % 2], "5", "adversarial"
    return responses, golds, kinds


def bench_rewards(args) -> dict:
    """items/s of math_verify: in-process (ordinary items only: nothing would stop a hang) and through
    RewardPool with each worker count, on the ordinary items and on the mix with hostile ones."""
    from hacrl_lightning.rewards import RewardPool, math_verify_reward

    responses, golds, kinds = math_items(args.items, args.adversarial)
    ordinary = [i for i, kind in enumerate(kinds) if kind == "ordinary"]
    clean = ([responses[i] for i in ordinary], [golds[i] for i in ordinary])
    math_verify_reward("\\boxed{1}", "1")  # imports and grammar warm-up, as a started worker has done
    start = time.perf_counter()
    serial = [math_verify_reward(r, g) for r, g in zip(*clean)]
    rows = [{"mode": "in-process", "workers": 0, "items": len(serial), "adversarial": 0, "start_s": 0.0,
             "seconds": time.perf_counter() - start, "timeouts": 0}]
    for workers in args.workers:
        for batch, hostile in ((clean, 0), ((responses, golds), args.adversarial)):
            with RewardPool(math_verify_reward, workers=workers, timeout_s=args.timeout) as pool:
                begin = time.perf_counter()
                pool.score(["\\boxed{1}"] * workers, ["1"] * workers)  # workers up
                started = time.perf_counter() - begin
                begin = time.perf_counter()
                scores = pool.score(*batch)
                seconds = time.perf_counter() - begin
            if hostile == 0 and scores != serial:
                raise RuntimeError("pool and in-process scores differ on the ordinary items")
            rows.append({"mode": "pool", "workers": workers, "items": len(scores), "adversarial": hostile,
                         "start_s": started, "seconds": seconds, "timeouts": pool.stats["timeouts"]})
    for row in rows:
        row["items_per_s"] = row["items"] / row["seconds"]
    return {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                       f"load {os.getloadavg()[0]:.1f}", "timeout_s": args.timeout, "rewards": rows}


def print_table(rows: list[dict], columns: list[str]) -> None:
    cells = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rollout = sub.add_parser("rollout", help="generation tokens/s per agent and backend")
    rollout.add_argument("--agents", default="tiny_a,tiny_b,tiny_c")
    rollout.add_argument("--prompts", type=int, default=16)
    rollout.add_argument("--group", type=int, default=8)
    rollout.add_argument("--max-new-tokens", type=int, default=0, help="0: each agent's max_response_len")
    rollout.add_argument("--repeats", type=int, default=3)
    rollout.add_argument("--backend", default="all", choices=["hf", "vllm", "all"])
    rollout.add_argument("--json", default="", help="also write the figures to this JSON file")
    rewards = sub.add_parser("rewards", help="math_verify items/s in-process and through RewardPool")
    rewards.add_argument("--items", type=int, default=1000)
    rewards.add_argument("--adversarial", type=int, default=10, help="hostile responses among the items")
    rewards.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    rewards.add_argument("--timeout", type=float, default=2.0, help="RewardPool per-item timeout (s)")
    rewards.add_argument("--json", default="", help="also write the figures to this JSON file")
    step = sub.add_parser("step", help="framework HACPO step vs a bare loop: phases, tokens/s, RSS, n and G scaling")
    bench_step.add_arguments(step)
    exchange = sub.add_parser("exchange", help="responses crossing two agents' tokenizers: rows exact or marked")
    bench_exchange.add_arguments(exchange)
    args = parser.parse_args(argv)
    if args.command == "exchange":
        result = bench_exchange.run(args)
        print(f"machine: {result['machine']} | texts: {result['sizes']} (each sent as `stop` and as `length`)")
        print_table(bench_exchange.table_rows(result), bench_exchange.COLUMNS)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    if args.command == "rewards":
        result = bench_rewards(args)
        print(f"machine: {result['machine']} | timeout {result['timeout_s']:g} s")
        print_table(result["rewards"], ["mode", "workers", "items", "adversarial", "start_s", "seconds", "timeouts",
                                        "items_per_s"])
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    if args.command == "step":
        result = bench_step.run(args)
        bench_step.print_report(result)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
            print(f"figures: {args.json}")
        return 0
    result = bench_rollout(args)
    print(f"machine: {result['machine']} | torch {result['torch']}")
    print_table(result["rollout"], ["agent", "backend", "prompts", "group", "prompt_len_mean", "max_new_tokens",
                                    "resp_len_mean", "seconds", "tokens_per_s", "responses_per_s"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
