"""Tasks by name: `load_task(cfg)` -> (train set, held-out set), and the texts a tokenizer must round-trip.

A task is a function of the `DataConfig` returning two sized `PromptDataset`s of `Example`s:
`synthetic` (offline arithmetic), `math` (MATH train 7.5k, held out on MATH-500) and `gsm8k` (train /
test). The math tasks read `data.train_files` / `data.eval_files` (jsonl, json or parquet, in the
benchmark's own columns or verl's schema) when given, else the hub (`data/benchmarks.py`); the
held-out set keeps its first `data.eval_size` problems. Deliberately not here: rewards
(`hacrl_lightning.rewards`) and batching (the DataModule).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from hacrl_lightning.config import DataConfig
from hacrl_lightning.data.benchmarks import load_benchmark
from hacrl_lightning.data.records import PromptDataset
from hacrl_lightning.data.synthetic import format_answer, synthetic_dataset
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
        _last[key] = TASKS[cfg.name](cfg)
    return _last[key]


def task_check_texts(splits: Sequence[PromptDataset]) -> list[str]:
    """Texts of a loaded task (`load_task`'s splits) that every agent's tokenizer must round-trip
    exactly (checked at load time)."""
    texts = []
    for dataset in splits:
        for example in list(dataset)[:32]:
            texts += [example.prompt, format_answer(example.gold)]
    return texts
