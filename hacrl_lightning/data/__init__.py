"""Tasks: prompts with gold answers for verifiable rewards. Each task yields `Example` records.

The offline synthetic arithmetic task, and the math benchmarks (MATH, GSM8K, MATH-500, AIME 2025,
AMC23, Minerva, OlympiadBench) from the hub or local jsonl/parquet files, verl's schema included
(`benchmarks.py`). Deliberately not here: batching and rollouts (the DataModule).
"""

from hacrl_lightning.data.benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    PROMPT_TEMPLATE,
    BenchmarkLoadError,
    DataFormatError,
    benchmark_names,
    load_benchmark,
)
from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.data.synthetic import (
    TASK_ALPHABET,
    format_answer,
    synthetic_dataset,
    synthetic_examples,
    task_texts,
)

__all__ = [
    "BENCHMARKS",
    "BenchmarkLoadError",
    "DataFormatError",
    "PAPER_BENCHMARKS",
    "PROMPT_TEMPLATE",
    "benchmark_names",
    "load_benchmark",
    "Example",
    "PromptDataset",
    "TASK_ALPHABET",
    "format_answer",
    "synthetic_dataset",
    "synthetic_examples",
    "task_texts",
]
