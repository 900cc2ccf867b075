"""Math benchmarks: MATH, GSM8K, MATH-500, AIME 2025, AMC23, Minerva Math and OlympiadBench as `Example`s,
and `synthetic`, the held-out split of the offline arithmetic task (generated, never read).

A `Benchmark` names where a dataset lives on the Hugging Face hub (id, config, split) and how its
columns map to a question and a gold answer (MATH solutions: the boxed answer; GSM8K: the text
after `####`; OlympiadBench: the first entry of `final_answer`). `load_benchmark(name, files)`
reads it with `datasets` from the hub (or the local HF cache), or from local `.jsonl` / `.json` /
`.parquet` files in either the benchmark's own column layout or verl's schema (`prompt` as chat
messages, `reward_model.ground_truth`, `data_source`), detected per file, so data preprocessed for
verl loads unchanged (a UTF-8 byte-order mark at the start of a `.json`/`.jsonl` file is read past). A
malformed file raises `DataFormatError` naming the file, the row, the column and the fix; so does a
ground truth that is not a finite answer (`NaN`, `inf`: a missing value or an overflow). A prompt that
repeats an earlier one (in any of the files) is dropped, the first row kept and the count printed, when
both give the same ground truth, and refused when they do not (`distinct_examples`).

Every question is wrapped in one prompt template (`PROMPT_TEMPLATE`: reason step by step, final
answer in `\\boxed{}`); each agent later puts that text into its own chat template. verl rows are
taken as they are: their prompt already carries its instruction. Deliberately not here: scoring
(`hacrl_lightning.rewards`), sampling and metrics (`hacrl_lightning.evaluation`).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers as numbers_module
import os
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator, Sequence

from hacrl_lightning import hub
from hacrl_lightning.config import DataConfig
from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.data.synthetic import synthetic_examples
from hacrl_lightning.errors import suggest
from hacrl_lightning.rewards.math_verify import boxed_answer

PROMPT_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
"""The one prompt of every math benchmark; `{question}` is the problem statement."""
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
MAX_TEXT_CHARS = 1_000_000
"""Longest question, solution or answer read from a file: about 250,000 tokens at ~4 characters a token,
past any model's context (MATH problems are under 5,000 characters). A longer one is refused at load,
before a tokenizer spends minutes and gigabytes on it."""


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark lives on the hub and how its columns become (question, gold answer)."""

    name: str
    """Registry name (`math500`); also the key of its local files (`files.math500=...`)."""
    title: str
    """Column header in result tables (`MATH-500`)."""
    hub_id: str
    hub_config: str | None
    split: str
    question: str
    """Column holding the problem statement."""
    answer: str
    """Column holding the gold answer (or the solution it is extracted from)."""
    answer_kind: str = "plain"
    """How the gold answer is read: `plain` (the value as text), `boxed` (the boxed answer of a solution: its
    last `\\boxed{}` and the boxes math-verify joins to it, `\\boxed{1} and \\boxed{2}` -> `1,2`), `gsm8k` (the
    text after `####`, thousands separators removed), `first` (first item of a list)."""
    paper_samples: int = 1
    """Samples per problem under the paper's protocol: 1 (avg@1) everywhere, 30 (best@30) on AIME 2025."""
    size: int = 0
    """Problems in the hub split (for documentation and sanity messages)."""
    reward: str = "math_verify"
    """The reward that scores it by default: the one its training task uses."""


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("math_train", "MATH (train)", "DigitalLearningGmbH/MATH-lighteval", "default", "train",
              "problem", "solution", "boxed", size=7500),
    Benchmark("math", "MATH", "DigitalLearningGmbH/MATH-lighteval", "default", "test",
              "problem", "solution", "boxed", size=5000),
    Benchmark("gsm8k_train", "GSM8K (train)", "openai/gsm8k", "main", "train", "question", "answer", "gsm8k",
              size=7473),
    Benchmark("gsm8k", "GSM8K", "openai/gsm8k", "main", "test", "question", "answer", "gsm8k", size=1319),
    Benchmark("math500", "MATH-500", "HuggingFaceH4/MATH-500", None, "test", "problem", "answer", size=500),
    Benchmark("aime2025", "AIME25", "math-ai/aime25", None, "test", "problem", "answer", paper_samples=30, size=30),
    Benchmark("amc23", "AMC23", "math-ai/amc23", None, "test", "question", "answer", size=40),
    Benchmark("minerva", "Minerva", "math-ai/minervamath", None, "test", "question", "answer", size=272),
    Benchmark("olympiadbench", "OlympiadBench", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train",
              "question", "final_answer", "first", size=674),
    Benchmark("synthetic", "Synthetic", "", None, "eval", "question", "answer", size=DataConfig().eval_size,
              reward=DataConfig().reward),
)}
SYNTHETIC = "synthetic"
"""Not on the hub: the held-out split of `data=synthetic` (the demo's task), generated offline with
`DataConfig`'s defaults and scored by its reward, so a score here is the training's held-out figure."""
PAPER_BENCHMARKS = ("math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiadbench")
"""The seven evaluation benchmarks of the paper, in its table order."""


class DataFormatError(ValueError):
    """A local data file that cannot be read; the message names the file, row, column and the fix."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str, *, row: int | None = None,
                 column: str | None = None):
        self.path, self.row, self.column = str(path), row, column
        where = str(path) + (f", row {row}" if row is not None else "") + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class BenchmarkLoadError(RuntimeError):
    """A benchmark that cannot be fetched from the hub; the message says how to use a local file instead."""


def benchmark_names() -> list[str]:
    return sorted(BENCHMARKS)


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise KeyError(f"benchmark {name!r} is unknown: {suggest(name, BENCHMARKS)}")
    return BENCHMARKS[name]


# ---------------------------------------------------------------------------------------------------
# rows of local files


def read_rows(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, record) of a `.jsonl` (one object a line), `.json` (a list) or `.parquet` file."""
    path = Path(path)
    if path.suffix not in FILE_SUFFIXES:
        raise DataFormatError(path, f"unsupported file type {path.suffix!r}",
                              f"give a file ending in one of {list(FILE_SUFFIXES)}")
    if not path.is_file():
        raise DataFormatError(path, "no such file", "check the path (relative paths start at the working directory)")
    if path.suffix == ".parquet":
        yield from enumerate(_parquet_records(path), start=1)
    elif path.suffix == ".json":
        try:
            records = json.loads(_utf8(path, path.read_bytes()))
        except json.JSONDecodeError as err:
            raise DataFormatError(path, f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})",
                                  "a .json file must hold one list of objects; use .jsonl for one object a line",
                                  ) from None
        if not isinstance(records, list):
            raise DataFormatError(path, f"holds a {type(records).__name__}, not a list of records",
                                  "write a JSON list of objects, or one object per line in a .jsonl file")
        for row, record in enumerate(records, start=1):
            yield row, _as_record(path, row, record)
    else:
        with path.open("rb") as handle:
            for row, raw in enumerate(handle, start=1):
                line = _utf8(path, raw, row=row)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataFormatError(path, f"line {row} is not valid JSON ({err.msg} at character {err.colno})",
                                          f"make line {row} one JSON object (or delete it)", row=row) from None
                yield row, _as_record(path, row, record)


def _utf8(path: Path, data: bytes, *, row: int | None = None) -> str:
    """`data` (a whole file, or its line `row`) as text; a byte-order mark is read past. DataFormatError naming
    the line and the byte when it is not UTF-8."""
    try:
        return data.decode("utf-8-sig" if row in (None, 1) else "utf-8")
    except UnicodeDecodeError as err:
        line = row if row is not None else data.count(b"\n", 0, err.start) + 1
        raise DataFormatError(path, f"line {line} is not UTF-8 (byte {data[err.start:err.start + 1]!r}: {err.reason})",
                              "save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 old > new", row=line) from None


def _parquet_records(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        raise DataFormatError(path, f"not a readable parquet file ({type(err).__name__}: {str(err).splitlines()[0]})",
                              "rewrite it, e.g. datasets.Dataset.from_list(rows).to_parquet(path)") from None


def _as_record(path: Path, row: int, record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise DataFormatError(path, f"holds a {type(record).__name__}, not an object with named columns",
                              "write each record as a JSON object, e.g. {\"problem\": ..., \"answer\": ...}", row=row)
    return record


# ---------------------------------------------------------------------------------------------------
# records -> examples


def is_verl_record(record: dict[str, Any]) -> bool:
    """verl's schema: a `prompt` of chat messages and a `reward_model` holding the `ground_truth`."""
    return "prompt" in record and "reward_model" in record


def _column(path, row: int, record: dict[str, Any], column: str, layout: str) -> Any:
    if column not in record:
        raise DataFormatError(path, f"missing column {column!r} ({layout} layout; columns here: {sorted(record)})",
                              f"add {column!r} to every row, or convert the file to this layout or to verl's schema",
                              row=row, column=column)
    if record[column] is None:
        raise DataFormatError(path, f"column {column!r} is empty (null)", f"fill in {column!r} or drop the row",
                              row=row, column=column)
    return record[column]


def _text(path, row: int, column: str, value: Any, *, numbers: bool = False) -> str:
    if isinstance(value, str) and value.strip():
        return _bounded(path, row, column, value.strip())
    if numbers and isinstance(value, numbers_module.Real) and not isinstance(value, bool):
        return number_text(value)
    kind = "a non-empty string" + (" or a number" if numbers else "")
    raise DataFormatError(path, f"has {type(value).__name__} {str(value)[:60]!r} where {kind} is expected",
                          f"store {column!r} as {kind}", row=row, column=column)


def number_text(value) -> str:
    """A number from a numeric column as an answer is written: an integer without a decimal point, any other
    number in positional notation with the shortest digits that read back as it (1e-05 -> 0.00001). Never an
    exponent: math-verify reads `1e-05` as Euler's e minus 5."""
    if math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    if not math.isfinite(value):
        return str(value)  # refused by `_finite_gold`
    return format(Decimal(str(value)), "f")


def _bounded(path, row: int, column: str, text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        raise DataFormatError(path, f"holds {len(text):,} characters (about {len(text) // 4:,} tokens; at most "
                              f"{MAX_TEXT_CHARS:,} are read, more than any model's context)",
                              f"shorten row {row} or drop it from the file (a prompt must fit the agents' "
                              "max_prompt_len, e.g. 1024 tokens, about 4,000 characters)", row=row, column=column)
    return text


NON_FINITE = frozenset({"nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})
"""Ground truths refused as not an answer (lower case): how a missing value or an overflow is written."""


def _finite_gold(path, row: int, column: str, value: Any, gold: str) -> str:
    """`gold`, unless it is NaN or an infinity (a float, or text such as 'nan'): then DataFormatError."""
    if (isinstance(value, float) and not math.isfinite(value)) or gold.strip().lower() in NON_FINITE:
        raise DataFormatError(path, f"the ground truth is {value!r}, not an answer (a missing value or an overflow "
                              "written as a number)", f"write row {row}'s answer (an infinite one as \\infty), or drop "
                              "the row", row=row, column=column)
    return gold


def gold_answer(spec: Benchmark, value: Any, *, path="<hub>", row: int = 0) -> str:
    """The gold answer of one row from its answer column, as `spec.answer_kind` says (NaN or an infinity
    is refused)."""
    return _finite_gold(path, row, spec.answer, value, _gold_text(spec, value, path=path, row=row))


def _gold_text(spec: Benchmark, value: Any, *, path, row: int) -> str:
    column = spec.answer
    if spec.answer_kind == "first":
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        answer = _text(path, row, column, value, numbers=True)
        return answer[1:-1].strip() if len(answer) > 1 and answer[0] == answer[-1] == "$" else answer
    if spec.answer_kind == "boxed":
        solution = _text(path, row, column, value)
        boxed = boxed_answer(solution) or boxed_answer(solution.replace("\\fbox", "\\boxed"))  # several boxes: one answer
        if boxed is None or not boxed.strip():
            raise DataFormatError(path, "the solution has no \\boxed{...} answer", f"end the {column!r} text with "
                                  "\\boxed{<answer>}, or store the answer itself in verl's reward_model.ground_truth",
                                  row=row, column=column)
        return boxed.strip()
    if spec.answer_kind == "gsm8k":
        text = _text(path, row, column, value, numbers=True)
        if "####" not in text:
            raise DataFormatError(path, "the answer has no '#### <number>' line", "end the answer with "
                                  "'#### 42' (GSM8K's layout)", row=row, column=column)
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    return _text(path, row, column, value, numbers=True)


def make_example(source: str, prompt: str, gold: str, extras: dict[str, Any] | None = None) -> Example:
    """An Example with a stable id: the source name and a hash of the prompt text."""
    return Example(f"{source}-{hashlib.sha256(prompt.encode()).hexdigest()[:12]}", prompt, gold, extras or {})


def benchmark_example(spec: Benchmark, record: dict[str, Any], *, path="<hub>", row: int = 0) -> Example:
    """One row in the benchmark's own layout -> Example (question in `PROMPT_TEMPLATE`)."""
    layout = f"{spec.name}'s"
    question = _text(path, row, spec.question, _column(path, row, record, spec.question, layout))
    gold = gold_answer(spec, _column(path, row, record, spec.answer, layout), path=path, row=row)
    extras = {k: v for k, v in record.items() if k not in (spec.question, spec.answer)} if path != "<hub>" else {}
    return make_example(spec.name, PROMPT_TEMPLATE.format(question=question), gold, extras)


def verl_example(record: dict[str, Any], *, path, row: int, default_source: str) -> Example:
    """One verl row -> Example: the chat messages as they are (a system message goes before the user's)."""
    messages = record["prompt"]
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    shape = "a list of chat messages such as [{\"role\": \"user\", \"content\": \"...\"}]"
    if not isinstance(messages, (list, tuple)) or not messages or \
            not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise DataFormatError(path, f"'prompt' is {type(messages).__name__} {str(messages)[:60]!r}, not {shape}",
                              f"write 'prompt' as {shape}", row=row, column="prompt")
    roles = [m.get("role") for m in messages]
    if roles[-1] != "user" or any(r not in ("system", "user") for r in roles):
        raise DataFormatError(path, f"'prompt' has roles {roles}: only system and user messages, ending with the "
                              "user's, make a single-turn question", "keep one user message (after an optional "
                              "system message)", row=row, column="prompt")
    prompt = _bounded(path, row, "prompt", "\n\n".join(m["content"].strip() for m in messages))
    reward_model = record["reward_model"]
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DataFormatError(path, f"'reward_model' is {str(reward_model)[:60]!r} without a 'ground_truth'",
                              "write reward_model as {\"style\": \"rule\", \"ground_truth\": \"<answer>\"}",
                              row=row, column="reward_model.ground_truth")
    truth = reward_model["ground_truth"]
    gold = _finite_gold(path, row, "reward_model.ground_truth", truth,
                        _text(path, row, "reward_model.ground_truth", truth, numbers=True))
    source = record.get("data_source") or default_source
    extras = {k: v for k, v in record.items() if k not in ("prompt", "reward_model")}
    return make_example(str(source).replace("/", "_"), prompt, gold, extras)


def examples_from_file(spec: Benchmark, path: str | os.PathLike) -> list[Example]:
    """Every row of a local file in `spec`'s own layout or verl's schema (decided by the first row)."""
    return [example for _, example in _numbered_examples(spec, path)]


def _numbered_examples(spec: Benchmark, path: str | os.PathLike) -> list[tuple[int, Example]]:
    """(row number, Example) of every row of a local file (`examples_from_file`)."""
    examples: list[tuple[int, Example]] = []
    verl = None
    for row, record in read_rows(path):
        if verl is None:
            verl = is_verl_record(record)
        if verl:
            for column in ("prompt", "reward_model"):
                _column(path, row, record, column, "verl's")
            examples.append((row, verl_example(record, path=path, row=row, default_source=spec.name)))
        else:
            examples.append((row, benchmark_example(spec, record, path=path, row=row)))
    if not examples:
        raise DataFormatError(path, "holds no rows", "give a file with at least one problem")
    return examples


def distinct_examples(rows: Sequence[tuple[str, int, Example]], *, name: str, files: bool = True,
                      report=lambda line: print(line, file=sys.stderr)) -> list[Example]:
    """The examples of `rows` (file, row number, Example) with each prompt id once. A prompt that repeats an
    earlier one with the same ground truth is dropped (the first row kept) and `report`ed with a count; one
    with another ground truth raises DataFormatError naming both rows and both answers (`files`: the user's
    own files; a hub dataset, which the user cannot edit, keeps the first and reports the other answer)."""
    first: dict[str, tuple[str, int, Example]] = {}
    dropped: list[str] = []
    for path, row, example in rows:
        if example.prompt_id not in first:
            first[example.prompt_id] = (path, row, example)
            continue
        seen = first[example.prompt_id]
        if seen[2].gold != example.gold and not files:
            dropped.append(f"row {row} = row {seen[1]}, its ground truth {example.gold!r} dropped for {seen[2].gold!r}")
            continue
        if seen[2].gold != example.gold:
            raise DataFormatError(path, f"repeats the prompt of {seen[0]}, row {seen[1]}, with another ground truth "
                                  f"({example.gold!r} here, {seen[2].gold!r} there)", "keep the row with the right "
                                  "answer and delete the other (a prompt has one answer)", row=row)
        dropped.append(f"{Path(path).name} row {row} = {Path(seen[0]).name} row {seen[1]}" if files else
                       f"row {row} = row {seen[1]}")
    if dropped:
        listed = ", ".join(dropped[:5]) + (f", ... ({len(dropped) - 5} more)" if len(dropped) > 5 else "")
        same = " with the same ground truth" if files else ""
        report(f"data {name}: dropped {len(dropped)} repeated prompt(s){same}, the first row of each kept ({listed}); "
               f"{len(first)} distinct prompts remain")
    return [example for _, _, example in first.values()]


# ---------------------------------------------------------------------------------------------------
# the hub


def hub_fix(spec: Benchmark) -> str:
    """How to use a benchmark without the hub: download its files (the installed CLI's command) and give them."""
    local = f"/data/{spec.name}"
    return (f"download it where the hub is reachable (`{hub.download_hint(spec.hub_id, local, repo_type='dataset')}`), "
            f"copy the directory here and give its {spec.split!r} split's .parquet file(s) as local files "
            f"(evaluate.py: files.{spec.name}=...; training: data.train_files / data.eval_files); with a cached "
            "copy, set HF_HUB_OFFLINE=1")


def examples_from_hub(spec: Benchmark) -> list[Example]:
    """The benchmark's hub split (from the local HF cache when HF_HUB_OFFLINE=1)."""
    fix = hub_fix(spec)
    why = None if hub.offline(hub.DATASET_OFFLINE) else hub.probe(spec.hub_id, repo_type="dataset")
    if why is not None:
        raise BenchmarkLoadError(f"benchmark {spec.name!r}: the hub dataset {spec.hub_id!r} is unreachable ({why}). "
                                 f"Fix: {fix}")
    import datasets

    try:
        rows = datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.split)
    except Exception as err:
        raise BenchmarkLoadError(f"benchmark {spec.name!r}: cannot load {spec.hub_id!r} (config {spec.hub_config!r}, "
                                 f"split {spec.split!r}): {type(err).__name__}: {str(err).splitlines()[0][:300]}. "
                                 f"Fix: {fix}") from None
    where = f"{spec.hub_id} ({spec.split})"
    return distinct_examples([(where, row, benchmark_example(spec, record, path=where, row=row))
                              for row, record in enumerate(rows, start=1)], name=spec.name, files=False)


def load_benchmark(name: str, files: Sequence[str | os.PathLike] = (), *, limit: int | None = None) -> PromptDataset:
    """Benchmark `name` from local `files` (its own layout or verl's, per file) or, without files, the hub.

    `limit` keeps the first `limit` problems. Raises KeyError (unknown name), DataFormatError (a
    malformed file) or BenchmarkLoadError (hub unreachable; the message says how to use a file).
    """
    spec = get_benchmark(name)
    if name == SYNTHETIC:
        if files:
            raise ValueError(f"benchmark {name!r} is generated, not read from files ({list(files)}). "
                             f"Fix: drop files.{name}")
        examples = synthetic_examples(DataConfig(), "eval")
    elif files:
        examples = distinct_examples([(str(path), row, ex) for path in files
                                      for row, ex in _numbered_examples(spec, path)], name=name)
    else:
        examples = examples_from_hub(spec)
    return PromptDataset(examples[:limit] if limit else examples, name=name)
