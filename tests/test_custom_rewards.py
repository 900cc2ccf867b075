"""Rewards of your own (docs/data.md, "A task of your own"): specs by module or file, weighted sums, the data
row's extra fields, every failure counted and named, code only from the command line, and the docs example
run as written."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.data.benchmarks import examples_from_file, get_benchmark
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.preflight import reward_code_problems
from hacrl_lightning.rewards import Reward, RewardError, RewardPool, exclude_unscorable, load_function

REPO = Path(__file__).resolve().parents[1]

TERMS = '''
import math, time


def half(response, gold):
    return 0.5


def tolerant(response, gold, tolerance):
    return float(abs(float(response) - float(gold)) <= tolerance)


def everything(response, gold, extras):
    return 1.0 if extras.get("unit") == "m" else 0.0


def keywords(response, gold, **fields):
    return 1.0 if fields.get("unit") == "m" else 0.0


def broken(response, gold):
    raise ValueError("no answer here")


def not_a_number(response, gold):
    return math.nan


def too_big(response, gold):
    return 5.0


def slow(response, gold):
    time.sleep(30)
    return 1.0
'''


@pytest.fixture()
def terms(tmp_path):
    path = tmp_path / "terms.py"
    path.write_text(TERMS)
    return path


def test_a_file_and_a_registered_name_sum_with_weights_and_extras_reach_by_name(terms):
    reward = Reward.of("unused", [{"reward": "exact_match", "weight": 1.0}, {"reward": f"{terms}:half", "weight": 0.1},
                                  {"reward": f"{terms}:tolerant", "weight": 1.0}])
    assert reward.names == ("exact_match", "half", "tolerant")
    scored = reward("\\boxed{3}", "3", {"tolerance": 0.5})  # exact_match reads the box; tolerant the raw text
    assert scored.failures == (("tolerant", "raised ValueError: could not convert string to float: '\\\\boxed{3}'"),)
    assert scored.parts == (1.0, 0.5, 0.0) and scored.total == pytest.approx(1.0 + 0.05)
    scored = reward("3.2", "3", {"tolerance": 0.5})
    assert scored.parts == (0.0, 0.5, 1.0) and scored.total == pytest.approx(1.05) and not scored.failures


def test_extras_reach_a_function_as_a_dict_or_as_keywords_and_a_missing_field_fails_the_item(terms):
    for name in ("everything", "keywords"):
        reward = Reward.of(f"{terms}:{name}")
        assert reward("x", "y", {"unit": "m"}).total == 1.0
        assert reward("x", "y", {"unit": "s"}).total == 0.0
    scored = Reward.of(f"{terms}:tolerant")("3", "3", {"unit": "m"})
    assert scored.total == 0.0 and "the example has no field 'tolerance'" in scored.failures[0][1]


def test_a_term_that_raises_or_returns_nan_or_out_of_range_scores_zero_counted_and_named(terms, caplog):
    reward = Reward.of("", [{"reward": f"{terms}:{name}", "weight": 1.0}
                            for name in ("broken", "not_a_number", "too_big", "half")])
    with caplog.at_level(logging.WARNING), RewardPool(reward, workers=0, timeout_s=5) as pool:
        assert pool.score(["a", "b"], ["1", "2"], [{}, {}]) == [0.5, 0.5]
    assert pool.stats["term_failures"] == 6 and sorted(pool.term_failures) == ["broken", "not_a_number", "too_big"]
    assert pool.parts == [(0.0, 0.0, 0.0, 0.5)] * 2
    assert "nan" in pool.term_failures["not_a_number"][0] and "[-1, 1]" in pool.term_failures["too_big"][0]
    assert "reward broken: item 1 raised ValueError: no answer here; it scores 0.0" in caplog.text


@pytest.mark.slow
def test_a_term_that_hangs_is_stopped_by_the_worker_timeout_and_scores_zero(terms):
    reward = Reward.of("", [{"reward": f"{terms}:slow", "weight": 1.0}])
    with RewardPool(reward, workers=1, timeout_s=0.5) as pool:
        assert pool.score(["a"], ["1"], [{}]) == [0.0]
    assert pool.failures == {0: "timeouts"}


def test_a_reward_file_in_a_worker_process_scores_as_in_process(terms):
    reward = Reward.of("", [{"reward": f"{terms}:tolerant", "weight": 1.0}, {"reward": "exact_match", "weight": 0.5}])
    items = (["1.0", "\\boxed{2}", "9"], ["1", "2", "3"], [{"tolerance": 0.1}, {"tolerance": 0.1}, {"tolerance": 1}])
    with RewardPool(reward, workers=0, timeout_s=5) as serial, RewardPool(reward, workers=1, timeout_s=20) as pooled:
        assert pooled.score(*items) == serial.score(*items) == [1.0, 0.5, 0.0]
        assert pooled.parts == serial.parts


def test_unknown_module_function_or_file_names_what_was_looked_for_and_where(terms, tmp_path):
    with pytest.raises(RewardError, match=r"no module 'no_such_module_here' can be imported"):
        load_function("no_such_module_here:fn")
    with pytest.raises(RewardError, match=r"has no function 'tolerent'; did you mean 'tolerant'"):
        load_function(f"{terms}:tolerent")
    with pytest.raises(RewardError, match=rf"no file {re.escape(str(tmp_path / 'nope.py'))}"):
        load_function(f"{tmp_path / 'nope.py'}:fn")
    (problem,) = reward_code_problems([("data.rewards[1].reward", "math:nonexistent_fn")])
    assert problem.key == "data.rewards[1].reward" and "module math has no function" in problem.fix
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half written')\n")
    with pytest.raises(RewardError, match=r"importing .*broken.py raised RuntimeError: half written; fix the file"):
        load_function(f"{broken}:fn")


def test_a_function_of_the_running_script_is_refused_the_workers_could_not_import_it():
    with pytest.raises(RewardError, match="a function of the script that is running cannot be imported"):
        load_function("__main__:anything")


def test_negative_weights_and_weights_that_sum_to_zero_are_refused_with_the_key():
    with pytest.raises(ConfigError) as info:
        compose_config(["data.rewards=[{reward: exact_match, weight: -1.0}, {reward: math_verify, weight: 2.0}]"])
    assert [p.key for p in info.value.problems] == ["data.rewards[0].weight"]
    with pytest.raises(ConfigError) as info:
        compose_config(["data.rewards=[{reward: exact_match, weight: 0.0}]"])
    assert [p.key for p in info.value.problems] == ["data.rewards"]
    with pytest.raises(ConfigError) as info:
        compose_config(["data.rewards=[{reward: exact_mtch}]"])
    assert info.value.problems[0].key == "data.rewards[0].reward" and "exact_match" in info.value.problems[0].allowed


def test_a_reward_that_runs_code_is_taken_from_the_command_line_only(terms, tmp_path):
    (tmp_path / "experiment").mkdir()  # somebody's experiment naming code to run
    (tmp_path / "experiment" / "theirs.yaml").write_text(f"# @package _global_\ndata:\n  reward: '{terms}:half'\n")
    with pytest.raises(ConfigError) as info:
        compose_config([f"hydra.searchpath=[file://{tmp_path}]", "experiment=theirs"])
    (problem,) = info.value.problems
    assert problem.key == "data.reward" and "data.reward=" in problem.fix and "to the command line" in problem.fix
    cfg, _ = compose_config([f"hydra.searchpath=[file://{tmp_path}]", "experiment=theirs", f"data.reward={terms}:half"])
    assert cfg.data.reward == f"{terms}:half"


def test_a_data_files_other_fields_travel_with_each_example(tmp_path):
    verl = tmp_path / "verl.jsonl"
    verl.write_text(json.dumps({"prompt": "1+1?", "reward_model": {"ground_truth": "2"}, "tolerance": 0.1,
                                "extra_info": {"split": "train"}}) + "\n")
    (example,) = examples_from_file(get_benchmark("math_train"), verl)
    assert example.extras == {"tolerance": 0.1, "extra_info": {"split": "train"}}
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"problem": "1+1?", "answer": "2", "unit": "m"}) + "\n")
    (example,) = examples_from_file(get_benchmark("math500"), own)
    assert example.extras == {"unit": "m"} and example.gold == "2"
    assert exclude_unscorable([example], f"{own}:anything", what="x") == [example]  # code checks no gold


def _docs_example() -> tuple[dict[str, str], str]:
    """The files and the command of docs/data.md's "A task of your own", as written there."""
    text = (REPO / "docs" / "data.md").read_text()
    section = text[text.index("## A task of your own"):]
    files = dict(re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", section, flags=re.S))
    command = re.search(r"<!-- command -->\n```bash\n(.*?)```", section, flags=re.S).group(1)
    return files, command.replace("\\\n", " ")


@pytest.mark.slow
def test_the_docs_example_of_a_task_of_your_own_runs_as_written(tmp_path, zoo_cache):
    """A user's reward from a file outside the package, summed with math_verify at weights 1.0 and 0.1, trains
    the default pair for 3 steps on a data file whose `tolerance` field reaches the reward; both terms logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files, command = _docs_example()
    assert set(files) == {"my_task/train.jsonl", "my_task/test.jsonl", "my_task/reward.py"}
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    argv = shlex.split(command)
    assert argv[:2] == ["python", "scripts/train.py"]
    env = {**os.environ, "HACRL_ZOO_CACHE": str(zoo_cache)}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *argv[2:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "runs" / "my_task" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    for agent in ("tiny_a", "tiny_b"):
        assert {f"{agent}/reward/math_verify", f"{agent}/reward/within_tolerance", f"{agent}/reward"} <= tags
        assert len(events.Scalars(f"{agent}/reward/within_tolerance")) == 3
    assert events.Scalars("reward/term_failures")[-1].value == 0  # the tolerance reached every call
    summary = json.loads((tmp_path / "runs" / "my_task" / "summary.json").read_text())
    assert summary["steps"] == 3 and not math.isnan(summary["agents"]["tiny_a"]["final"]["acc"])


@pytest.mark.slow
def test_a_reward_that_fails_on_every_response_stops_the_run_in_one_line(terms, tmp_path, zoo_cache):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), f"data.reward={terms}:broken",
                           "trainer.steps=2", "data.prompts_per_step=2", "trainer.mini_batch_prompts=2",
                           "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=2",
                           f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "the reward 'broken' failed on all 8 responses of training step 1 (first: raised ValueError: no answer " \
           "here)" in last, done.stderr[-2000:]


def test_keyword_fields_never_replace_the_response_or_the_gold(terms):
    # a data column named `gold` or `response` reaches **fields of no function: the first two are the answer's
    assert Reward.of(f"{terms}:keywords")("x", "y", {"unit": "m", "gold": "other", "response": "z"}).total == 1.0


def test_a_term_of_data_rewards_set_by_index_on_the_command_line_counts_as_the_command_lines(terms):
    cfg, _ = compose_config([f"data.rewards=[{{reward: exact_match}}]", f"data.rewards.0.reward={terms}:half"])
    assert cfg.data.rewards[0].reward == f"{terms}:half"
