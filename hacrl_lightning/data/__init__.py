"""Tasks: prompts with gold answers for verifiable rewards. Each task yields `Example` records.

Only the offline synthetic arithmetic task lives here so far; dataset loaders (MATH, GSM8K, ...)
register beside it later. Deliberately not here: batching and rollouts (the DataModule).
"""

from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.data.synthetic import (
    TASK_ALPHABET,
    format_answer,
    synthetic_dataset,
    synthetic_examples,
    task_texts,
)

__all__ = [
    "Example",
    "PromptDataset",
    "TASK_ALPHABET",
    "format_answer",
    "synthetic_dataset",
    "synthetic_examples",
    "task_texts",
]
