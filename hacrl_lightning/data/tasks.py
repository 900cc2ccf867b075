"""Tasks by name: `load_task(cfg)` -> (train set, held-out set), and the texts a tokenizer must round-trip.

A task is a function of the `DataConfig` returning two sized `PromptDataset`s of `Example`s. Only
the offline synthetic arithmetic task exists so far; dataset loaders register here as they land.
Deliberately not here: rewards (`hacrl_lightning.rewards`) and batching (the DataModule).
"""

from __future__ import annotations

from typing import Callable

from hacrl_lightning.config import DataConfig, suggest
from hacrl_lightning.data.records import PromptDataset
from hacrl_lightning.data.synthetic import format_answer, synthetic_dataset

TaskLoader = Callable[[DataConfig], "tuple[PromptDataset, PromptDataset]"]


def _synthetic(cfg: DataConfig) -> tuple[PromptDataset, PromptDataset]:
    return synthetic_dataset(cfg, "train"), synthetic_dataset(cfg, "eval")


TASKS: dict[str, TaskLoader] = {"synthetic": _synthetic}


def task_names() -> list[str]:
    return sorted(TASKS)


def load_task(cfg: DataConfig) -> tuple[PromptDataset, PromptDataset]:
    """(train, held-out) prompt sets of the task `cfg.name`; an unknown name lists the known ones."""
    if cfg.name not in TASKS:
        raise KeyError(f"data.name={cfg.name!r} is unknown: {suggest(cfg.name, TASKS)}")
    return TASKS[cfg.name](cfg)


def task_check_texts(cfg: DataConfig) -> list[str]:
    """Texts of the task that every agent's tokenizer must round-trip exactly (checked at load time)."""
    texts = []
    for dataset in load_task(cfg):
        for example in list(dataset)[:32]:
            texts += [example.prompt, format_answer(example.gold)]
    return texts
