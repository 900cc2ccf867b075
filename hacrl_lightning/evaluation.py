"""Per-agent benchmark evaluation: answers from the rollout engine, rewards, avg@k / pass@k tables.

Each agent answers every problem of every benchmark `n` times with its own chat template and its
own engine (`hacrl_lightning.rollout`); a batch scorer (the reward function, serially or in a
process pool) scores all answers of a benchmark at once; per benchmark the
agent gets avg@n (mean score) and the unbiased pass@k (`1 - C(n-c, k) / C(n, k)`, Chen et al. 2021,
computed as a stable product in `algorithms/metrics.py`). Two protocols:

- `paper` (HACPO, arXiv 2603.02604): avg@1 on every benchmark, best@30 (= pass@30 over 30 samples)
  on AIME 2025 (`Benchmark.paper_samples`).
- `custom`: n = `samples` answers everywhere, avg@n plus pass@k for each k in `pass_k`.

One answer per problem is greedy unless a temperature is given; several are sampled at the
agent's own temperature. With several agents, each benchmark also gets the group's figures (`collective.py`:
union and majority-vote accuracy, their gains over the best single agent, the pairwise complementarity) from
each agent's first answer to each problem, computed from the answers already scored. Agents come from exported
dirs or standalone HF dirs/hub ids, or from a training checkpoint (a run dir or a `.ckpt`: the run's config says how to build each agent, the
checkpoint gives its weights; the results name the checkpoint file and its step, and whether the run was
still training). An export cut short (its `.partial` name, or a directory without weights or tokenizer
files) is refused with how to redo it. Deliberately not here: Hydra (`scripts/evaluate.py`), dataset
parsing (`data/benchmarks.py`) and training-time evaluation (`callbacks/evaluation.py`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from hacrl_lightning.agents.agent import AGENT_FILE, PARTIAL_SUFFIX, Agent, AgentLoadError
from hacrl_lightning.agents.sources import resolve_source
from hacrl_lightning.algorithms.metrics import avg_at_k, pass_at_k, unbiased_pass_at_k
from hacrl_lightning.collective import answer_key, collective_figures, markdown_lines
from hacrl_lightning.config import PROTOCOLS, AgentConfig, TrainConfig
from hacrl_lightning.data.benchmarks import get_benchmark
from hacrl_lightning.data.records import Example
from hacrl_lightning.rewards.exact_match import extract_boxed
from hacrl_lightning.rollout import RolloutEngine, engine_options, make_engine
from hacrl_lightning.scoring import BatchScorer, answer_rewards, serial_scorer

__all__ = [
    "EvalPlan", "RewardFailedEverywhere", "avg_at_k", "evaluate_agents",
    "clear_earlier_evaluation", "format_table", "load_eval_agents", "prompt_problems",
    "pass_at_k", "plan_benchmarks", "response_records", "score_correct", "serial_scorer", "strict_scorer",
    "unbiased_pass_at_k",
    "write_responses", "write_results",
]

ZOO_PREFIX = "zoo:"


@dataclass(frozen=True)
class EvalPlan:
    """How one benchmark is evaluated: `samples` answers per problem, the table's `headline` metric,
    and the pass@k values reported beside avg@samples."""

    benchmark: str
    samples: int
    headline: str
    pass_k: tuple[int, ...] = ()


def plan_benchmarks(names: Sequence[str], *, protocol: str = "paper", samples: int = 1,
                    pass_k: Sequence[int] = ()) -> list[EvalPlan]:
    """The plan of each benchmark under `protocol` (`paper` ignores `samples` and `pass_k`)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r} is unknown: allowed {list(PROTOCOLS)}")
    plans = []
    for name in names:
        if protocol == "paper":
            n = get_benchmark(name).paper_samples
            plans.append(EvalPlan(name, n, "avg@1" if n == 1 else f"pass@{n}", (n,) if n > 1 else ()))
            continue
        get_benchmark(name)
        bad = [k for k in pass_k if not 1 <= k <= samples]
        if bad:
            raise ValueError(f"pass_k={list(pass_k)}: every k must lie in [1, samples={samples}]; "
                             f"raise samples or drop {bad}")
        plans.append(EvalPlan(name, samples, f"avg@{samples}", tuple(sorted(set(pass_k)))))
    return plans


def score_correct(correct: torch.Tensor, pass_k: Sequence[int] = ()) -> dict[str, float]:
    """`correct[P, n]` (rewards in [0, 1]) -> {avg@n, pass@k for each k}; pass@k counts rewards > 0."""
    n = correct.shape[1]
    scores = {f"avg@{n}": float(avg_at_k(correct))}
    for k in pass_k:
        scores[f"pass@{k}"] = float(pass_at_k(correct, k))
    return scores


# ---------------------------------------------------------------------------------------------------
# generating and scoring


class RewardFailedEverywhere(RuntimeError):
    """Every answer of a batch failed to score (the reward, or one of its terms, raised, timed out or crashed on
    each): its table would be a column of 0.000 that says nothing of the agents. evaluate.py stops (exit 1)."""


def strict_scorer(pool: Any, reward: str) -> BatchScorer:
    """`pool.score` (a `RewardPool`) that raises `RewardFailedEverywhere` when every answer of a batch failed, as a
    whole or in one of its terms, naming `reward`, the term and the first cause; a few failed answers still score
    0.0 and are counted in `pool.stats`, as before."""
    def score(responses: Sequence[str], golds: Sequence[str], *extras: Any) -> Sequence[float]:
        rewards = pool.score(responses, golds, *extras)
        total, whole = len(rewards), len(pool.failures)
        if total == 0:
            return rewards
        cause = next(iter(pool.failure_causes.values()), None) if whole == total else None
        term = None
        if cause is None:
            term, causes = next(((name, causes) for name, causes in pool.term_failures.items()
                                 if len(causes) + whole >= total), (None, None))
            cause = causes[0] if causes else None
        if cause is not None:
            several = len(getattr(pool.reward_fn, "terms", ())) > 1
            what = f"reward {reward!r}" + (f" (its term {term!r})" if term and several else "")
            raise RewardFailedEverywhere(
                f"{what} failed on all {total} answers it was given (the first {cause}); no results were written. "
                f"Fix: correct the reward and try it on one answer first, or score with another: reward=<name>")
        return rewards
    return score


def evaluate_agents(agents: Mapping[str, Agent], benchmarks: Mapping[str, Sequence[Example]],
                    plans: Sequence[EvalPlan], *, score: BatchScorer | Mapping[str, BatchScorer],
                    engines: Mapping[str, RolloutEngine], temperature: float | None = None, seed: int = 0,
                    protocol: str = "paper", sources: Mapping[str, str] | None = None,
                    checkpoints: Mapping[str, Mapping[str, Any]] | None = None,
                    progress: Callable[[str], None] | None = None,
                    responses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every agent on every planned benchmark; returns the results (what `write_results` stores).

    `results["agents"][agent]["scores"][benchmark]` holds avg@n, pass@k, the headline score and
    each problem's count of correct answers; `["average"]` is the mean headline score (the
    paper's AVG column). `score` is one scorer, or one per benchmark (each benchmark's own reward).
    `checkpoints`: for agents loaded from a training checkpoint, its `file`, `step` and `run` state
    (`load_eval_agents`), kept as the agent's `checkpoint`. `responses`: a list that receives one record per
    answer (`response_records`: what `evaluate.py save_responses=true` writes). With several agents,
    `results["collective"][benchmark]` holds the group's figures (`collective.collective_figures`) from each
    agent's first answer to each problem (its greedy one when it answered once), from the answers already scored.
    """
    results: dict[str, Any] = {
        "protocol": protocol,
        "benchmarks": {p.benchmark: {"title": get_benchmark(p.benchmark).title, "samples": p.samples,
                                     "headline": p.headline, "problems": len(benchmarks[p.benchmark])}
                       for p in plans},
        "agents": {},
    }
    firsts: dict[str, dict[str, tuple[list, list]]] = {p.benchmark: {} for p in plans}  # each agent's first answers
    for j, (name, agent) in enumerate(agents.items()):
        rows: dict[str, Any] = {}
        for b, plan in enumerate(plans):
            examples = list(benchmarks[plan.benchmark])
            answers: list[list[str]] = []
            try:
                rewards = answer_rewards(agent, engines[name], examples, samples=plan.samples,
                                         temperature=temperature, seed=seed + 1000 * j + b, answers_out=answers,
                                         score=score[plan.benchmark] if isinstance(score, Mapping) else score)  # [P, n]
            except RewardFailedEverywhere as err:  # named with the agent and benchmark it stopped at
                raise RewardFailedEverywhere(f"{name} on {plan.benchmark}: {err}") from None
            if responses is not None:
                responses += response_records(name, plan.benchmark, agent, examples, answers, rewards)
            firsts[plan.benchmark][name] = ([answer_key(row[0]) for row in answers], rewards[:, 0].tolist())
            scores = score_correct(rewards, plan.pass_k)
            rows[plan.benchmark] = {
                **scores, "headline": scores[plan.headline],
                "correct": [int((r > 0).sum()) for r in rewards],
                "prompt_ids": [ex.prompt_id for ex in examples],
            }
            if progress:
                progress(f"{name} / {plan.benchmark}: {plan.headline} = {scores[plan.headline]:.3f}")
        headlines = [row["headline"] for row in rows.values()]
        results["agents"][name] = {
            "source": (sources or {}).get(name, agent.cfg.model),
            "scores": rows,
            "average": sum(headlines) / len(headlines) if headlines else math.nan,
        }
        if name in (checkpoints or {}):
            results["agents"][name]["checkpoint"] = dict(checkpoints[name])
    together = {bench: collective_figures({n: a for n, (a, _) in by.items()}, {n: c for n, (_, c) in by.items()})
                for bench, by in firsts.items()}
    if any(together.values()):
        results["collective"] = {bench: figures for bench, figures in together.items() if figures}
    return results


def prompt_problems(agents: Mapping[str, Agent], benchmarks: Mapping[str, Sequence[Example]], *,
                    few_shot: int = 0) -> tuple[list[Any], list[str]]:
    """Prompts no agent would see whole: (problems, notes). A benchmark none of whose prompts fits an agent's
    `max_prompt_len` in its chat template is a problem (train.py's own check, `preflight.prompt_fit_problem`: every
    prompt would be cut from the left and every answer scored on a question it never saw); where only some are
    longer, a note counts them (they are cut from the left, as generation does)."""
    from dataclasses import replace as changed

    from hacrl_lightning.preflight import model_positions, prompt_fit_problem

    problems, notes = [], []
    shots = (f"; or fewer worked examples: few_shot={few_shot} puts {few_shot} in front of every question"
             if few_shot else "")
    for name, agent in agents.items():
        found = model_positions(agent.model.config)
        for benchmark, examples in benchmarks.items():
            prompts = [ex.prompt for ex in examples]
            unfit = prompt_fit_problem("max_prompt_len", agent.tokenizer, agent.cfg, prompts,
                                       what=f"{benchmark} prompts", longer="a longer prompt is cut from the left")
            lengths = [len(ids) for ids in agent.encode_prompts(prompts, truncate=False)]
            if unfit and found and min(lengths) >= found[0]:  # no max_prompt_len can hold one
                problems.append(changed(unfit, key=f"max_prompt_len (agent {name})", fix=(
                    f"the shortest takes {min(lengths)} tokens, more than the {found[0]} positions of {name}'s model "
                    f"(`{found[1]}`): " + (f"use fewer worked examples than few_shot={few_shot}" if few_shot
                                           else "shorten the prompts, or evaluate a model with more positions"))))
            elif unfit:
                problems.append(changed(unfit, key=f"max_prompt_len (agent {name})", fix=f"{unfit.fix}{shots}"))
            if unfit:
                continue
            cut = sum(n > agent.max_prompt_len for n in lengths)
            if cut:
                notes.append(f"note: {cut} of {len(prompts)} {benchmark} prompts are longer than {name}'s "
                             f"max_prompt_len={agent.max_prompt_len} and are cut from the left; set max_prompt_len "
                             "to keep them whole")
    return problems, notes


def clear_earlier_evaluation(directory: str | os.PathLike) -> list[str]:
    """Delete every file an earlier evaluate.py wrote in `directory` (`preflight.EVALUATION_FILES`: its config,
    results, responses and engine folders; a link is removed, never followed), before `overwrite=true` writes a
    new one there: nothing of the earlier evaluation stays beside the new results. Returns the names deleted."""
    import shutil

    from hacrl_lightning.preflight import EVALUATION_FILES

    deleted = []
    for name in EVALUATION_FILES:
        path = Path(directory) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted


def response_records(name: str, benchmark: str, agent: Agent, examples: Sequence[Example],
                     answers: Sequence[Sequence[str]], rewards: torch.Tensor) -> list[dict[str, Any]]:
    """One record per answer: the agent, benchmark, problem id, sample, question, the prompt as the agent saw it
    (its chat template), the response, its last `\\boxed{}` (what the built-in rewards read; null without one),
    the gold answer and the reward."""
    prompts = agent.render_prompts([ex.prompt for ex in examples])
    return [{"agent": name, "benchmark": benchmark, "prompt_id": ex.prompt_id, "sample": k, "question": ex.prompt,
             "prompt": prompt, "response": text, "boxed": extract_boxed(text), "gold": ex.gold,
             "reward": float(rewards[p, k])}
            for p, (ex, prompt, row) in enumerate(zip(examples, prompts, answers)) for k, text in enumerate(row)]


def write_responses(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """`records` as JSON lines (`response_records`), written atomically (`files.write_atomically`)."""
    from hacrl_lightning.files import write_atomically

    return write_atomically(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


# ---------------------------------------------------------------------------------------------------
# tables and files


def format_table(results: Mapping[str, Any]) -> str:
    """A markdown table: one row per agent, one column per benchmark (its headline metric), and AVG;
    a `checkpoint` column (step and file) when any agent came from a training checkpoint."""
    benches = results["benchmarks"]
    from_checkpoint = any("checkpoint" in agent for agent in results["agents"].values())
    header = ["agent"] + [f"{b['title']} {b['headline']}" for b in benches.values()] + ["AVG"]
    rows = [header + ["checkpoint"] * from_checkpoint]
    for name, agent in results["agents"].items():
        cells = [f"{agent['scores'][key]['headline']:.3f}" for key in benches]
        rows.append([name] + cells + [f"{agent['average']:.3f}"] + [checkpoint_cell(agent)] * from_checkpoint)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def checkpoint_cell(agent: Mapping[str, Any]) -> str:
    """`step 40 of 150, step_0000040.ckpt` (`, run still training` while it was), or "" for an exported agent."""
    info = agent.get("checkpoint")
    if not info:
        return ""
    of = f" of {info['steps_wanted']}" if info.get("steps_wanted") else ""
    training = ", run still training" if info.get("run") == "training" else ""
    return f"step {info['step']}{of}, {Path(info['file']).name}{training}"


def write_results(results: Mapping[str, Any], directory: str | os.PathLike) -> tuple[Path, Path]:
    """`results.json` (everything) and `results.md` (the table, how it was made and, with several agents, the
    agents together: `collective.markdown_lines`) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "results.json", directory / "results.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# Evaluation ({results['protocol']} protocol)", "", format_table(results), ""]
    lines += ["| benchmark | problems | samples per problem | metric |", "|---|---|---|---|"]
    lines += [f"| {b['title']} | {b['problems']} | {b['samples']} | {b['headline']} |"
              for b in results["benchmarks"].values()]
    lines += ["", "Agents:", ""] + [f"- `{name}`: {a['source']}" + (f" ({checkpoint_cell(a)}, {a['checkpoint']['file']})"
                                                                  if "checkpoint" in a else "")
                                    for name, a in results["agents"].items()]
    together = markdown_lines(results.get("collective", {}),
                              titles={key: b["title"] for key, b in results["benchmarks"].items()})
    lines += [""] + together if together else []
    md_path.write_text("\n".join(lines).rstrip("\n") + "\n")
    return json_path, md_path


# ---------------------------------------------------------------------------------------------------
# agents from exports, hub ids and checkpoints


def _is_checkpoint(path: Path) -> bool:
    return path.suffix == ".ckpt" or (path.is_dir() and not (path / "config.json").exists()
                                      and ((path / "checkpoints").is_dir() or any(path.glob("step_*.ckpt"))))


def _unique(name: str, taken: Mapping[str, Any]) -> str:
    candidate, i = name, 2
    while candidate in taken:
        candidate, i = f"{name}-{i}", i + 1
    return candidate


def export_config(directory: Path) -> tuple[str | None, AgentConfig]:
    """(agent name, AgentConfig) of a standalone HF dir; an `Agent.export` dir also restores its settings."""
    cfg = AgentConfig(model=str(directory))
    settings_file = directory / AGENT_FILE
    if not settings_file.exists():
        return None, cfg
    settings = json.loads(settings_file.read_text())
    cfg = replace(cfg, chat_template_kwargs=dict(settings.get("chat_template_kwargs") or {}),
                  system_prompt=settings.get("system_prompt"),
                  max_prompt_len=int(settings.get("max_prompt_len", cfg.max_prompt_len)),
                  max_response_len=int(settings.get("max_response_len", cfg.max_response_len)))
    return settings.get("name"), cfg


def run_config(run_dir: Path) -> TrainConfig:
    """The TrainConfig a run saved (`config.yaml`, as resolved by scripts/train.py)."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no config.yaml beside the checkpoint, so the agents cannot be rebuilt. "
                                "Fix: give the run directory written by scripts/train.py, or evaluate its exports "
                                f"({run_dir}/exports/<agent>)")
    from omegaconf.errors import OmegaConfBaseException

    from hacrl_lightning.safe_load import read_yaml

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), read_yaml(path, key="agents")))
    except OmegaConfBaseException as err:
        raise AgentLoadError(f"{path}: not a run's config ({str(err).splitlines()[0]}). Fix: give the run "
                             "directory written by scripts/train.py, or evaluate its exports") from None


def _load_checkpoint(checkpoint: Path) -> dict[str, Any]:
    """A whole Lightning checkpoint (a file, or an FSDP2 directory, consolidated), read with `safe_load`'s
    readers: one that would run code raises `UnsafeCheckpoint` and nothing of it runs."""
    from hacrl_lightning.safe_load import check_distributed_checkpoint, load_checkpoint_file

    if checkpoint.is_dir():
        from lightning.fabric.utilities.consolidate_checkpoint import _load_distributed_checkpoint

        check_distributed_checkpoint(checkpoint)
        return _load_distributed_checkpoint(checkpoint)
    return load_checkpoint_file(checkpoint)


def checkpoint_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The module state dict of a Lightning checkpoint (a file, or an FSDP2 directory, consolidated)."""
    state = _load_checkpoint(checkpoint)
    return state.get("state_dict", state)


def run_state(run_dir: Path) -> str:
    """`training` while the process that holds the run's lock lives (its pid is in `.lock`, which a run
    removes when it ends), else the status in its summary.json, else `unknown`. Only reads files: taking
    the lock, even for a moment, could refuse a run starting then (`run_dir.live_holder`)."""
    from hacrl_lightning.run_dir import live_holder

    if live_holder(run_dir):
        return "training"
    try:
        return str(json.loads((run_dir / "summary.json").read_text()).get("status", "unknown"))
    except (OSError, ValueError):
        return "unknown"


def _newest_loaded(location: str | os.PathLike, tries: int = 3) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint at `location` and its contents. A run still training deletes its oldest
    checkpoints as it saves new ones: one that vanished between the listing and the load is looked up again."""
    from hacrl_lightning.callbacks.checkpoint import newest_evaluable

    for _ in range(tries - 1):
        checkpoint = newest_evaluable(location)
        if Path(location) == checkpoint:  # a file given by name: no other to look up
            break
        try:
            return checkpoint, _load_checkpoint(checkpoint)
        except FileNotFoundError:
            continue
    checkpoint = newest_evaluable(location)
    return checkpoint, _load_checkpoint(checkpoint)


def agents_from_checkpoint(location: str | os.PathLike, *, zoo_cache: str | None = None,
                           adjust: Callable[[AgentConfig], AgentConfig] = lambda c: c,
                           trust_remote_code: bool = False) -> tuple[dict[str, Agent], dict[str, Any]]:
    """Every agent of a run, built as its config says and loaded with the newest checkpoint's weights, and
    which checkpoint that was: its `file`, `step` (training steps done), the run's `steps_wanted` and
    `run` state (`run_state`: `training` when the run is still going, so a newer checkpoint may come).

    The run's config is someone's file: an agent it marks `trust_remote_code: true` is refused unless this
    command allows it (`trust_remote_code`), and its `zoo_cache` is not used (the command's own is)."""
    from hacrl_lightning.callbacks.checkpoint import CHECKPOINT_RE, WEIGHTS_RE, run_dir_of

    checkpoint, full = _newest_loaded(location)
    run_dir = run_dir_of(checkpoint)
    cfg = run_config(run_dir)
    untrusted = [name for name, agent_cfg in cfg.agents.items() if agent_cfg.trust_remote_code]
    if untrusted and not trust_remote_code:
        raise AgentLoadError(
            f"{run_dir / 'config.yaml'}: agents {untrusted} were trained with trust_remote_code: true (loading them "
            f"runs code shipped with {[cfg.agents[n].model for n in untrusted]}); evaluate.py does not take that from "
            "a run's saved config. Fix: if you trust that code, add trust_remote_code=true to this command")
    numbered = CHECKPOINT_RE.match(checkpoint.name) or WEIGHTS_RE.match(checkpoint.name)
    step = (full.get("hacrl") or {}).get("steps_done", int(numbered.group(1)) if numbered else None)
    info = {"file": str(checkpoint.resolve()), "step": step, "steps_wanted": _steps_wanted(run_dir, cfg),
            "run": run_state(run_dir)}
    state = full.get("state_dict", full)
    agents = {}
    for name, agent_cfg in cfg.agents.items():
        prefix = f"agents.{name}."
        weights = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
        if not weights:
            raise AgentLoadError(f"{checkpoint}: no weights for agent {name!r} (keys {prefix}*). Fix: give a "
                                 "checkpoint written by scripts/train.py for this run")
        agent = Agent.load(name, adjust(agent_cfg), zoo_cache=zoo_cache, check_texts=())
        agent.load_state_dict(weights, strict=True)
        agents[name] = agent
    return agents, info


def _steps_wanted(run_dir: Path, cfg: TrainConfig) -> int:
    """The run's `trainer.steps`: a resumed session's (config.resumed.yaml, e.g. an extension) over the first's."""
    from omegaconf import OmegaConf

    from hacrl_lightning.safe_load import read_yaml

    resumed = run_dir / "config.resumed.yaml"
    if resumed.is_file():
        steps = OmegaConf.select(read_yaml(resumed, key="agents"), "trainer.steps")
        if isinstance(steps, int):
            return steps
    return cfg.trainer.steps


def load_eval_agents(entries: Sequence[str], *, zoo_cache: str | None = None,
                     adjust: Callable[[AgentConfig], AgentConfig] = lambda c: c, trust_remote_code: bool = False,
                     presets: Mapping[str, AgentConfig] | None = None,
                     ) -> tuple[dict[str, Agent], dict[str, str], dict[str, dict[str, Any]]]:
    """Agents to evaluate, where each came from, and for those from a run's checkpoint which checkpoint
    (`agents_from_checkpoint`'s file, step, steps_wanted, run state). An entry is an exported agent dir or any
    standalone HF dir, a run dir or `.ckpt` (all of the run's agents, with the newest checkpoint's
    weights; a run dir without checkpoints gives its exports), `zoo:<preset>` (its built directory,
    with the lengths and template settings the zoo saved there: the preset's), an agent preset's name found in
    `presets` (its `AgentConfig`: `smollm2_135m_instruct`), or a hub id. `adjust`
    edits each AgentConfig (length and dtype overrides). An export cut short (`incomplete_export`)
    raises AgentLoadError with how to redo it.

    Tokenizers are not checked for lossless round trips here: evaluation never retokenizes. Code shipped with
    a model runs only with `trust_remote_code` (the command's own setting, never a run's saved one).
    """
    agents: dict[str, Agent] = {}
    sources: dict[str, str] = {}
    checkpoints: dict[str, dict[str, Any]] = {}
    for entry in entries:
        path = Path(os.path.expanduser(entry))
        if entry in (presets or {}) and not path.exists():  # an agent preset: its model with its settings
            key = _unique(entry.replace(".", "_"), agents)
            agents[key] = Agent.load(key, adjust(replace(presets[entry], trust_remote_code=trust_remote_code)),
                                     zoo_cache=zoo_cache, check_texts=())
            sources[key] = f"agent preset {entry} ({presets[entry].model})"
            continue
        if _is_checkpoint(path):
            loaded, info = agents_from_checkpoint(path, zoo_cache=zoo_cache, adjust=adjust,
                                                  trust_remote_code=trust_remote_code)
            for name, agent in loaded.items():
                key = _unique(name, agents)
                agents[key], sources[key], checkpoints[key] = agent, f"checkpoint {info['file']}", info
            continue
        if entry.startswith(ZOO_PREFIX):  # as the zoo built it: its saved settings are the training's
            path = Path(resolve_source(entry, entry, key="agents", zoo_cache=zoo_cache))
        if path.is_dir() and any((path / name).exists() for name in CONFIG_FILES):  # a model, or a LoRA adapter
            directories = [path]
        elif path.is_dir():
            exports = path / "exports"  # a run directory without checkpoints: its exported agents
            found = exports.iterdir() if exports.is_dir() else ()
            directories = sorted(p for p in found if p.is_dir() and not p.name.endswith(".old"))
        elif path.with_name(path.name + PARTIAL_SUFFIX).is_dir():  # its export was cut short
            directories = [path.with_name(path.name + PARTIAL_SUFFIX)]
        elif path.exists() or entry.startswith(("/", "./", "../", "~")) or entry.count("/") > 1:
            raise AgentLoadError(f"agents entry {entry!r} is neither an agent directory (config.json + weights), a run "
                                 "directory (checkpoints/ or exports/) nor a .ckpt file. Fix: give "
                                 "runs/<run>/exports/<agent>, runs/<run> or a checkpoint path")
        else:  # a hub id such as Qwen/Qwen3-4B-Base
            key = _unique(entry.split("/")[-1].replace(".", "_"), agents)
            agents[key] = Agent.load(key, adjust(AgentConfig(model=entry, trust_remote_code=trust_remote_code)),
                                     zoo_cache=zoo_cache, check_texts=())
            sources[key] = entry
            continue
        if not directories and (path / "adapter_model.safetensors").is_file():
            raise AgentLoadError(f"LoRA adapter folder {path}: adapter_model.safetensors without its "
                                 "adapter_config.json (the adapter's settings and base model). Fix: copy "
                                 "adapter_config.json from where the adapter was written, or give the merged export")
        if not directories:
            raise AgentLoadError(f"agents entry {entry!r}: no config.json in it (and no exported agents in "
                                 f"{path / 'exports'}). Fix: give a Hugging Face model directory or a run directory")
        for directory in directories:
            reason = incomplete_export(directory)
            if reason:
                raise AgentLoadError(f"agents entry {entry!r}: {directory} is an incomplete export ({reason}). "
                                     f"Fix: {redo_export(directory)}")
            name, cfg = export_config(directory)
            key = _unique((name or directory.name).replace(".", "_"), agents)
            agents[key] = Agent.load(key, adjust(replace(cfg, trust_remote_code=trust_remote_code)),
                                     zoo_cache=zoo_cache, check_texts=())
            sources[key] = entry if entry.startswith(ZOO_PREFIX) else str(directory)
    return agents, sources, checkpoints


CONFIG_FILES = ("config.json", "adapter_config.json")
"""A model directory's config: a model's, or a LoRA adapter's (peft's; its base named inside, `Agent.load`)."""
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
                "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def incomplete_export(directory: Path) -> str | None:
    """Why `directory` is not a whole model directory (an export cut short), or None: its `.partial` name
    (`Agent.export` renames a complete one) or a `.partial` beside it (a newer export of it cut short),
    or no config.json, weights or tokenizer files; in a run's
    `exports/`, also no `hacrl_agent.json` (written last by exports before the rename existed)."""
    if directory.name.endswith(PARTIAL_SUFFIX):
        return (f"its name ends in {PARTIAL_SUFFIX}: it is being written, or its writer was stopped before the "
                f"rename to {directory.name.removesuffix(PARTIAL_SUFFIX)}")
    if directory.with_name(directory.name + PARTIAL_SUFFIX).is_dir():
        return (f"a newer export into it was cut short ({directory.name + PARTIAL_SUFFIX} is beside it), so it holds "
                "older weights than the newest export was to write")
    missing = [f"{what} ({' or '.join(names[:2])})" for what, names in (
        ("config", CONFIG_FILES), ("weights", WEIGHT_FILES), ("tokenizer files", TOKENIZER_FILES))
        if not any((directory / name).is_file() for name in names)]
    if not missing and _run_of_export(directory) and not (directory / AGENT_FILE).is_file():
        missing.append(f"agent settings ({AGENT_FILE}, written last)")
    return f"no {', no '.join(missing)} in it" if missing else None


def _run_of_export(directory: Path) -> Path | None:
    """The run directory whose `exports/` holds `directory`, or None."""
    run = directory.parent.parent
    return run if directory.parent.name == "exports" and (run / "config.yaml").is_file() else None


def redo_export(directory: Path) -> str:
    """How to write `directory` again: from its run's newest checkpoint when it is a run's export."""
    run = _run_of_export(directory)
    if run is None:
        return "write the directory again (Agent.export, or save_pretrained of the model and of its tokenizer)"
    return (f"re-export it: python scripts/train.py <the run's overrides> resume={run} (a run stopped during its "
            f"exports trains nothing more and exports again), or evaluate the run's newest checkpoint instead: "
            f"agents=[{run}]")


def build_engines(agents: Mapping[str, Agent], *, backend: str = "hf", batch_size: int = 64,
                  gpu_memory_utilization: float = 0.5, seed: int = 0,
                  export_dir: str | os.PathLike | None = None) -> dict[str, RolloutEngine]:
    """One rollout engine per agent. vLLM reads weights from a HF dir: each agent is exported first."""
    return {name: make_engine(backend, agent.model,
                              **engine_options(agent, backend, batch_size=batch_size, seed=seed,
                                               gpu_memory_utilization=gpu_memory_utilization,
                                               export_to=Path(export_dir or "eval_exports") / name))
            for name, agent in agents.items()}
