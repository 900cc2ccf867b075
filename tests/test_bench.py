"""The step benchmark in a tiny mode, fixed-length sampling, and one logger write per training step.

No timing is asserted: the benchmark's figures must exist and be positive, and its two paths must
do the same work (equal token counts on the first step, which both start from the same weights).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hacrl_lightning.cli import compose_config

REPO = Path(__file__).resolve().parents[1]

PHASES = ("rollout", "reward", "exchange", "old_logprobs", "update", "diagnostics", "weight_sync", "logging")


@pytest.fixture(scope="module")
def bench(tmp_path_factory, zoo_cache) -> dict:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), "step", "--agents", "tiny_a,tiny_b", "--n", "2",
         "--groups", "2", "--prompts", "2", "--steps", "2", "--warmup", "1", "--headline-repeats", "1",
         "--diagnostics-every", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "framework_over_bare" in result.stdout and "logging" in result.stdout
    return json.loads(out.read_text())


@pytest.mark.slow
def test_bench_json_has_the_headline_figures(bench):
    assert bench["framework_over_bare"] > 0 and bench["framework_over_bare_wall"] > 0
    assert set(bench["phase_share"]) == set(PHASES)
    # `--diagnostics-every 1`: the framework's gradient-share pass on every step, timed apart; the bare loop has none
    row = bench["configs"][0]
    assert all(step["diagnostics"] > 0 for step in row["framework_steps"])
    assert all("diagnostics" not in step for step in row["bare_steps"])
    assert all(share >= 0 for share in bench["phase_share"].values())
    assert sum(bench["phase_share"].values()) == pytest.approx(1.0)
    assert bench["reward_plus_exchange_share"] > 0
    assert bench["headline"] == {"n": 2, "G": 2}


def test_bench_config_rows_are_positive_and_the_paths_do_the_same_work(bench):
    (row,) = bench["configs"]
    assert (row["n"], row["G"], row["prompts"], row["steps_timed"]) == (2, 2, 2, 2)
    for key in ("framework_step_s", "bare_step_s", "framework_cpu_s", "bare_cpu_s", "rollout_tokens_per_s",
                "trained_tokens_per_s", "bare_rollout_tokens_per_s", "bare_trained_tokens_per_s", "max_rss_mb",
                "bare_max_rss_mb", "weights_mb"):
        assert row[key] > 0, key
    for phase in ("rollout", "reward", "exchange", "old_logprobs", "update", "logging"):
        assert row["phase_s"][phase] > 0, phase
        assert row["peak_rss_mb"][phase] > row["weights_mb"], phase
    # every response is exactly max_response_len = 24 tokens: n * P * G * 24 in both paths
    assert row["rollout_tokens"] == row["bare_rollout_tokens"] == 2 * 2 * 2 * 24
    first = row["first_step_tokens"]
    assert first["framework"] == first["bare"]  # same weights, prompts and seeds -> the same texts
    # every learner trains on every response: own ones at 24 tokens, partners' retokenized
    assert first["framework"]["trained_tokens"] > 2 * 2 * 2 * 24
    assert row["reference_copies"] == 0 and row["stray_weight_copies"] == []  # kl_coef = 0: no frozen copy


@pytest.mark.slow
def test_the_null_run_times_the_bare_loop_against_itself(tmp_path):
    """`--null`: pairs of bare-loop processes, the second over the first. Both do the same work, step for step
    (the same seeds, so the same texts and trained tokens): whatever differs between them is the machine's."""
    out = tmp_path / "null.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), "step", "--agents", "tiny_a,tiny_b", "--n", "2",
         "--groups", "2", "--prompts", "2", "--steps", "2", "--warmup", "1", "--headline-repeats", "1", "--null",
         "--interleave", "processes", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bare loop against itself" in result.stdout
    null = json.loads(out.read_text())
    assert null["null"] is True and len(null["repeats"]) == 1 and len(null["bare_step_s"]) == 2
    assert all(s > 0 for s in null["bare_step_s"])
    first, second = null["trained_tokens"]
    assert first == second and len(first) == 3 and min(first) > 0
    spread = null["spread"]["cpu"]
    assert spread["min"] == spread["median"] == spread["max"] == null["repeats"][0]["cpu"] > 0


def _take_turns(gate, side: int, steps: int, log, crash: bool = False) -> None:
    """A benchmark side's step loop without the steps: each step waits for its turn, logs (side, step) at the next
    free place of the shared `log` (the first slot counts them), and hands over."""
    import os

    from hacrl_lightning.bench.step import install_turn, turn

    install_turn(gate, side)
    try:
        for step in range(steps):
            turn().wait(timeout=60)
            with log.get_lock():
                log[0] += 1
                log[log[0]] = 10 * side + step
            if crash and step == 1:
                os._exit(3)  # dies holding the turn, without `finish`: the parent must free the other side
            if step + 1 < steps:
                turn().hand_over()
    finally:
        turn().finish()


@pytest.mark.slow
@pytest.mark.parametrize("crash", [False, True], ids=["both_end", "one_dies"])
def test_lockstep_sides_take_their_steps_in_turn_and_an_ended_side_holds_none_up(crash):
    """`--interleave steps`: two processes' steps strictly alternate, side 0 first; when one side has no steps left,
    or its process died (the parent's `finish(side)`), the other runs the rest of its steps without waiting."""
    from multiprocessing import get_context

    from hacrl_lightning.bench.step import LockStep

    ctx = get_context("spawn")
    gate, log = LockStep(ctx), ctx.Array("i", 16)
    sides = [ctx.Process(target=_take_turns, args=(gate, 0, 5 if crash else 2, log, crash)),
             ctx.Process(target=_take_turns, args=(gate, 1, 4, log))]
    for process in sides:
        process.start()
    sides[0].join(timeout=120)
    if crash:
        assert sides[0].exitcode == 3
        gate.finish(0)  # what `run_pair` does when a side's future fails
    sides[1].join(timeout=120)
    assert [p.exitcode for p in sides] == [3 if crash else 0, 0]
    # both ways side 0 takes two steps (it has two, or dies after its second), and side 1 then runs its last two
    assert log[:log[0] + 1] == [6, 0, 10, 1, 11, 12, 13]


def test_min_new_tokens_forces_full_length_responses(zoo_agents):
    from hacrl_lightning.rollout import SamplingSettings, make_engine

    agent = zoo_agents["tiny_b"]
    engine = make_engine("hf", agent.model, eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id)
    from hacrl_lightning.config import DataConfig
    from hacrl_lightning.data.synthetic import synthetic_examples

    # the task's own prompts: what the agent was warm-started on (on other text it may never stop)
    prompts = agent.encode_prompts([ex.prompt for ex in synthetic_examples(DataConfig(), "eval", 2)])
    free = engine.generate(prompts, SamplingSettings(max_new_tokens=16, n=4, seed=0))
    fixed = engine.generate(prompts, SamplingSettings(max_new_tokens=16, n=4, seed=0, min_new_tokens=16))
    assert any(g.finish_reason == "stop" for g in free)  # the warm-started agent does end answers
    assert [len(g.token_ids) for g in fixed] == [16] * 8
    assert {g.finish_reason for g in fixed} == {"length"}
    assert not any(t in agent.eos_token_ids for g in fixed for t in g.token_ids)


def test_engine_log_probs_can_be_skipped_without_changing_the_tokens(zoo_agents):
    from hacrl_lightning.rollout import SamplingSettings, make_engine
    from hacrl_lightning.rollout.vllm import sampling_params_kwargs

    agent = zoo_agents["tiny_a"]
    engine = make_engine("hf", agent.model, eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id)
    prompts = agent.encode_prompts(["3+4=?", "25+17=?"])
    settings = SamplingSettings(max_new_tokens=12, n=3, seed=5)
    full = engine.generate(prompts, settings)
    bare = engine.generate(prompts, replace(settings, return_logprobs=False))
    assert [g.token_ids for g in bare] == [g.token_ids for g in full]
    assert [g.finish_reason for g in bare] == [g.finish_reason for g in full]
    assert all(len(g.logprobs) == len(g.token_ids) for g in full) and all(g.logprobs == [] for g in bare)
    kwargs = sampling_params_kwargs(replace(settings, return_logprobs=False, min_new_tokens=12), stop_token_ids=[2])
    assert kwargs["logprobs"] is None and kwargs["min_tokens"] == 12 and kwargs["max_tokens"] == 12


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_each_step_is_written_to_the_logger_once_with_the_callbacks_scalars(tmp_path, zoo_cache):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hacrl_lightning.training import train

    cfg, _ = compose_config([
        "trainer.steps=3", "trainer.log_every=1", "data.prompts_per_step=2", "trainer.mini_batch_prompts=2",
        "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false",
        f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    train(cfg)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    step_tags = {"time/weight_sync", "clip/cross_lower_first", "clip/cross_lower_last", "tiny_a/capability",
                 "tiny_b/capability", "tiny_a/loss/total", "time/update"}
    assert step_tags <= tags, step_tags - tags
    for tag in step_tags:
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3], tag  # steps done (docs/training.md)
    assert events.Scalars("clip/cross_lower_first")[0].value == pytest.approx(0.8)  # 1 - delta


def test_every_bench_command_and_console_entry_loads_and_parses_its_arguments(monkeypatch, capsys):
    """The fast lane's cover of `bench.*` and `entry` (their real runs are the slow tests above and the wheel's):
    `hacrl-bench <command> --help` through the console entry, for every command."""
    from hacrl_lightning import entry
    from hacrl_lightning.bench.report import print_table

    for command in ("rollout", "step", "rewards", "exchange"):
        monkeypatch.setattr(sys, "argv", ["hacrl-bench", command, "--help"])
        with pytest.raises(SystemExit) as done:
            entry.bench()
        assert done.value.code == 0 and "usage:" in capsys.readouterr().out
    print_table([{"a": 1.23456, "b": "x"}], ["a", "b"])
    assert capsys.readouterr().out.splitlines() == ["a      b", "1.235  x"]
