"""Preflight: every check of a configuration that needs more than its values, before any model loads.

`validate(cfg)` is what composing a run ends with (`hacrl_lightning.cli`): the value checks of
`config.config_problems` plus `name_problems`, the names that other modules define (the algorithm
preset, the advantage / ratio / cross-loss / aggregation / KL modes of `algorithms/`, the rollout
backend, the task, the reward); pure, no file is touched. `check_run(cfg)` is what `scripts/train.py`
runs: the same, plus the checks below, reported together in ONE `ConfigError` (key, value, what is
allowed, how to fix it), so a typo costs seconds, not a model load. Here:

- a local model or tokenizer directory that does not exist or holds no `config.json`; an unknown
  `zoo:` preset;
- a local data file (`data.train_files`, `data.eval_files`) that does not exist; a `resume` that
  holds no complete checkpoint;
- each agent's tokenizer (cheap to load; a `zoo:` preset is built once and cached): it must have a
  chat template and an EOS token, round-trip the task's texts exactly (docs/spec.md §8), fit at least
  the shortest sampled task prompt, in its own chat template, in `max_prompt_len` (longer prompts are
  dropped when the run starts, docs/spec.md §11), and fit the longest
  sampled answer (plus EOS) in `max_response_len`. A text longer than its limit times
  CHARS_PER_TOKEN_BOUND characters is refused by its length alone, never tokenized (the loaders
  refuse a text over `MAX_TEXT_CHARS`, naming its file and row, before that);
- that each agent's prompt and response fit its model's positions (`context_problems`:
  `max_prompt_len + max_response_len` at most the `max_position_embeddings`, or `n_positions`, of
  its config.json; a longer one would crawl or fail mid-run), and, under `split` with `rollout=hf`, that
  a model with learned positions holds its prompt plus the longest response of any agent
  (`lockstep_problems`: transformers generates in lockstep across the ranks);
- that each agent's tokenizer is its model's (`_vocab_problems`): no id beyond the model's embedding
  (`vocab_size` of its config.json), and, where `tokenizer` overrides a model directory that holds a
  tokenizer of its own, the same ids as that one for the task's texts;
- what this machine must have (`device_problems`): no more GPUs than it has when the accelerator is
  gpu/cuda (or auto with devices > 1; CPU ranks with `trainer.accelerator=cpu` are fine), and CUDA
  plus the `vllm` package for `rollout=vllm`;
- on a GPU, the per-GPU memory plan (`memory_plan_problems`, `hacrl_lightning.memory`): a run that
  cannot fit is refused with the plan's table and the changes that would make it fit, cheapest first
  (`trainer.ignore_memory_plan=true` launches anyway); on CPU the plan is informational (`scripts/plan.py`);
- every hub model (an agent's model or tokenizer) and hub benchmark (a math task without local
  files) that is neither in the local cache nor reachable, all probed at once and named together
  with the download command the installed huggingface_hub ships (`hub_problems`, `hub.py`).

`validate_evaluate(cfg)` does the same for `scripts/evaluate.py` (protocol, benchmark, reward and
backend names); `check_evaluate(cfg)` adds its device, vLLM and hub agents and benchmarks
(`evaluate_machine_problems`). Deliberately not here: model weights (never loaded), prompts beyond the
sample (but for the few-shot fit, which measures them all), and the prompts the run drops for their length
(`data/filters.py`; with
`data.filter_overlong_prompts=false` they are left-truncated instead and counted in the
`<agent>/degenerate/prompt_truncated` metric, docs/reliability.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Collection, List, Mapping, NamedTuple, Optional, Sequence

from hacrl_lightning.algorithms.advantages import ADVANTAGES
from hacrl_lightning.algorithms.objective import LOSS_MODES
from hacrl_lightning.config import AgentConfig, DataConfig, EvaluateConfig, TrainConfig, TrainerConfig, \
    config_problems, evaluate_problems
from hacrl_lightning.data.benchmarks import BENCHMARKS, SYNTHETIC, BenchmarkLoadError, hub_fix as benchmark_fix
from hacrl_lightning.data.synthetic import format_answer
from hacrl_lightning.data.tasks import BENCHMARK_TASKS, load_task, task_names
from hacrl_lightning.errors import Checks, ConfigError, Problem, suggest
from hacrl_lightning.hub import download_command, missing_from_hub
from hacrl_lightning.presets import preset_names
from hacrl_lightning.run_dir import output_dir_problem
from hacrl_lightning.rewards import reward_names
from hacrl_lightning.rewards.custom import RewardError, is_code, load_function
from hacrl_lightning.rollout.engine import BACKENDS

SAMPLE_PROMPTS = 64
"""Task examples per split whose prompt and answer lengths are checked against each agent's limits."""
CHARS_PER_TOKEN_BOUND = 32
"""More characters than any tokenizer packs into one token of real text (English averages ~4): a sampled
prompt or answer longer than its token limit times this cannot fit, and is refused by its length alone,
never tokenized (tokenizing a 50 MB prompt took 564 s and 12.8 GB)."""
DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".txt", ".arrow")
"""A data entry ending in one of these (or starting like a path) is a local file that must exist."""


def name_problems(cfg: TrainConfig) -> List[Problem]:
    """The names in `cfg` that other modules define and that are not known there (empty when all are);
    pure, touches no file."""
    c = Checks()
    alg = cfg.algorithm
    names = preset_names()
    if alg.name not in names:
        c.bad("algorithm.name", alg.name, suggest(alg.name, names), "pick a preset: algorithm=<name>")
    c.choice("algorithm.advantage", alg.advantage, ADVANTAGES)
    for key, known in LOSS_MODES.items():  # ratio_level, cross_loss, loss_agg_mode, kl_estimator
        c.choice(f"algorithm.{key}", getattr(alg, key), known)
    c.choice("rollout.backend", cfg.rollout.backend, BACKENDS)
    if cfg.data.name not in task_names():
        c.bad("data.name", cfg.data.name, suggest(cfg.data.name, task_names()), "pick a task, e.g. data=synthetic")
    for key, spec in reward_specs(cfg):
        if not is_code(spec) and spec not in reward_names():
            c.bad(key, spec, f"{suggest(spec, reward_names())}, module:function or path/to/file.py:function",
                  f"set {key} to a registered reward or a function of your own")
    return c.problems


def reward_specs(cfg: TrainConfig) -> List[tuple]:
    """(key, spec) of each reward the run uses: `data.rewards`' terms when given, else `data.reward`."""
    if cfg.data.rewards:
        return [(f"data.rewards[{i}].reward", term.reward) for i, term in enumerate(cfg.data.rewards)]
    return [("data.reward", cfg.data.reward)]


def reward_code_problems(specs) -> List[Problem]:
    """A reward of the user's own code that cannot be loaded, each in one line (what was looked for, where)."""
    problems = []
    for key, spec in specs:
        if is_code(spec):
            try:
                load_function(spec, key=key)
            except RewardError as err:
                problems.append(Problem(key, spec, "a function that loads", str(err)))
    return problems


def pure_problems(cfg: TrainConfig) -> List[Problem]:
    """Every problem of `cfg` that needs no file: its values (`config_problems`), then its names, then whether
    its `trainer.placement=split` can be made (`placement.split_problems`)."""
    from hacrl_lightning.placement import split_problems

    split = [Problem(*problem) for problem in split_problems(cfg)] if cfg.trainer.placement == "split" else []
    return config_problems(cfg) + name_problems(cfg) + split


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise one `ConfigError` listing every value and name problem of `cfg`; return cfg if fine.

    Unknown keys and wrong types are caught while composing (the dataclasses are Hydra's schema).
    Checks that need a file on disk or a tokenizer are `check_run`, which reports them together with these.
    """
    problems = pure_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def check_run(cfg: TrainConfig, *, free_lengths: Mapping[str, FreeLengths] = MappingProxyType({})) -> TrainConfig:
    """Raise one `ConfigError` with every problem of `cfg` (pure checks and preflight); return cfg if fine.
    `free_lengths`: the agents whose lengths the command line leaves to their presets (`fit_few_shot_lengths`:
    with `data.few_shot` set, raised to fit the examples, said on stdout)."""
    problems = pure_problems(cfg)
    problems += reward_code_problems(reward_specs(cfg))
    seen = {p.key for p in problems}
    said: List[str] = []
    problems += [p for p in preflight_problems(cfg, free_lengths=free_lengths, said=said) if p.key not in seen]
    if problems:
        raise ConfigError(problems)
    from hacrl_lightning.placement import launch_rank

    if launch_rank(cfg.trainer.devices) == 0:  # every rank runs the preflight; one says what it fitted
        for line in said:
            print(line, flush=True)
    return cfg


def evaluate_name_problems(cfg: EvaluateConfig) -> List[Problem]:
    """The protocol, benchmark, reward and backend names of an evaluation config that are not known; pure."""
    from hacrl_lightning.config import PROTOCOLS

    c = Checks()
    c.choice("protocol", cfg.protocol, PROTOCOLS)
    if not cfg.benchmarks:
        c.bad("benchmarks", [], f"at least one of {sorted(BENCHMARKS)}", "e.g. benchmarks=[math500,aime2025]")
    for name in cfg.benchmarks:
        if name not in BENCHMARKS:
            c.bad("benchmarks", name, suggest(name, BENCHMARKS), "pick registered benchmarks")
    if cfg.temperature == 0:
        sampled = [b for b in cfg.benchmarks if b in BENCHMARKS and
                   (cfg.samples if cfg.protocol == "custom" else BENCHMARKS[b].paper_samples) > 1]
        if sampled:
            c.bad("temperature", 0, f"> 0 where several answers per problem are drawn ({sampled})",
                  "leave temperature=null (greedy for one answer, each agent's temperature for several)")
    if cfg.reward is not None and not is_code(cfg.reward) and cfg.reward not in reward_names():
        c.bad("reward", cfg.reward, suggest(cfg.reward, reward_names()),
              "set reward to a registered reward, module:function, path/to/file.py:function, or null (each "
              "benchmark's own)")
    if cfg.files.get(SYNTHETIC):
        c.bad(f"files.{SYNTHETIC}", cfg.files[SYNTHETIC], "no files: the synthetic benchmark is generated",
              f"drop files.{SYNTHETIC}")
    if cfg.few_shot_task not in task_names():  # the task whose train split gives the worked examples
        c.bad("few_shot_task", cfg.few_shot_task, f"a training task: {suggest(cfg.few_shot_task, task_names())}",
              f"set few_shot_task=synthetic (its train split's first few_shot={cfg.few_shot} examples go in "
              "front of every question), or the task the run trained on")
    c.choice("backend", cfg.backend, BACKENDS)
    return c.problems


def validate_evaluate(cfg: EvaluateConfig) -> EvaluateConfig:
    """Every problem of an evaluation config at once (one ConfigError), or cfg when it is fine."""
    problems = evaluate_problems(cfg) + evaluate_name_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


EVALUATION_FILES = ("evaluate.yaml", "results.json", "results.md", "responses.jsonl", "engine_dirs")
"""What scripts/evaluate.py writes into its output_dir: all of it replaced under `overwrite=true`."""


def evaluation_folder(path: str) -> bool:
    """`path` holds an earlier evaluation and nothing else (evaluate.yaml, and only evaluate.py's files)."""
    folder = Path(path).expanduser()
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    return "evaluate.yaml" in names and names <= set(EVALUATION_FILES)


def earlier_evaluation_problem(cfg: EvaluateConfig) -> Optional[Problem]:
    """An `output_dir` holding an earlier evaluation (`evaluation_folder`), without `overwrite=true`: refused,
    naming its files and agents (a second evaluation there would replace them)."""
    if cfg.overwrite or not evaluation_folder(cfg.output_dir):
        return None
    import json

    folder = Path(cfg.output_dir).expanduser()
    try:
        agents = [str(name) for name in json.loads((folder / "results.json").read_text())["agents"]]
    except (OSError, ValueError, KeyError, TypeError):
        agents = []
    of = f" of {', '.join(agents[:4])}{' and more' if len(agents) > 4 else ''}" if agents else ""
    files = ", ".join(sorted(p.name for p in folder.iterdir()))
    return Problem("output_dir", str(folder), "a new or empty folder (or overwrite=true over an earlier evaluation)",
                   f"it holds an earlier evaluation{of} ({files}), which this one would replace; nothing was changed: "
                   "choose another output_dir, or add overwrite=true to replace all of those files")


def check_evaluate(cfg: EvaluateConfig, *, presets: Collection[str] = ()) -> EvaluateConfig:
    """`validate_evaluate` plus what this machine must have: the device, vLLM, and every hub model and
    benchmark it names, in the local cache or reachable (all at once); what `scripts/evaluate.py`
    runs before it writes or loads anything. `presets`: the agent presets' names (an `agents` entry naming one is
    no hub id)."""
    problems = evaluate_problems(cfg) + evaluate_name_problems(cfg)
    problems += reward_code_problems([("reward", cfg.reward)] if cfg.reward else [])
    output = earlier_evaluation_problem(cfg) or output_dir_problem(
        cfg.output_dir, key="output_dir", overwrite=cfg.overwrite,
        writes="evaluate.yaml, results.json" + (", results.md and responses.jsonl" if cfg.save_responses
                                               else " and results.md"))
    problems += [output] if output else []
    seen = {p.key for p in problems}
    problems += [p for p in evaluate_machine_problems(cfg, presets) if p.key not in seen]
    if problems:
        raise ConfigError(problems)
    return cfg


# ---------------------------------------------------------------------------------------------------
# what this machine has: GPUs, vLLM, the hub (each its own function)


def _cuda_devices() -> int:
    import torch  # loaded only when a GPU is asked for: a CPU config reports without it

    return torch.cuda.device_count()


def _vllm_problem(key: str, *, gpus: int, fix: str) -> Optional[Problem]:
    """None when vLLM is installed for a platform it serves here (asked of vLLM: its CUDA build with a
    GPU, or its CPU build), else the problem and the fix."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        lacks = "no vllm package"
    else:
        from hacrl_lightning.rollout.vllm import vllm_platform

        if vllm_platform() is not None:
            return None
        lacks = "vllm, but no CUDA GPU for it" if gpus == 0 else "vllm, which finds no platform it serves"
    return Problem(key, "vllm", "vllm with a CUDA GPU (pip install -e '.[vllm]') or vLLM's CPU build (make .venv-vllm)",
                   f"this machine has {lacks}: use the transformers backend, {fix}")


def device_problems(cfg: TrainConfig) -> List[Problem]:
    """More GPUs than this machine has (`trainer.accelerator` gpu/cuda, or auto with a GPU present),
    or the vLLM backend without CUDA or the package. CPU ranks (`trainer.accelerator=cpu`) are not
    counted: the tests rehearse the sharded path on two gloo CPU ranks."""
    tr: TrainerConfig = cfg.trainer
    gpu_asked = tr.accelerator in ("gpu", "cuda") or (tr.accelerator == "auto" and tr.devices > 1)
    if not gpu_asked and cfg.rollout.backend != "vllm":
        return []
    gpus = _cuda_devices()
    problems = []
    if tr.accelerator in ("gpu", "cuda") and gpus == 0:
        problems.append(Problem("trainer.accelerator", tr.accelerator, "cpu or auto (this machine has no CUDA GPU)",
                                "rehearse the same sharded path on CPU ranks: trainer.accelerator=cpu "
                                "trainer.devices=2, or train in one process: trainer=default"))
    elif tr.accelerator != "cpu" and 0 < gpus < tr.devices:
        problems.append(Problem("trainer.devices", tr.devices, f"at most {gpus} (the CUDA GPUs of this machine)",
                                f"set trainer.devices={gpus}, or run where {tr.devices} GPUs are"))
    if cfg.rollout.backend == "vllm":
        missing = _vllm_problem("rollout.backend", gpus=gpus, fix="rollout=hf")
        problems += [missing] if missing else []
        if cfg.rollout.sleep and not missing:
            problems += [p for p in [sleep_problem()] if p]
        if not missing:
            problems += [Problem(*p) for p in engine_share_problems(cfg)]
    return problems


def engine_share_problems(cfg: TrainConfig) -> list[tuple]:
    """The vLLM engines' memory shares on this machine (`placement.engine_shares`: summed over its ranks and agents
    on vLLM's CPU build) that cannot fit, before any engine starts (rank 0's machine; a split that cannot be
    made is said by `split_problems` instead)."""
    import psutil

    from hacrl_lightning.placement import Placement, engine_shares, split_problems
    from hacrl_lightning.rollout.vllm import vllm_platform

    if cfg.trainer.placement == "split" and split_problems(cfg):
        return []
    engines = Placement.of(cfg, rank=0).engines_on_node(cfg.trainer.devices if cfg.trainer.strategy == "fsdp" else 1)
    memory = psutil.virtual_memory()
    _, problems, _ = engine_shares({name: agent.gpu_memory_utilization for name, agent in cfg.agents.items()},
                                   engines, total_bytes=memory.total, available_bytes=memory.available,
                                   platform=vllm_platform() or "cuda")
    return problems


def sleep_problem() -> Optional[Problem]:
    """`rollout.sleep=true` where vLLM has no sleep mode: its CPU build (`current_platform.is_sleep_mode_available()`
    is false there, and `LLM(enable_sleep_mode=True)` refuses), never silently ignored."""
    from vllm.platforms import current_platform

    if current_platform.is_sleep_mode_available():
        return None
    return Problem("rollout.sleep", True, f"false on this machine: vLLM's {current_platform.device_type} platform has no "
                   "sleep mode (CUDA has)", "drop rollout.sleep (the engines then keep their memory between rollouts), "
                   "or run on a CUDA GPU")


def runs_on_gpu(cfg: TrainConfig) -> bool:
    """The run's accelerator is a GPU: gpu/cuda, or auto where CUDA is present."""
    tr = cfg.trainer
    return tr.accelerator in ("gpu", "cuda") or (tr.accelerator == "auto" and _cuda_devices() > 0)


def memory_plan_problems(cfg: TrainConfig) -> List[Problem]:
    """A GPU run whose per-GPU memory plan does not fit (`hacrl_lightning.memory`), before any weights load."""
    from hacrl_lightning.memory import memory_problems

    return memory_problems(cfg, on_gpu=runs_on_gpu(cfg))


def _hub_missing(wanted: List[tuple[str, str, Optional[str], str]],
                        benchmarks: List[tuple[str, str]]) -> List[Problem]:
    """wanted: (key, hub id, revision, the override that points at a local copy); benchmarks: (key,
    benchmark name). One Problem for each that is neither cached nor reachable, all probed at once."""
    from hacrl_lightning.agents.sources import hub_fix

    repos = [(repo, "model", revision) for _, repo, revision, _ in wanted]
    repos += [(BENCHMARKS[name].hub_id, "dataset", None) for _, name in benchmarks]
    missing = missing_from_hub(repos)
    problems = []
    for key, repo, revision, setting in wanted:
        why = missing.get((repo, "model", revision))
        if why:
            problems.append(Problem(key, repo, "a model in the local Hugging Face cache or on a reachable hub, "
                                    "or a local directory", f"{why}; {hub_fix(repo, setting)}"))
    for key, name in benchmarks:
        spec = BENCHMARKS[name]
        why = missing.get((spec.hub_id, "dataset", None))
        if why:
            problems.append(Problem(key, f"benchmark {name} ({spec.hub_id})", "local files, or a benchmark on a "
                                    "reachable hub", f"{why}; {benchmark_fix(spec)}"))
    return problems


def hub_problems(cfg: TrainConfig) -> List[Problem]:
    """Every hub model (agents' model / tokenizer) and hub benchmark (a math task without local files)
    of the run that is neither in the local cache nor reachable: all named in one list."""
    from hacrl_lightning.agents.sources import is_hub_id

    wanted = []
    for name, agent in cfg.agents.items():
        for field in ("model", "tokenizer"):
            source = getattr(agent, field)
            if source and is_hub_id(source):
                key = f"agents.{name}.{field}"
                wanted.append((key, source, agent.revision, f"{key}=/path/to/dir"))
    benchmarks = []
    if cfg.data.name in BENCHMARK_TASKS:
        train, held_out = BENCHMARK_TASKS[cfg.data.name]
        benchmarks = [(f"data.{key}", bench) for key, bench in (("train_files", train), ("eval_files", held_out))
                      if not getattr(cfg.data, key)]
    return _hub_missing(wanted, benchmarks)


def evaluate_machine_problems(cfg: EvaluateConfig, presets: Collection[str] = ()) -> List[Problem]:
    """An evaluation's device and backend this machine lacks, and its hub agents and benchmarks (without
    `files.<name>`) that are neither cached nor reachable: all at once."""
    from hacrl_lightning.agents.sources import is_hub_id

    problems = []
    if cfg.device == "cuda" or cfg.backend == "vllm":
        gpus = _cuda_devices()
        if cfg.device == "cuda" and gpus == 0:
            problems.append(Problem("device", "cuda", "cpu or auto (this machine has no CUDA GPU)", "set device=auto"))
        if cfg.backend == "vllm":
            problems += [p for p in [_vllm_problem("backend", gpus=gpus, fix="backend=hf")] if p]
    wanted = [(f"agents[{i}]", entry, None, "agents=[/path/to/dir,...]") for i, entry in enumerate(cfg.agents)
              if is_hub_id(entry) and entry not in presets]  # a preset's name: its own model source
    benchmarks = [(f"files.{name}", name) for name in cfg.benchmarks
                  if name in BENCHMARKS and name != SYNTHETIC and not cfg.files.get(name)]
    if cfg.few_shot and cfg.few_shot_task in BENCHMARK_TASKS:  # the worked examples come from its train split
        benchmarks.append(("few_shot_task", BENCHMARK_TASKS[cfg.few_shot_task][0]))
    return problems + _hub_missing(wanted, benchmarks)


def preflight_problems(cfg: TrainConfig, *, free_lengths: Mapping[str, FreeLengths] = MappingProxyType({}),
                       said: Optional[List[str]] = None) -> List[Problem]:
    """The machine, file-system, hub and tokenizer problems of `cfg` (empty when it is fine). Loads no model weights.
    With `data.few_shot` set, the lengths of the agents in `free_lengths` are fitted first (`fit_few_shot_lengths`,
    changing `cfg`; what changed is appended to `said`)."""
    problems = _data_file_problems(cfg.data)
    hub = hub_problems(cfg)
    task_problems: List[Problem] = []
    no_data = any(p.key.startswith("data.") for p in hub)  # its hub benchmarks are unreachable: said there
    prompts, answers, every = ([], [], []) if no_data else _task_sample(cfg.data, task_problems)
    problems += [] if problems else task_problems  # a task that cannot load its missing file: said once
    problems += device_problems(cfg) + hub
    learned: dict = {}
    for name, agent_cfg in cfg.agents.items():
        free = free_lengths.get(name, FreeLengths()) if cfg.data.few_shot else FreeLengths()
        problems += _agent_problems(name, agent_cfg, prompts, answers, zoo_cache=cfg.zoo_cache, free=free,
                                    every_prompt=every, said=said if said is not None else [], learned=learned,
                                    few_shot=cfg.data if cfg.data.few_shot else None)
    problems = _one_few_shot_problem(problems)
    problems += lockstep_problems(cfg, learned)  # after the fitting: the lengths that run
    problems += memory_plan_problems(cfg)  # after the fitting: the plan counts the lengths that run
    from hacrl_lightning.memory import lora_rank_problems

    problems += lora_rank_problems(cfg)  # a LoRA rank above its layers' width (config.json only), on any device
    if cfg.resume:
        from hacrl_lightning.callbacks.checkpoint import latest_checkpoint

        try:
            latest_checkpoint(cfg.resume)
        except FileNotFoundError as err:
            problems.append(Problem("resume", cfg.resume, "a .ckpt file, or a run dir holding a complete step_*.ckpt",
                                    str(err).split(": ", 1)[-1]))
    return problems


def _looks_local(entry: str) -> bool:
    return entry.startswith(("/", "./", "../", "~")) or entry.lower().endswith(DATA_SUFFIXES)


def _data_file_problems(data: DataConfig) -> List[Problem]:
    problems = []
    for key in ("train_files", "eval_files"):
        for i, entry in enumerate(getattr(data, key)):
            entry = str(entry)
            if _looks_local(entry) and not Path(entry).expanduser().is_file():
                problems.append(Problem(f"data.{key}[{i}]", entry, "an existing local file (or a hub dataset id)",
                                        f"check the path (relative paths start from {os.getcwd()})"))
    return problems


def _task_sample(data: DataConfig, problems: List[Problem]) -> tuple[list[str], list[str], list[str]]:
    """Up to SAMPLE_PROMPTS prompts and boxed answers of each split, and every prompt of both (what
    `fit_few_shot_lengths` measures); a task that fails to load is a problem."""
    if data.name not in task_names():
        return [], [], []  # name_problems reports it
    try:
        splits = load_task(data)
    except (KeyError, ValueError, OSError, BenchmarkLoadError) as err:
        message = err.args[0] if err.args else type(err).__name__
        path = getattr(err, "path", None)  # a DataFormatError names its file: the key that gave it
        key = next((k for k, files in (("data.train_files", data.train_files), ("data.eval_files", data.eval_files))
                    if path is not None and path in map(str, files)), "data")
        problems.append(Problem(key, path if key != "data" else data.name,
                                "a data file that loads" if key != "data" else "a task that loads", str(message)))
        return [], [], []
    examples = [ex for split in splits for ex in list(split)[:SAMPLE_PROMPTS]]
    every = [ex.prompt for split in splits for ex in split] if data.few_shot else []
    return [ex.prompt for ex in examples], [format_answer(ex.gold) for ex in examples], every


def _local_dir_problem(key: str, source: str, *, need_config: bool) -> Optional[Problem]:
    from hacrl_lightning.agents.sources import looks_like_path

    if not looks_like_path(source):
        return None
    path = Path(source).expanduser()
    if not path.is_dir():
        return Problem(key, source, "an existing directory (or a hub id, or zoo:<preset>)",
                       f"point it at a directory written by `{download_command()}` or Agent.export")
    if need_config and not (path / "config.json").is_file():
        return Problem(key, source, "a model directory holding config.json and the weights",
                       "point it at the model's directory, not at a parent or a tokenizer-only one")
    if not need_config and not any((path / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        return Problem(key, source, f"a directory holding a tokenizer (one of {list(TOKENIZER_VOCAB_FILES)})",
                       f"{path} has no tokenizer files: copy them from where the model came from (they are "
                       "saved beside its config.json), or point the agent's tokenizer at a directory or hub id "
                       "holding them")
    return None


TOKENIZER_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
"""A directory holds a tokenizer when it has one of these (its vocabulary)."""


def _resolve(name: str, key: str, source: str, zoo_cache: Any, problems: List[Problem]) -> Optional[str]:
    """`zoo:<preset>` -> its cached directory (built once if needed); an unknown preset is a problem."""
    from hacrl_lightning.agents.sources import AgentLoadError, resolve_source

    try:
        return resolve_source(name, source, key=key, zoo_cache=zoo_cache)
    except AgentLoadError as err:
        from hacrl_lightning.zoo import PRESETS

        problems.append(Problem(key, source, f"zoo:<preset> with a preset of {sorted(PRESETS)}", str(err)))
        return None


def _load_tokenizer(source: str, cfg: AgentConfig):
    """The tokenizer from a local dir or the local HF cache; None for a hub id that is not cached."""
    from transformers import AutoTokenizer

    from hacrl_lightning.agents.sources import looks_like_path

    kwargs = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    if not looks_like_path(source):
        kwargs["local_files_only"] = True
    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(source), **kwargs)
    except OSError:
        return None  # not cached: Agent.load probes the hub and words the fix


class FreeLengths(NamedTuple):
    """Which of an agent's lengths its preset chose and the command line (or experiment) left alone: those
    `fit_few_shot_lengths` may change."""
    prompt: bool = False
    response: bool = False


def _model_config(model: str, cfg: AgentConfig):
    """The model's config.json as transformers reads it (no weights), None when it is not here or not readable
    (Agent.load says what to do)."""
    from transformers import AutoConfig

    from hacrl_lightning.agents.sources import looks_like_path

    try:
        return AutoConfig.from_pretrained(os.path.expanduser(model), revision=cfg.revision,
                                          trust_remote_code=cfg.trust_remote_code,
                                          local_files_only=not looks_like_path(model))
    except (OSError, ValueError):
        return None


def fit_few_shot_lengths(key: str, config, tokenizer, cfg: AgentConfig, prompts: Sequence[str],
                         answers: Sequence[str], free: FreeLengths) -> Optional[str]:
    """With `data.few_shot=k` every prompt carries k worked examples, which an agent preset's `max_prompt_len`
    (written for bare questions: tiny_a's 96) rarely holds. Where the command line left it to the preset
    (`free.prompt`), it becomes the longest of `prompts` (every prompt of both splits) in this agent's template
    that leaves the model's positions room for the longest sampled answer plus EOS; longer prompts could never
    be answered and are dropped at load (data.filter_overlong_prompts), which the line counts. Where the
    positions then cannot hold `max_response_len` too and it is the preset's (`free.response`), the response
    gets what they leave. `config`: the model's, from `_model_config`. Changes `cfg`; returns the line that says
    what changed, or None (nothing to change, or it cannot fit: the checks after this refuse it with the figures)."""
    from hacrl_lightning.agents.agent import encode_chat_prompts
    from hacrl_lightning.agents.tokenizers import encode_text

    found = model_positions(config) if config is not None else None
    if not free.prompt or not prompts or found is None:
        return None
    positions, _ = found
    answer = 1 + max((len(ids) for ids in encode_text(tokenizer, answers)), default=0)  # + EOS
    room = positions - answer  # the longest prompt that can be answered at all
    measurable = [text for text in prompts if len(text) <= room * CHARS_PER_TOKEN_BOUND]  # others never fit
    fitting = [n for n in (len(ids) for ids in encode_chat_prompts(tokenizer, cfg, measurable)) if n <= room] \
        if measurable else []
    if not fitting or max(fitting) <= cfg.max_prompt_len:
        return None
    longest, response = max(fitting), cfg.max_response_len
    if longest + response > positions:
        if not free.response:
            return None  # the command line's response length: refused with the figures
        response = positions - longest
    dropped = len(prompts) - len(fitting)
    old = (cfg.max_prompt_len, cfg.max_response_len)
    cfg.max_prompt_len, cfg.max_response_len = longest, response
    changed = f"max_prompt_len {old[0]} -> {longest}" + (f", max_response_len {old[1]} -> {response} (the model's "
                                                         f"{positions} positions)" if response != old[1] else "")
    left_out = (f"; {dropped} of {len(prompts)} prompts are longer than the model's positions leave (dropped at load, "
                "or left-truncated with data.filter_overlong_prompts=false)") if dropped else ""
    return (f"{key}: data.few_shot prompts take up to {longest} tokens in its template, more than its preset's "
            f"max_prompt_len; for this run {changed}{left_out}. Set {key}.max_prompt_len on the command line to "
            "choose")


def _agent_problems(name: str, cfg: AgentConfig, prompts: Sequence[str], answers: Sequence[str], *,
                    zoo_cache: Any, free: FreeLengths = FreeLengths(), every_prompt: Sequence[str] = (),
                    said: Optional[List[str]] = None, learned: Optional[dict] = None,
                    few_shot: Optional[DataConfig] = None) -> List[Problem]:
    key = f"agents.{name}"
    problems: List[Problem] = []
    model = _resolve(name, f"{key}.model", cfg.model, zoo_cache, problems)
    tokenizer_key = f"{key}.tokenizer" if cfg.tokenizer else f"{key}.model"
    source = model if cfg.tokenizer is None else _resolve(name, tokenizer_key, cfg.tokenizer, zoo_cache, problems)
    for k, s, need_config in ((f"{key}.model", model, True), (tokenizer_key, source, False)):
        problem = s and _local_dir_problem(k, s, need_config=need_config)
        if problem and all(p.key != k for p in problems):
            problems.append(problem)
    if problems or source is None:
        return problems
    tokenizer, config = _load_tokenizer(source, cfg), _model_config(model, cfg)  # config.json read once, here
    fitted = tokenizer is not None and fit_few_shot_lengths(key, config, tokenizer, cfg, every_prompt, answers, free)
    if fitted and said is not None:
        said.append(fitted)
    problems = context_problems(key, config, cfg)
    if learned is not None and config is not None and model_positions(config) and not _rotary(config):
        learned[name] = model_positions(config)
    if tokenizer is None:
        return problems
    problems += (_tokenizer_problems(key, tokenizer_key, source, tokenizer, cfg, prompts, answers) or
                 _vocab_problems(key, tokenizer_key, config, model, source, tokenizer, cfg, [*prompts, *answers]))
    crowded = few_shot is not None and config is not None and \
        any(p.key == f"{key}.max_prompt_len" for p in problems) and \
        few_shot_problem(key, tokenizer, config, cfg, few_shot, prompts, answers)
    if crowded:  # no prompt limit can help: the lengths' own fixes would only trade one for the other
        return [crowded] + [p for p in problems if p.key not in (f"{key}.max_prompt_len", f"{key}.max_response_len")]
    return problems


def few_shot_problem(key: str, tokenizer, config, cfg: AgentConfig, data: DataConfig, prompts: Sequence[str],
                     answers: Sequence[str]) -> Optional[Problem]:
    """With `data.few_shot=k`, sampled prompts that even the shortest of take more of the model's positions than
    its longest answer leaves: raising `max_prompt_len` would only take the room from `max_response_len` (and
    back), so the problem is `data.few_shot`'s, named with the figures and the largest k whose prompts fit
    (`largest_few_shot`); None when the shortest prompt fits."""
    from hacrl_lightning.agents.agent import encode_chat_prompts
    from hacrl_lightning.agents.tokenizers import encode_text

    found = model_positions(config)
    if found is None or not prompts or not answers:
        return None
    positions = found[0]
    answer = 1 + max(len(ids) for ids in encode_text(tokenizer, answers))  # + EOS
    room = positions - answer
    measurable = [text for text in prompts if len(text) <= (room + 1) * CHARS_PER_TOKEN_BOUND] or [min(prompts, key=len)]
    shortest = min(len(ids) for ids in encode_chat_prompts(tokenizer, cfg, measurable))
    if shortest <= room:
        return None
    fits = largest_few_shot(data, tokenizer, cfg, room)
    fix = (f"set data.few_shot={fits} or fewer" if fits else "drop data.few_shot (even one worked example does not "
           "fit)") + f", or give {key} a model with more positions; no {key}.max_prompt_len can help"
    return Problem("data.few_shot", data.few_shot, f"worked examples whose prompts fit {key}'s model: {positions:,} "
                   f"positions, {answer} of them for the longest answer, leave {room:,} for a prompt, and with "
                   f"data.few_shot={data.few_shot} the shortest sampled prompt takes {shortest:,} tokens in its "
                   "template", fix)


def largest_few_shot(data: DataConfig, tokenizer, cfg: AgentConfig, room: int) -> int:
    """The largest k below `data.few_shot` whose shortest sampled prompt (of both splits) fits `room` tokens in
    the agent's template (0 when none does): the task loaded again without examples, k searched by halving."""
    from dataclasses import replace

    from hacrl_lightning.agents.agent import encode_chat_prompts
    from hacrl_lightning.data.tasks import few_shot_pool, with_few_shot

    splits = load_task(replace(data, few_shot=0))
    bare = [ex for split in splits for ex in list(split)[:SAMPLE_PROMPTS]]
    pool = few_shot_pool(list(splits[0]), data.few_shot)
    low, high = 0, data.few_shot - 1  # k = low always fits (0: the bare questions, checked by the limits as ever)
    while low < high:
        middle = (low + high + 1) // 2
        texts = [ex.prompt for ex in with_few_shot(bare, pool, middle)]
        texts = [text for text in texts if len(text) <= (room + 1) * CHARS_PER_TOKEN_BOUND]
        if texts and min(len(ids) for ids in encode_chat_prompts(tokenizer, cfg, texts)) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def _one_few_shot_problem(problems: List[Problem]) -> List[Problem]:
    """The `data.few_shot` problems of several agents as one: the agent whose model fits the fewest examples."""
    crowded = [p for p in problems if p.key == "data.few_shot" and "whose prompts fit" in p.allowed]
    if len(crowded) < 2:
        return problems
    fewest = min(crowded, key=lambda p: int(p.fix.split("data.few_shot=")[1].split()[0]) if "=" in p.fix else 0)
    return [p for p in problems if p not in crowded or p is fewest]


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
"""Where a model's config.json says how many positions it has (the first one present counts)."""


def model_positions(config) -> Optional[tuple[int, str]]:
    """The positions a model config allows and the key that says so (None: it names none). A RoPE scaling
    with a `factor` (YaRN, linear, dynamic) extends them to factor x its original length, if that is more."""
    config = getattr(config, "text_config", None) or config
    found = next(((name, getattr(config, name)) for name in POSITION_KEYS
                  if isinstance(getattr(config, name, None), int)), None)
    if found is None:
        return None
    name, positions = found
    scaling = getattr(config, "rope_scaling", None) or {}
    if isinstance(scaling.get("factor"), (int, float)):
        scaled = int(scaling["factor"] * scaling.get("original_max_position_embeddings", positions))
        if scaled > positions:
            return scaled, "rope_scaling.factor x original_max_position_embeddings"
    return positions, name


def _rotary(config) -> bool:
    """The model encodes positions by rotation (RoPE: Llama, Qwen, Mistral, GPT-NeoX), not by a learned table that
    a position past its length indexes out of range (GPT-2's `n_positions`)."""
    config = getattr(config, "text_config", None) or config
    return any(getattr(config, key, None) is not None
               for key in ("rope_parameters", "rope_scaling", "rope_theta", "rotary_pct", "rotary_dim"))


def lockstep_problems(cfg: TrainConfig, learned: Mapping[str, tuple[int, str]]) -> List[Problem]:
    """Under `trainer.placement=split` with `rollout=hf` every rank generates in lockstep with every other (transformers'
    `synced_gpus`: one all-reduce over the world per token, so a rank whose responses ended keeps running its model
    until the longest response of any group ends). A model with learned positions (`learned`: name -> its positions)
    must then hold its longest prompt plus the longest response of any agent; past them its table is indexed out of
    range and the run fails mid-generation (measured: GPT-2's `n_positions`, an IndexError)."""
    if cfg.trainer.placement != "split" or cfg.rollout.backend != "hf" or not learned:
        return []
    owner = max(cfg.agents, key=lambda name: cfg.agents[name].max_response_len)
    longest = cfg.agents[owner].max_response_len
    problems = []
    for name, (positions, key) in learned.items():
        prompt = cfg.agents[name].max_prompt_len
        if name == owner or prompt + longest <= positions:
            continue
        problems.append(Problem(
            f"agents.{owner}.max_response_len", longest,
            f"at most {positions - prompt} with trainer.placement=split and rollout=hf: {name} has learned positions "
            f"(`{key}` {positions} in its config.json) and keeps stepping its model, in lockstep with every rank, "
            f"until {owner}'s responses end, so its {prompt} prompt positions + {longest} must fit its {positions}",
            f"set agents.{owner}.max_response_len={positions - prompt}, or agents.{name}.max_prompt_len="
            f"{positions - longest}, or use rollout=vllm (engines do not generate in lockstep)"))
    return problems


def context_problems(key: str, config, cfg: AgentConfig) -> List[Problem]:
    """`max_prompt_len + max_response_len` beyond the positions of the model's config.json (`config`, from
    `_model_config`; no weights are read): named with both numbers and the limits that fit."""
    if config is None:
        return []  # not cached, or not a config transformers knows: Agent.load says what to do
    found = model_positions(config)
    prompt, response = cfg.max_prompt_len, cfg.max_response_len
    if found is None or prompt + response <= found[0]:
        return []
    positions, name = found
    allowed = (f"max_prompt_len + max_response_len <= {positions:,} (`{name}` in the config.json of "
               f"{cfg.model!r})")
    if prompt < positions:
        return [Problem(f"{key}.max_response_len", response, allowed,
                        f"{prompt:,} + {response:,} = {prompt + response:,} positions, more than the model's "
                        f"{positions:,}: set {key}.max_response_len={positions - prompt} or less")]
    return [Problem(f"{key}.max_prompt_len", prompt, allowed,
                    f"{prompt:,} + {response:,} = {prompt + response:,} positions, more than the model's "
                    f"{positions:,}: set {key}.max_prompt_len and {key}.max_response_len to sum to {positions:,} "
                    "or less")]


def _overlong(key: str, field: str, limit: int, texts: Sequence[str], what: str) -> Optional[Problem]:
    """A problem when the longest of `texts` has more characters than `limit` tokens can hold; reads
    lengths only (a 50 MB prompt is refused in microseconds)."""
    longest = max(texts, key=len, default="")
    if len(longest) <= limit * CHARS_PER_TOKEN_BOUND:
        return None
    return Problem(f"{key}.{field}", limit,
                   f"sampled task {what}s of at most {limit * CHARS_PER_TOKEN_BOUND:,} characters "
                   f"({CHARS_PER_TOKEN_BOUND} a token at most; ~4 is usual), measured in tokens",
                   f"a sampled {what} has {len(longest):,} characters (it begins {longest[:40]!r}): shorten it "
                   f"or drop that problem from the data files; if {what}s this long are meant, set "
                   f"{key}.{field}={-(-len(longest) // CHARS_PER_TOKEN_BOUND)} or more to have it measured")


def _tokenizer_problems(key: str, tokenizer_key: str, source: str, tokenizer, cfg: AgentConfig,
                        prompts: Sequence[str], answers: Sequence[str]) -> List[Problem]:
    from hacrl_lightning.agents.tokenizers import decode_text, encode_text

    problems: List[Problem] = []
    if cfg.chat_template:
        tokenizer.chat_template = cfg.chat_template
    if not tokenizer.chat_template:
        problems.append(Problem(f"{key}.chat_template", None, "a Jinja chat template over `messages`",
                                f"the tokenizer of {source!r} has none: set {key}.chat_template"))
    if tokenizer.eos_token_id is None:
        problems.append(Problem(tokenizer_key, source, "a tokenizer with an eos_token", f"set {key}.tokenizer"))
    overlong = [p for p in (_overlong(key, "max_prompt_len", cfg.max_prompt_len, prompts, "prompt"),
                            _overlong(key, "max_response_len", cfg.max_response_len, answers, "answer")) if p]
    if overlong:  # nothing is tokenized: the data must change first
        return problems + overlong
    texts = [*prompts, *answers]  # data: a special token spelled in one stays text (`encode_chat_prompts`)
    lossy = next((t for t, ids in zip(texts, encode_text(tokenizer, texts, split_special_tokens=True))
                  if decode_text(tokenizer, ids) != t), None)
    if lossy is not None:
        back = decode_text(tokenizer, encode_text(tokenizer, [lossy], split_special_tokens=True)[0])
        problems.append(Problem(tokenizer_key, source,
                                "a lossless tokenizer: decode(encode(text)) == text on the task's texts "
                                "(docs/spec.md §8)",
                                f"decode(encode({lossy!r})) gives {back!r}; use a byte-level BPE or byte-fallback "
                                f"tokenizer, not WordPiece: {key}.tokenizer=<hub id or dir>"))
    if problems or not prompts:
        return problems
    unfit = prompt_fit_problem(f"{key}.max_prompt_len", tokenizer, cfg, prompts)
    problems += [unfit] if unfit else []
    answer_len = 1 + max(len(ids) for ids in encode_text(tokenizer, answers))  # + EOS
    if answer_len > cfg.max_response_len:
        problems.append(Problem(f"{key}.max_response_len", cfg.max_response_len,
                                f">= {answer_len} (the longest of {len(answers)} sampled answers, plus EOS)",
                                f"set {key}.max_response_len={answer_len} or more; a shorter limit can never "
                                "be rewarded"))
    return problems


def prompt_fit_problem(setting: str, tokenizer, cfg: AgentConfig, prompts: Sequence[str], *,
                       what: str = "sampled task prompts",
                       longer: str = "prompts longer than the limit are dropped at load") -> Optional[Problem]:
    """None of `prompts` fits `cfg.max_prompt_len` in the agent's chat template (`setting`: the key that sets it):
    the problem with the shortest and longest lengths (train.py's preflight; evaluate.py's few-shot prompts)."""
    from hacrl_lightning.agents.agent import encode_chat_prompts

    prompt_lens = [len(ids) for ids in encode_chat_prompts(tokenizer, cfg, prompts)]
    if not prompt_lens or min(prompt_lens) <= cfg.max_prompt_len:
        return None
    return Problem(setting, cfg.max_prompt_len,
                   f">= {min(prompt_lens)} (none of {len(prompts)} {what} fits in this agent's chat template; "
                   f"{longer})", f"set {setting}={min(prompt_lens)} or more for the shortest to fit, "
                   f"{max(prompt_lens)} to keep them all")


def _vocab_problems(key: str, tokenizer_key: str, config, model: str, source: str, tokenizer, cfg: AgentConfig,
                    texts: Sequence[str]) -> List[Problem]:
    """A tokenizer that is not its model's (another agent's, say): one with ids beyond the model's
    embedding (`vocab_size` of its config.json; no weights are read), or, when `tokenizer` overrides a
    model directory that holds a tokenizer of its own, one that gives the task's texts other ids than
    that one does (the model never learned them: it would train at accuracy 0). A tokenizer smaller
    than the embedding is fine (padded vocabularies, as Qwen's). `config`: the model's, from `_model_config`."""
    from hacrl_lightning.agents.agent import mismatch_fix, model_vocab_size
    from hacrl_lightning.agents.sources import looks_like_path
    from hacrl_lightning.agents.tokenizers import embedding_mismatch, encode_text

    if config is None:
        return []  # not cached, or not a config transformers knows: Agent.load says what to do
    local = looks_like_path(model)
    vocab_size, value = model_vocab_size(config), cfg.tokenizer or cfg.model
    mismatch = embedding_mismatch(tokenizer, vocab_size)
    if mismatch:
        return [Problem(tokenizer_key, value, f"a tokenizer whose ids fit the embedding of {cfg.model!r} "
                        f"({vocab_size:,} rows)", f"{mismatch}; {mismatch_fix(key, cfg)}")]
    own_files = local and any((Path(model).expanduser() / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    if cfg.tokenizer is None or source == model or not own_files or not texts:
        return []
    own = _load_tokenizer(model, cfg)
    if own is None:
        return []
    differs = next(((t, a, b) for t, a, b in zip(texts, encode_text(tokenizer, texts), encode_text(own, texts))
                    if a != b), None)
    if differs is None:
        return []
    text, ids, own_ids = differs
    return [Problem(tokenizer_key, value, f"the tokenizer of {cfg.model!r}: the same ids as the tokenizer in its "
                    "directory for the task's texts",
                    f"{tokenizer_key} encodes {text!r} as {ids[:12]}, the model's own tokenizer as {own_ids[:12]} "
                    f"(the model never learned those ids); {mismatch_fix(key, cfg)}")]
