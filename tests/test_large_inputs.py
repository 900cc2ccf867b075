"""Huge texts in data files are refused by their length, never tokenized: bounded time and memory.

A 50 MB prompt once took the preflight 564 s and 12.8 GB (a tokenizer over the whole text). Here a
real file with one line of a few megabytes shows the bound (the refusals name the length check that
made them); the timeout marks are hang guards, not timings.
"""

from __future__ import annotations

import json

import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.data.benchmarks import MAX_TEXT_CHARS, DataFormatError, load_benchmark
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.preflight import CHARS_PER_TOKEN_BOUND, check_run

HUGE = "word " * (3 * MAX_TEXT_CHARS // 5)  # 3 MB, three times what a loader reads


def write(path, rows):
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def math_rows(problem: str) -> list[dict]:
    """MATH rows (train: `solution`; MATH-500: `answer`), the second with `problem` as its question."""
    return [{"problem": "What is 1+1?", "solution": "so \\boxed{2}", "answer": "2"},
            {"problem": problem, "solution": "\\boxed{3}", "answer": "3"}]


def preflight_refusal(tmp_path, problem: str) -> list:
    """The preflight's problems for a run on a MATH file whose second row asks `problem`."""
    path = write(tmp_path / "math.jsonl", math_rows(problem))
    cfg, _ = compose_config(["data=math", f"data.train_files=[{path}]", f"data.eval_files=[{path}]",
                             "agents=[tiny_a,tiny_b]", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as info:
        check_run(cfg)
    return info.value.problems


@pytest.mark.timeout(300, method="thread")
def test_preflight_refuses_a_megabyte_prompt_naming_file_row_and_length(tmp_path):
    path = tmp_path / "math.jsonl"
    [problem] = preflight_refusal(tmp_path, HUGE)  # said once, for the file: not once per agent
    assert problem.key == "data.train_files" and problem.value == str(path)  # the key that gave the file
    assert f"{path}, row 2, column 'problem'" in problem.fix and f"{len(HUGE.strip()):,} characters" in problem.fix
    assert "shorten row 2 or drop it" in problem.fix and "max_prompt_len" in problem.fix


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_every_file_type_refuses_an_oversized_text(tmp_path, suffix):
    with pytest.raises(DataFormatError, match=r"row 2, column 'problem': holds 3,000,000 characters"):
        load_benchmark("math_train", [write(tmp_path / f"math{suffix}", math_rows("x" * 3 * MAX_TEXT_CHARS))])
    verl = [{"prompt": [{"role": "user", "content": "y" * (MAX_TEXT_CHARS + 1)}],
             "reward_model": {"ground_truth": "3"}}]
    with pytest.raises(DataFormatError, match=r"row 1, column 'prompt': holds 1,000,001 characters"):
        load_benchmark("math_train", [write(tmp_path / f"verl{suffix}", verl)])
    assert len(load_benchmark("math_train", [write(tmp_path / f"ok{suffix}", math_rows("z" * MAX_TEXT_CHARS))])) == 2


@pytest.mark.timeout(300, method="thread")
def test_a_prompt_far_past_max_prompt_len_is_refused_by_its_length_alone(tmp_path):
    """Under the loaders' cap but far past what tiny_a's 96 tokens can hold: no tokenizer runs on it."""
    long_prompt = "Compute " + "1+" * 100_000 + "1."
    problems = preflight_refusal(tmp_path, long_prompt)
    assert [p.key for p in problems] == ["agents.tiny_a.max_prompt_len", "agents.tiny_b.max_prompt_len"]
    problem = problems[0]
    chars = len(long_prompt) + len("\n\nPlease reason step by step, and put your final answer within \\boxed{}.")
    assert f"at most {96 * CHARS_PER_TOKEN_BOUND:,} characters" in problem.allowed
    assert f"has {chars:,} characters (it begins 'Compute 1+1+" in problem.fix
    assert "shorten it or drop that problem" in problem.fix
    assert f"max_prompt_len={-(-chars // CHARS_PER_TOKEN_BOUND)} or more" in problem.fix
