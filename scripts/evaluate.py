"""Evaluate agents on math benchmarks: per-agent avg@k and unbiased pass@k, a table, results.json/.md.

    python scripts/evaluate.py agents=[runs/x/exports/tiny_a,runs/x/exports/tiny_b] benchmarks=[math500]
    python scripts/evaluate.py agents=[runs/x] protocol=paper                 # every agent of the run's checkpoint
    python scripts/evaluate.py agents=[Qwen/Qwen3-4B-Base] max_response_len=8192
    python scripts/evaluate.py agents=[...] benchmarks=[gsm8k] files.gsm8k=/data/gsm8k_test.parquet reward=math_verify
    python scripts/evaluate.py agents=[zoo:tiny_a,runs/x/exports/tiny_a] benchmarks=[synthetic]  # the demo's task
    python scripts/evaluate.py --cfg job                                      # print the composed config

Composes `configs/evaluate/evaluate.yaml` with `EvaluateConfig` as the schema
(`hacrl_lightning.cli.compose_evaluate`: every problem reported at once, exit status 2, the device,
vLLM and hub models and benchmarks that are neither cached nor reachable included), loads the
agents and benchmarks, generates with the rollout engine, scores each benchmark with its own reward
(its training task's: `synthetic` with exact_match, as the training's held-out evaluation; or
`reward=<name>` for all), prints the table (and, with several agents, what they know together: union and
majority-vote accuracy, from the answers already scored) and writes results.json and results.md in `output_dir`,
made once everything has loaded, with the resolved config as evaluate.yaml. Agents from a run's
checkpoint are scored at its newest checkpoint, named (file, step) in the table and results.json, with
a note when the run is still training; an export cut short is refused with how to redo it.

As strict as train.py: an `output_dir` holding an earlier evaluation is refused (exit 2) naming it, unless
`overwrite=true`, which deletes all of that evaluation's files first; prompts that no agent's `max_prompt_len`
holds are refused with train.py's check before anything is written; a reward that fails on every answer of a
batch stops the evaluation (exit 1, one line naming it and its first error), while a few failed answers score 0.0
and are counted.
"""

from __future__ import annotations

import shutil
import signal
import sys
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C anywhere: one line and status 130 (main removes its unfinished outputs)
    from hacrl_lightning.console import exit_on_interrupt

    exit_on_interrupt("evaluate.py: interrupted; no results were written")

from omegaconf import OmegaConf  # noqa: E402

from hacrl_lightning.cli import (EVALUATE_SETTINGS, agent_preset, compose_evaluate, help_text, help_topic,  # noqa: E402
                                 parse_cli, save_resolved, settings_text, wants_help)
from hacrl_lightning.config import AgentConfig, DataConfig  # noqa: E402
from hacrl_lightning.errors import ConfigError  # noqa: E402


def main(argv: list[str]) -> int:
    if wants_help(argv):
        try:
            topic = help_topic(argv)
            print(settings_text(topic, EVALUATE_SETTINGS) if topic
                  else help_text(__doc__, path_key="output_dir", topics=EVALUATE_SETTINGS))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        overrides, show = parse_cli(argv)
        cfg, dcfg = compose_evaluate(overrides, preflight=not show)  # the device and the hub too
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if show:
        print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
        return 0
    # imported once the config is good, so a bad one is reported without loading torch and the models' code
    import torch

    from hacrl_lightning.agents.sources import AgentLoadError
    from hacrl_lightning.data.benchmarks import BenchmarkLoadError, DataFormatError, get_benchmark, load_benchmark
    from hacrl_lightning.evaluation import load_eval_agents, plan_benchmarks, prompt_problems
    from hacrl_lightning.data.tasks import few_shot_pool, load_task, with_few_shot
    from hacrl_lightning.rewards import exclude_unscorable

    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    rewards = {name: cfg.reward or get_benchmark(name).reward for name in cfg.benchmarks}  # each its own by default

    def adjust(agent: AgentConfig) -> AgentConfig:
        changes = {key: getattr(cfg, key) for key in ("max_prompt_len", "max_response_len", "dtype")
                   if getattr(cfg, key) is not None}
        return replace(agent, **changes)

    try:
        plans = plan_benchmarks(cfg.benchmarks, protocol=cfg.protocol, samples=cfg.samples, pass_k=cfg.pass_k)
        benchmarks = {}
        shots = few_shot_pool(load_task(DataConfig(name=cfg.few_shot_task))[0], cfg.few_shot) if cfg.few_shot else []
        for name in cfg.benchmarks:
            files = cfg.files.get(name) or []
            loaded = load_benchmark(name, [files] if isinstance(files, str) else list(files), limit=cfg.limit)
            benchmarks[name] = exclude_unscorable(loaded, rewards[name], what=name)
            if shots:
                benchmarks[name] = with_few_shot(benchmarks[name], shots, cfg.few_shot)
            where = "generated" if not get_benchmark(name).hub_id else (files or "the hub")
            print(f"{name}: {len(benchmarks[name])} problems from {where}, scored by {rewards[name]}")
        presets = {entry: preset for entry in cfg.agents if (preset := agent_preset(entry)) is not None}
        agents, sources, checkpoints = load_eval_agents(cfg.agents, zoo_cache=cfg.zoo_cache, adjust=adjust,
                                                        trust_remote_code=cfg.trust_remote_code, presets=presets)
        unfit, notes = prompt_problems(agents, benchmarks, few_shot=cfg.few_shot)  # never cut every prompt silently
        if unfit:
            raise ConfigError(unfit)
        for note in notes:
            print(note)
    except (AgentLoadError, BenchmarkLoadError, ConfigError, DataFormatError, FileNotFoundError, KeyError,
            ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(cfg.output_dir).resolve()  # written once agents and benchmarks are loaded: no half-made dir
    created = not out.exists()
    from hacrl_lightning.errors import RunFailed
    from hacrl_lightning.evaluation import RewardFailedEverywhere
    from hacrl_lightning.rewards.custom import RewardError

    try:
        return _evaluate(cfg, dcfg, out, agents, sources, checkpoints, benchmarks, plans, rewards, device)
    except BaseException as err:  # interrupted or failed before the results: a folder this run made does not stay
        if created and not (out / "results.md").exists():
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(err, (RewardFailedEverywhere, RunFailed)):  # a table of 0.000 would say nothing; workers
            print(f"error: {err}", file=sys.stderr)                  # that cannot score: one line, status 1
            return 1
        if isinstance(err, RewardError):  # a reward that cannot load (found at its first batch): as a bad config
            print(f"error: {err}", file=sys.stderr)
            return 2
        raise


def _evaluate(cfg, dcfg, out: Path, agents, sources, checkpoints, benchmarks, plans, rewards, device) -> int:
    from hacrl_lightning.collective import figures_line
    from hacrl_lightning.evaluation import (build_engines, clear_earlier_evaluation, evaluate_agents, format_table,
                                            strict_scorer, write_responses, write_results)
    from hacrl_lightning.rewards import Reward, RewardPool

    if cfg.overwrite and out.is_dir():  # its own earlier files go whole: none stays beside the new results
        deleted = clear_earlier_evaluation(out)
        if deleted:
            print(f"overwrite: deleted the earlier evaluation's {', '.join(deleted)} in {out}")
    save_resolved(dcfg, out, name="evaluate.yaml")
    for agent in agents.values():
        agent.to(device)
    engines = build_engines(agents, backend=cfg.backend, batch_size=cfg.generation_batch_size,
                            gpu_memory_utilization=cfg.gpu_memory_utilization, seed=cfg.seed,
                            export_dir=out / "engine_dirs")
    listed = ", ".join(f"{k} ({v})" for k, v in sources.items())
    print(f"agents: {listed} | protocol: {cfg.protocol} | device: {device}")
    for name, info in checkpoints.items():
        if info["run"] == "training":
            print(f"note: {name}'s run is still training: scored at its newest checkpoint, step {info['step']} of "
                  f"{info['steps_wanted']} ({info['file']}); a later checkpoint or its exports will differ")
    responses = [] if cfg.save_responses else None
    with ExitStack() as stack:
        pools = {reward: stack.enter_context(RewardPool(Reward.of(reward), workers=cfg.reward_workers,
                                                        timeout_s=cfg.reward_timeout_s))
                 for reward in dict.fromkeys(rewards.values())}
        results = evaluate_agents(agents, benchmarks, plans, score={b: strict_scorer(pools[r], r) for b, r in rewards.items()},
                                  engines=engines, temperature=cfg.temperature, seed=cfg.seed, protocol=cfg.protocol,
                                  sources=sources, checkpoints=checkpoints, progress=print,
                                  responses=responses)
        results["reward_failures"] = {reward: dict(pool.stats) for reward, pool in pools.items()}
    results["settings"] = OmegaConf.to_container(dcfg, resolve=True)
    if responses is not None:
        print(f"responses: {write_responses(responses, out / 'responses.jsonl')} ({len(responses)} answers)")
    json_path, md_path = write_results(results, out)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # "no results were written" no longer holds
    print(format_table(results))
    for key, figures in results.get("collective", {}).items():  # the agents together (results.md has the tables)
        print(f"{results['benchmarks'][key]['title']} {figures_line(figures)}")
    print(f"results: {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
