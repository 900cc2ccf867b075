"""Tasks by name: `load_task(cfg)` -> (train set, held-out set), and the texts a tokenizer must round-trip.

A task is a function of the `DataConfig` returning two sized `PromptDataset`s of `Example`s:
`synthetic` (offline arithmetic), `math` (MATH train 7.5k, held out on MATH-500) and `gsm8k` (train /
test). The math tasks read `data.train_files` / `data.eval_files` (jsonl, json or parquet, in the
benchmark's own columns or verl's schema) when given, else the hub (`data/benchmarks.py`); the
held-out set keeps its first `data.eval_size` problems. `data.few_shot=k` puts k worked examples of the train
split in front of every question of both sets (`with_few_shot`). Deliberately not here: rewards
(`hacrl_lightning.rewards`) and batching (the DataModule).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from hacrl_lightning.config import DataConfig
from hacrl_lightning.data.benchmarks import load_benchmark
from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.data.synthetic import format_answer, synthetic_dataset, worked_answer
from hacrl_lightning.errors import suggest

TaskLoader = Callable[[DataConfig], "tuple[PromptDataset, PromptDataset]"]


def _synthetic(cfg: DataConfig) -> tuple[PromptDataset, PromptDataset]:
    return synthetic_dataset(cfg, "train"), synthetic_dataset(cfg, "eval")


def _benchmark_task(train: str, held_out: str) -> TaskLoader:
    """A task whose train set is benchmark `train` and held-out set benchmark `held_out` (files or hub)."""

    def load(cfg: DataConfig) -> tuple[PromptDataset, PromptDataset]:
        return (load_benchmark(train, cfg.train_files),
                load_benchmark(held_out, cfg.eval_files, limit=cfg.eval_size))

    return load


BENCHMARK_TASKS: dict[str, tuple[str, str]] = {"math": ("math_train", "math500"), "gsm8k": ("gsm8k_train", "gsm8k")}
"""The tasks read from benchmarks: name -> (train benchmark, held-out benchmark)."""
TASKS: dict[str, TaskLoader] = {
    "synthetic": _synthetic,
    **{name: _benchmark_task(train, held_out) for name, (train, held_out) in BENCHMARK_TASKS.items()},
}


def task_names() -> list[str]:
    return sorted(TASKS)


_last: dict[str, tuple[PromptDataset, PromptDataset]] = {}


def load_task(cfg: DataConfig) -> tuple[PromptDataset, PromptDataset]:
    """(train, held-out) prompt sets of the task `cfg.name`; an unknown name lists the known ones.

    The last task loaded is kept (keyed by the whole `DataConfig` and its files' modification times),
    so a run loads its task once although the preflight checks and the training both read it."""
    if cfg.name not in TASKS:
        raise KeyError(f"data.name={cfg.name!r} is unknown: {suggest(cfg.name, TASKS)}")
    key = repr((cfg, [os.stat(f).st_mtime_ns if os.path.exists(f) else None
                      for f in [*cfg.train_files, *cfg.eval_files]]))
    if key not in _last:
        _last.clear()
        train, held_out = TASKS[cfg.name](cfg)
        if cfg.few_shot:
            shots = few_shot_pool(train, cfg.few_shot)
            train, held_out = (PromptDataset(with_few_shot(split, shots, cfg.few_shot), name=split.name)
                               for split in (train, held_out))
        _last[key] = train, held_out
    return _last[key]


def few_shot_pool(train: Sequence[Example], k: int) -> list[Example]:
    """The worked examples of `data.few_shot=k`: the train split's first k + 1 (one spare, for the prompts that
    are themselves among the first k)."""
    if len(train) < k + 1:
        raise ValueError(f"data.few_shot={k}: the train split holds {len(train)} problems, and a prompt is never its "
                         f"own example: it needs at least {k + 1}. Fix: a smaller data.few_shot or more train data")
    return list(train)[: k + 1]


def worked_solution(example: Example) -> str:
    """How a worked example answers: the data row's own `solution` field where it has one (MATH), else a synthetic
    question's worked sum (`synthetic.worked_answer`, which ends in the bare boxed answer for any other question)."""
    solution = example.extras.get("solution")
    return solution if isinstance(solution, str) and solution.strip() else worked_answer(example)


def with_few_shot(examples: Sequence[Example], pool: Sequence[Example], k: int) -> list[Example]:
    """Each example with k worked examples before its question, in its prompt text (one user turn: every agent
    renders it through its own chat template): each a question and its worked answer (`worked_solution`), a
    blank line apart, never the example itself; the same k for every prompt but those among them. Ids, gold
    answers and extras are unchanged."""
    out = []
    for ex in examples:
        shots = [shot for shot in pool if shot.prompt_id != ex.prompt_id][:k]
        worked = "".join(f"{shot.prompt}\n{worked_solution(shot)}\n\n" for shot in shots)
        out.append(ex._replace(prompt=worked + ex.prompt))
    return out


def task_check_texts(splits: Sequence[PromptDataset]) -> list[str]:
    """Texts of a loaded task (`load_task`'s splits) that every agent's tokenizer must round-trip
    exactly (checked at load time)."""
    texts = []
    for dataset in splits:
        for example in list(dataset)[:32]:
            texts += [example.prompt, format_answer(example.gold)]
    return texts
