"""Synthetic verifiable arithmetic: the offline task every agent can be trained and evaluated on.

A problem is an expression of `terms` integers (each uniform over the integers with
`min_digits..max_digits` digits) joined by operators from `ops` (`*` binds tighter than `+`/`-`),
asked as `What is 37 + 5? Put the answer in \\boxed{}.`; the gold answer is the exact integer
value (`42`, possibly negative), and a response is right when its last `\\boxed{...}` equals it.

Train and held-out problems are disjoint for *every* seed and size: a problem is held out when a
hash of its expression falls in one bucket of five, so nothing trained on a train split (the zoo's
warm-start included) is ever a held-out problem. Each split is a deterministic stream of distinct
problems: the first `n` do not depend on how many are drawn, and any prefix is a uniform sample of
the split (so a probe from the train split and the held-out set are equally hard). Deliberately
not here: chat templates (each agent wraps the question in its own) and rewards
(`hacrl_lightning.rewards`).
"""

from __future__ import annotations

import hashlib
import random
import string
from typing import Literal, Sequence

from hacrl_lightning.config import DataConfig
from hacrl_lightning.data.records import Example, PromptDataset

Split = Literal["train", "eval"]
SPLITS = ("train", "eval")

QUESTION = "What is {expression}? Put the answer in \\boxed{{}}."
"""The prompt text; `{expression}` is e.g. `37 + 5`."""
HELDOUT_BUCKETS = 5
"""One bucket in this many (by a hash of the expression) is held out: ~20% of the problem space."""
TASK_ALPHABET = string.ascii_letters + string.digits + " +-*?.:,!=()[]{}\\\n"
"""Every character the task's prompts and answers use (plus a few neighbours), for round-trip tests."""


def worked_answer(example) -> str:
    """A worked answer to a synthetic question, as a few-shot example shows it (`data.few_shot`):
    `37 + 5 = 42. The answer is \\boxed{42}.` (SmolLM2-135M-Instruct answers 25 % of held-out questions after two
    of them, none after two bare `\\boxed{42}`: docs/RESULTS.md)."""
    prefix, suffix = QUESTION.format(expression="\0").split("\0")
    expression = example.prompt[len(prefix):-len(suffix)] if example.prompt.startswith(prefix) else None
    shown = f"{expression} = {example.gold}. " if expression and example.prompt.endswith(suffix) else ""
    return f"{shown}The answer is {format_answer(example.gold)}."


def format_answer(gold: str) -> str:
    """The expected response for a gold answer: `\\boxed{42}`."""
    return f"\\boxed{{{gold}}}"


def is_heldout(expression: str) -> bool:
    """True when the expression belongs to the held-out split (a fixed hash bucket, seed-independent)."""
    digest = hashlib.sha256(expression.encode()).hexdigest()
    return int(digest[:8], 16) % HELDOUT_BUCKETS == 0


def evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """The value of `operands[0] ops[0] operands[1] ...` with `*` before `+`/`-`."""
    products = [operands[0]]
    signs = [1]
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            products[-1] *= value
        else:
            products.append(value)
            signs.append(1 if op == "+" else -1)
    return sum(s * p for s, p in zip(signs, products))


def _operand_range(cfg: DataConfig) -> tuple[int, int]:
    """Smallest and largest operand: every integer with `min_digits..max_digits` digits."""
    return (0 if cfg.min_digits == 1 else 10 ** (cfg.min_digits - 1)), 10**cfg.max_digits - 1


def problem_space(cfg: DataConfig) -> int:
    """How many distinct expressions the difficulty settings allow (both splits together)."""
    low, high = _operand_range(cfg)
    return (high - low + 1) ** cfg.terms * len(set(cfg.ops)) ** (cfg.terms - 1)


def synthetic_examples(cfg: DataConfig, split: Split, size: int | None = None) -> list[Example]:
    """The first `size` distinct problems of `split` (default: `cfg.train_size` / `cfg.eval_size`).

    Raises ValueError, naming the setting to change, when the difficulty settings do not allow
    that many distinct problems in the split.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown: allowed {list(SPLITS)}")
    if size is None:
        size = cfg.train_size if split == "train" else cfg.eval_size
    rng = random.Random(f"hacrl-synthetic/{cfg.seed}/{split}")
    low, high = _operand_range(cfg)
    examples: list[Example] = []
    seen: set[str] = set()
    attempts, limit = 0, 200 * size + 10_000
    while len(examples) < size:
        attempts += 1
        if attempts > limit:
            key = "data.train_size" if split == "train" else "data.eval_size"
            raise ValueError(
                f"{key}={size}: only {len(examples)} distinct {split} problems found (the settings "
                f"min_digits={cfg.min_digits}, max_digits={cfg.max_digits}, terms={cfg.terms}, ops={list(cfg.ops)} "
                f"allow {problem_space(cfg)} problems, ~1/{HELDOUT_BUCKETS} of them held out). "
                f"Fix: lower {key} or widen the task (data.max_digits, data.terms, data.ops)."
            )
        operands = [rng.randint(low, high) for _ in range(cfg.terms)]
        ops = [rng.choice(list(cfg.ops)) for _ in range(cfg.terms - 1)]
        expression = " ".join([str(operands[0])] + [f"{op} {v}" for op, v in zip(ops, operands[1:])])
        if expression in seen or is_heldout(expression) != (split == "eval"):
            continue
        seen.add(expression)
        prompt = QUESTION.format(expression=expression)
        prompt_id = "syn-" + hashlib.sha256(expression.encode()).hexdigest()[:12]
        examples.append(Example(prompt_id, prompt, str(evaluate(operands, ops))))
    return examples


def synthetic_dataset(cfg: DataConfig, split: Split, size: int | None = None) -> PromptDataset:
    """`synthetic_examples` as a sized map-style dataset."""
    return PromptDataset(synthetic_examples(cfg, split, size), name=f"synthetic/{split}")


def task_texts(cfg: DataConfig | None = None, n: int = 16) -> list[str]:
    """Texts the task makes (prompts and boxed answers of both splits): what a tokenizer must round-trip."""
    cfg = cfg or DataConfig()
    examples = synthetic_examples(cfg, "train", n) + synthetic_examples(cfg, "eval", max(1, n // 4))
    return [text for ex in examples for text in (ex.prompt, format_answer(ex.gold))]
