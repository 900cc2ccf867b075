"""Task records shared by every task: one `Example` per prompt, and a sized map-style dataset of them.

An `Example` is tokenizer-neutral: the question text (each agent wraps it in its own chat
template) and the gold answer a reward function checks. A dataset holds each prompt id once (the
step sampler draws distinct prompts, and the exchange keys responses by prompt id): a repeated id is
refused (files are deduplicated where they are read, `benchmarks.distinct_examples`). Deliberately
not here: how a task makes its examples (see `synthetic.py` and later loaders) and how they are
batched (the DataModule).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

from torch.utils.data import Dataset


class Example(NamedTuple):
    """One prompt of a verifiable task: `(prompt_id, prompt, gold, extras)`."""

    prompt_id: str
    """Stable id of the prompt (the same question always has the same id)."""
    prompt: str
    """The question text, without any chat template."""
    gold: str
    """The reference answer, as the reward function compares it."""
    extras: Mapping[str, Any] = {}
    """The data file's other fields of this row (test cases, units, a tolerance): they reach a reward function
    that asks for them (`rewards.custom`). Never changed in place."""


class PromptDataset(Dataset):
    """A sized, indexable list of `Example`s (map-style, so Lightning never prefetches rollouts)."""

    def __init__(self, examples: Sequence[Example], *, name: str = "prompts"):
        self.examples = list(examples)
        self.name = name
        first: dict[str, int] = {}
        for index, example in enumerate(self.examples):
            if first.setdefault(example.prompt_id, index) != index:
                raise ValueError(f"{name}: prompt id {example.prompt_id!r} is at positions {first[example.prompt_id]} "
                                 f"and {index}; a dataset holds each prompt once (the step sampler draws distinct "
                                 "prompts, the exchange keys responses by prompt id). Fix: drop the repeated example")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    def __repr__(self) -> str:
        return f"PromptDataset({self.name!r}, {len(self)} examples)"
