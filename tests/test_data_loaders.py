"""Math benchmark loaders: every layout in every file format, verl's schema, tasks, and malformed files.

The fixtures (tests/fixtures/math/, written by make_fixtures.py there) hold problems written for
these tests; the expected gold answers are listed beside the rows in make_fixtures.py.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from hacrl_lightning.config import AgentConfig, DataConfig, TrainConfig
from hacrl_lightning.data.benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    PROMPT_TEMPLATE,
    SYNTHETIC,
    BenchmarkLoadError,
    DataFormatError,
    examples_from_hub,
    load_benchmark,
)
from hacrl_lightning.data.tasks import load_task, task_names
from hacrl_lightning.preflight import validate

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "math"


def _fixture_builder():
    """tests/fixtures/math/make_fixtures.py (a script beside the files it writes), loaded from its path."""
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fx = _fixture_builder()

CASES = [(name, stem) for stem, (_, _, names) in fx.LAYOUTS.items() for name in names]


def test_the_registry_holds_the_papers_seven_benchmarks_and_the_training_sets():
    assert set(PAPER_BENCHMARKS) <= set(BENCHMARKS)
    assert len(PAPER_BENCHMARKS) == 7
    assert {"math_train", "gsm8k_train"} <= set(BENCHMARKS)
    assert BENCHMARKS["math_train"].size == 7500 and BENCHMARKS["math_train"].split == "train"
    assert [BENCHMARKS[b].paper_samples for b in PAPER_BENCHMARKS] == [1, 1, 1, 30, 1, 1, 1]


def test_every_benchmark_has_a_fixture_layout():
    assert {name for name, _ in CASES} == set(BENCHMARKS) - {SYNTHETIC}  # synthetic is generated, never read


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".json"])
@pytest.mark.parametrize("name,stem", CASES, ids=[n for n, _ in CASES])
def test_each_loader_reads_its_fixture_in_every_format(name, stem, suffix, tmp_path):
    rows, gold, _ = fx.LAYOUTS[stem]
    if suffix == ".json":  # a JSON list, written here from the same rows
        path = tmp_path / f"{stem}.json"
        path.write_text(json.dumps(rows))
    else:
        path = FIXTURES / f"{stem}{suffix}"
    spec = BENCHMARKS[name]
    dataset = load_benchmark(name, [path])
    assert len(dataset) == len(rows)
    assert [ex.gold for ex in dataset] == gold
    assert [ex.prompt for ex in dataset] == [PROMPT_TEMPLATE.format(question=row[spec.question]) for row in rows]
    assert all(ex.prompt.endswith("Please reason step by step, and put your final answer within \\boxed{}.")
               for ex in dataset)
    assert all(ex.prompt_id.startswith(f"{name}-") for ex in dataset)
    assert len({ex.prompt_id for ex in dataset}) == len(rows)


@pytest.mark.parametrize("name,stem", CASES, ids=[n for n, _ in CASES])
def test_jsonl_and_parquet_give_identical_examples(name, stem):
    assert list(load_benchmark(name, [FIXTURES / f"{stem}.jsonl"])) == \
        list(load_benchmark(name, [FIXTURES / f"{stem}.parquet"]))


def test_gold_answers_are_extracted_per_layout():
    # MATH: last \boxed{} with nested braces, and \fbox; GSM8K: after ####, no thousands separator;
    # AMC: numbers stored as floats; OlympiadBench: first list item without $...$
    assert fx.MATH_GOLD == [ex.gold for ex in load_benchmark("math", [FIXTURES / "math.jsonl"])]
    assert [ex.gold for ex in load_benchmark("gsm8k", [FIXTURES / "gsm8k.parquet"])] == ["48", "1500", "150"]
    assert [ex.gold for ex in load_benchmark("amc23", [FIXTURES / "amc23.parquet"])] == ["55", "28", "0.6"]
    assert [ex.gold for ex in load_benchmark("olympiadbench", [FIXTURES / "olympiadbench.parquet"])] == \
        ["\\frac{1}{4}", "97", "3,-3"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_verl_schema_loads_unchanged(suffix):
    dataset = load_benchmark("math500", [FIXTURES / f"verl{suffix}"])
    assert [ex.gold for ex in dataset] == fx.VERL_GOLD
    first, second = dataset[0], dataset[1]
    assert first.prompt == fx.VERL_ROWS[0]["prompt"][0]["content"]  # its own instruction, no second template
    assert second.prompt == "You are a careful mathematician.\n\n" + fx.VERL_ROWS[1]["prompt"][1]["content"]
    assert first.prompt_id.startswith("DigitalLearningGmbH_MATH-lighteval-")
    assert list(dataset) == list(load_benchmark("math500", [FIXTURES / "verl.jsonl"]))


def test_several_files_are_concatenated_and_limit_keeps_the_first():
    both = load_benchmark("math500", [FIXTURES / "math500.jsonl", FIXTURES / "verl.parquet"])
    assert [ex.gold for ex in both] == fx.MATH500_GOLD + fx.VERL_GOLD
    assert list(load_benchmark("math500", [FIXTURES / "math500.jsonl"], limit=2)) == list(both)[:2]


def test_math_and_gsm8k_tasks_read_train_and_eval_files():
    assert {"synthetic", "math", "gsm8k"} <= set(task_names())
    cfg = DataConfig(name="math", train_files=[str(FIXTURES / "math.parquet"), str(FIXTURES / "verl.parquet")],
                     eval_files=[str(FIXTURES / "math500.jsonl")], eval_size=2)
    train, held_out = load_task(cfg)
    assert [ex.gold for ex in train] == fx.MATH_GOLD + fx.VERL_GOLD
    assert [ex.gold for ex in held_out] == fx.MATH500_GOLD[:2]
    train, held_out = load_task(replace(cfg, name="gsm8k", train_files=[str(FIXTURES / "gsm8k.jsonl")],
                                        eval_files=[str(FIXTURES / "gsm8k.parquet")], eval_size=10))
    assert [ex.gold for ex in train] == [ex.gold for ex in held_out] == fx.GSM8K_GOLD


def test_a_math_task_config_validates():
    agents = {"tiny_a": AgentConfig(model="zoo:tiny_a"), "tiny_b": AgentConfig(model="zoo:tiny_b")}
    cfg = TrainConfig(agents=agents, data=DataConfig(name="math", reward="exact_match", prompts_per_step=4))
    cfg.trainer.mini_batch_prompts = 2
    assert validate(cfg) is cfg


# --- malformed files: the error names the file, the row, the column and the fix -------------------


@pytest.mark.parametrize("name,file,row,column,words", [
    ("math500", "bad_json.jsonl", 2, None, "not valid JSON"),
    ("math500", "missing_column.jsonl", 2, "answer", "missing column 'answer'"),
    ("amc23", "wrong_type.jsonl", 2, "question", "has list"),
    ("amc23", "wrong_type.parquet", 2, "question", "is empty (null)"),
    ("math500", "bad_verl.parquet", 2, "reward_model.ground_truth", "without a 'ground_truth'"),
    ("math", "no_boxed.jsonl", 2, "solution", "no \\boxed{...} answer"),
])
def test_a_malformed_file_names_file_row_and_column(name, file, row, column, words):
    path = FIXTURES / file
    with pytest.raises(DataFormatError) as info:
        load_benchmark(name, [path])
    err = info.value
    assert (err.path, err.row, err.column) == (str(path), row, column)
    message = str(err)
    assert message.startswith(f"{path}, row {row}")
    assert words in message and "Fix: " in message
    if column:
        assert f"column {column!r}" in message


def test_a_bad_verl_prompt_is_named(tmp_path):
    path = tmp_path / "verl_bad.jsonl"
    good = fx.VERL_ROWS[0]
    rows = [good, {**good, "prompt": 42}, {**good, "prompt": [{"role": "assistant", "content": "hi"}]}]
    for i, bad in enumerate(rows[1:], start=2):
        path.write_text("".join(json.dumps(r) + "\n" for r in (good, bad)))
        with pytest.raises(DataFormatError, match=r"row 2, column 'prompt'") as info:
            load_benchmark("math500", [path])
        assert info.value.row == 2


@pytest.mark.parametrize("content,suffix,words", [
    ("a,b\n1,2\n", ".csv", "unsupported file type '.csv'"),
    ('{"problem": "x"}', ".json", "not a list of records"),
    ('[{"problem": "x", "answer": "1"}, [1, 2]]', ".json", "row 2: holds a list"),
    ("not parquet at all", ".parquet", "not a readable parquet file"),
    ("", ".jsonl", "holds no rows"),
])
def test_unreadable_files_say_why(tmp_path, content, suffix, words):
    path = tmp_path / f"data{suffix}"
    path.write_text(content)
    with pytest.raises(DataFormatError, match="Fix: ") as info:
        load_benchmark("math500", [path])
    assert words in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_and_an_unknown_benchmark_are_named(tmp_path):
    with pytest.raises(DataFormatError, match="no such file"):
        load_benchmark("math500", [tmp_path / "absent.parquet"])
    with pytest.raises(KeyError, match="did you mean 'math500'"):
        load_benchmark("math5000")


def test_an_unreachable_hub_dataset_says_how_to_use_a_local_file():
    spec = replace(BENCHMARKS["gsm8k"], hub_id="hacrl-lightning-tests/no-such-dataset")
    with pytest.raises(BenchmarkLoadError) as info:
        examples_from_hub(spec)
    message = str(info.value)
    assert "hacrl-lightning-tests/no-such-dataset" in message
    assert "files.gsm8k=" in message and "data.train_files" in message


# --- repeated prompts, non-finite ground truths, a byte-order mark ---------------------------------


def test_a_repeated_prompt_with_the_same_answer_is_dropped_and_counted(tmp_path, capsys):
    path = tmp_path / "repeats.jsonl"
    rows = [*fx.MATH500_ROWS, fx.MATH500_ROWS[0], fx.MATH500_ROWS[2]]  # rows 4 and 5 repeat rows 1 and 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = load_benchmark("math500", [path])
    assert [ex.gold for ex in dataset] == fx.MATH500_GOLD  # each prompt once, the first row of each kept
    assert len({ex.prompt_id for ex in dataset}) == len(dataset) == 3
    assert ("data math500: dropped 2 repeated prompt(s) with the same ground truth, the first row of each kept "
            "(repeats.jsonl row 4 = repeats.jsonl row 1, repeats.jsonl row 5 = repeats.jsonl row 3); "
            "3 distinct prompts remain") in capsys.readouterr().err
    again = load_benchmark("math500", [FIXTURES / "math500.jsonl", FIXTURES / "math500.parquet"])  # a file twice
    assert list(again) == list(load_benchmark("math500", [FIXTURES / "math500.jsonl"]))
    assert "dropped 3 repeated prompt(s)" in capsys.readouterr().err


def test_a_repeated_prompt_with_another_answer_is_refused(tmp_path):
    path = tmp_path / "conflict.jsonl"
    rows = [*fx.MATH500_ROWS, {**fx.MATH500_ROWS[1], "answer": "7"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataFormatError) as info:
        load_benchmark("math500", [path])
    assert info.value.row == 4
    assert str(info.value) == (f"{path}, row 4: repeats the prompt of {path}, row 2, with another ground truth ('7' "
                               "here, '6' there). Fix: keep the row with the right answer and delete the other "
                               "(a prompt has one answer)")


@pytest.mark.parametrize("truth,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
                                         ("NaN", "'NaN'"), ("inf", "'inf'")])
@pytest.mark.parametrize("layout", ["verl", "own"])
def test_a_non_finite_ground_truth_is_refused_naming_file_row_and_value(tmp_path, truth, shown, layout):
    good = fx.VERL_ROWS[0] if layout == "verl" else fx.MATH500_ROWS[0]
    bad = {**good, "reward_model": {"style": "rule", "ground_truth": truth}} if layout == "verl" else \
        {**fx.MATH500_ROWS[1], "answer": truth}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")  # json writes NaN / Infinity for floats
    column = "reward_model.ground_truth" if layout == "verl" else "answer"
    with pytest.raises(DataFormatError) as info:
        load_benchmark("math500", [path])
    assert (info.value.row, info.value.column) == (2, column)
    assert str(info.value).startswith(f"{path}, row 2, column {column!r}: the ground truth is {shown}, not an answer")
    assert "an infinite one as \\infty" in str(info.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_utf8_byte_order_mark_is_read_past(tmp_path, suffix):
    rows = fx.MATH500_ROWS
    text = "".join(json.dumps(r) + "\n" for r in rows) if suffix == ".jsonl" else json.dumps(rows)
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))  # as Windows editors save UTF-8
    assert [ex.gold for ex in load_benchmark("math500", [path])] == fx.MATH500_GOLD
    assert list(load_benchmark("math500", [path])) == list(load_benchmark("math500", [FIXTURES / "math500.jsonl"]))


def test_a_dataset_refuses_a_repeated_prompt_id():
    from hacrl_lightning.data.records import PromptDataset

    examples = list(load_benchmark("math500", [FIXTURES / "math500.jsonl"]))
    with pytest.raises(ValueError, match=r"mine: prompt id 'math500-[0-9a-f]{12}' is at positions 0 and 3; a dataset "
                                         r"holds each prompt once"):
        PromptDataset([*examples, examples[0]], name="mine")


def test_a_hub_split_keeps_the_first_of_a_repeated_prompt_and_says_so():
    from hacrl_lightning.data.benchmarks import distinct_examples

    examples = list(load_benchmark("math500", [FIXTURES / "math500.jsonl"]))
    rows = [("hub", i, ex) for i, ex in enumerate([*examples, examples[1]._replace(gold="7"), examples[0]], start=1)]
    said = []
    assert distinct_examples(rows, name="math500", files=False, report=said.append) == examples  # no error
    assert said == ["data math500: dropped 2 repeated prompt(s), the first row of each kept (row 4 = row 2, its ground "
                    "truth '7' dropped for '6', row 5 = row 1); 3 distinct prompts remain"]
