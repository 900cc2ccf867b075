"""RewardPool: per-item timeouts, crash recovery and serial-identical results, on real worker processes.

The fault-injecting reward lives in tests/reward_faults.py so the workers can import it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.rewards import Reward, RewardError, RewardPool, load_function, math_verify_reward
from hacrl_lightning.rewards import pool as pool_module
from hacrl_lightning.rewards.pool import RewardWorkersFailed
from reward_faults import (char_parity, faulty_reward, warm_up_blocks, warm_up_crashes, warm_up_exits,
                           warm_up_sleeps)

REPO = Path(__file__).resolve().parents[1]


def well_behaved(i: int) -> tuple[str, str, float]:
    """(response, gold, reward) of the i-th ordinary item: eight kinds of answers, known verdicts."""
    a = i % 6 + 1  # few distinct items: math-verify's parse cache keeps the test fast
    kinds = [
        (f"so \\boxed{{\\frac{{{a}}}{{{a + 1}}}}}", f"{a}/{a + 1}", 1.0),
        (f"\\boxed{{{a / 4}}}", f"\\frac{{{a}}}{{4}}", 1.0),
        (f"\\boxed{{{a + 1}}}", f"{a}", 0.0),
        (f"\\boxed{{-{a}}}", f"-{a}", 1.0),
        (f"the answer is {a}", f"{a}", 0.0),
        (f"\\boxed{{\\{{{a}, {a + 1}\\}}}}", f"\\{{{a + 1},{a}\\}}", 1.0),
        (f"\\boxed{{({a}, {a + 2}]}}", f"({a},{a + 2})", 0.0),
        (f"Thus $x = {a}$ and \\boxed{{{a}}}", f"{a}", 1.0),
    ]
    return kinds[i % len(kinds)]


ADVERSARIAL = {
    "megabyte_text": "x" * 1_000_000 + " \\boxed{6}",
    "megabyte_box": "\\boxed{" + "1" * 1_000_000 + "}",
    "nested_braces": "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}",
    "power_tower": "\\boxed{9^{9^{9^{9}}}}",                  # refused by math_verify's guards at once
    "symbolic_power": "\\boxed{(x+1)^{99999}}",               # passes the guards; sympy hangs expanding it
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}",
    "empty_box_spam": "\\boxed{}" * 100_000,
}
"""Hostile model output; the gold is 5, so each scores 0.0 whether it finishes or times out."""


@pytest.mark.slow
def test_thousand_responses_with_adversarial_ones_match_a_serial_run(caplog):
    n = 1000
    slots = {name: 37 + 120 * k for k, name in enumerate(ADVERSARIAL)}  # spread through the batch
    items = [well_behaved(i) for i in range(n)]
    for name, index in slots.items():
        items[index] = (ADVERSARIAL[name], "5", 0.0)
    responses, golds, expected = map(list, zip(*items))
    ordinary = [i for i in range(n) if i not in slots.values()]

    serial = [math_verify_reward(responses[i], golds[i]) for i in ordinary]
    assert serial == [expected[i] for i in ordinary]  # the verdicts written above hold

    with caplog.at_level(logging.WARNING), RewardPool(math_verify_reward, workers=2, timeout_s=2.0) as pool:
        scores = pool.score(responses, golds)
    assert len(scores) == n
    assert [scores[i] for i in ordinary] == serial
    assert all(scores[i] == 0.0 for i in slots.values())
    # only hostile items failed; sympy never finishes expanding (x+1)^99999, so that one surely timed out
    assert set(pool.failures) <= set(slots.values())
    assert pool.failures[slots["symbolic_power"]] == "timeouts"
    assert pool.stats["timeouts"] == sum(kind == "timeouts" for kind in pool.failures.values())
    assert pool.stats["crashes"] == pool.stats["errors"] == 0
    assert pool.stats["items"] == n
    assert f"item {slots['symbolic_power']} of the batch timed out after 2 s" in caplog.text
    assert pool._pool is None  # closed by the context manager


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_crashes_and_hangs_score_zero_are_counted_and_the_pool_recovers(caplog):
    responses = ["\\boxed{1}", "CRASH", "\\boxed{2}", "SEGV", "SLEEP", "SPIN", "RAISE", "\\boxed{3}"]
    golds = ["1", "1", "2", "1", "1", "1", "1", "4"]
    with caplog.at_level(logging.WARNING), RewardPool(faulty_reward, workers=2, timeout_s=1.0) as pool:
        assert pool.score(responses, golds) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        assert pool.failures == {1: "crashes", 3: "crashes", 4: "timeouts", 5: "timeouts", 6: "errors"}
        assert pool.stats == {"items": 8, "timeouts": 2, "crashes": 2, "errors": 1, "term_failures": 0}
        assert "item 1 of the batch crashed its worker (exit code 3)" in caplog.text
        assert "item 3 of the batch crashed its worker (exit code -11)" in caplog.text  # SIGSEGV
        assert "item 5 of the batch timed out after 1 s" in caplog.text
        assert "item 6 of the batch raised ValueError('bad item')" in caplog.text
        # the replaced workers score the next batch, and the counters keep adding up
        assert pool.score(["\\boxed{7}"] * 6 + ["CRASH"], ["7"] * 6 + ["7"]) == [1.0] * 6 + [0.0]
        assert pool.failures == {6: "crashes"}
        assert pool.stats == {"items": 15, "timeouts": 2, "crashes": 3, "errors": 1, "term_failures": 0}
    pool.close()  # idempotent


def test_in_process_mode_scores_the_same_and_counts_errors():
    pool = RewardPool(faulty_reward, workers=0, timeout_s=1.0)
    assert pool.score(["\\boxed{1}", "RAISE", "\\boxed{2}"], ["1", "1", "3"]) == [1.0, 0.0, 0.0]
    assert pool.failures == {1: "errors"} and pool.stats["errors"] == 1
    assert pool._pool is None  # no worker was started
    assert RewardPool(faulty_reward, workers=2, timeout_s=1.0).score([], []) == []  # and none for nothing
    with pytest.raises(ValueError, match="2 responses but 1 gold answers"):
        pool.score(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"workers=-1 must be >= 0"):
        RewardPool(faulty_reward, workers=-1, timeout_s=1.0)
    with pytest.raises(ValueError, match=r"timeout_s=0 must be > 0"):
        RewardPool(faulty_reward, workers=1, timeout_s=0)


def test_config_keys_are_validated_together():
    with pytest.raises(ConfigError) as info:
        compose_config(["data.reward_workers=-1", "data.reward_timeout_s=0"])
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"data.reward_workers", "data.reward_timeout_s"}
    assert "0 scores in-process" in problems["data.reward_workers"].fix
    cfg, _ = compose_config(["data.reward=math_verify", "data.reward_workers=2", "data.reward_timeout_s=2.5"])
    assert (cfg.data.reward, cfg.data.reward_workers, cfg.data.reward_timeout_s) == ("math_verify", 2, 2.5)


MATH_CONFIGS = [["data=math"], ["data=gsm8k"], *[[f"experiment={path.stem}"] for path in
                                                  sorted((REPO / "configs" / "experiment").glob("paper_*.yaml"))]]


@pytest.mark.slow
@pytest.mark.parametrize("overrides", MATH_CONFIGS, ids=lambda overrides: overrides[0])
def test_every_math_config_scores_model_output_in_the_pool(overrides):
    """math-verify on model output can hang sympy; only the pool's timeout bounds that (the guards are heuristics)."""
    cfg, _ = compose_config(overrides)
    assert cfg.data.reward == "math_verify" and cfg.data.reward_workers >= 1


def test_the_synthetic_default_scores_exact_match_in_process_and_user_code_in_a_worker(tmp_path):
    cfg, _ = compose_config([])
    assert (cfg.data.name, cfg.data.reward, cfg.data.reward_workers) == ("synthetic", "exact_match", None)
    from hacrl_lightning.rewards import Reward

    assert RewardPool(Reward.of("exact_match"), workers=None, timeout_s=1).workers == 0
    code = tmp_path / "mine.py"
    code.write_text("def fn(response, gold):\n    return 1.0\n")
    mixed = Reward.of("", [{"reward": "exact_match"}, {"reward": f"{code}:fn"}])
    assert RewardPool(mixed, workers=None, timeout_s=1).workers == 1  # user code: isolated by default
    assert RewardPool(mixed, workers=0, timeout_s=1).workers == 0  # in-process only when asked for


def test_datamodule_scores_rollouts_and_evaluation_through_the_pool(zoo_cache):
    from hacrl_lightning.training import load_agents, make_datamodule

    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "data.reward=test_char_parity", "data.reward_workers=1",
                             "rollout.group_size=3", f"zoo_cache={zoo_cache}"])
    dm = make_datamodule(cfg, load_agents(cfg))
    dm.setup("fit")
    examples = list(dm.train_set)[:2]
    rolled = dm.rollout(examples, step=0)
    expected = [char_parity(r.response, None) for r in rolled.rollouts]  # in-process, same order
    assert rolled.rewards.flatten().tolist() == expected
    assert 0 < sum(expected) < len(expected)  # a mix, so order mistakes would show
    assert dm.reward_pool.stats["items"] == 2 * 2 * 3 and dm.reward_pool._pool is not None
    scores = dm.evaluate(limit=4)
    assert set(scores) == {"tiny_a", "tiny_b"} and all(0.0 <= row["acc"] <= 1.0 for row in scores.values())
    assert dm.reward_pool.stats["items"] == 12 + 2 * 4
    dm.teardown("fit")
    assert dm.reward_pool._pool is None
    assert torch.equal(rolled.rewards, torch.tensor(expected).view(2, 2, 3))


def test_a_training_step_logs_reward_failures_and_teardown_ends_the_workers(tmp_path, zoo_cache):
    from lightning.pytorch import Callback

    from hacrl_lightning.training import train

    class Seen(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            self.metrics = dict(pl_module.last_metrics)
            self.pool = trainer.datamodule.reward_pool

    seen = Seen()
    cfg, _ = compose_config([
        "agents=[tiny_a,tiny_b]", "trainer.steps=1", "data.prompts_per_step=2", "trainer.mini_batch_prompts=2",
        "rollout.group_size=2", "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false",
        "data.reward_workers=1", f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}",
    ])
    train(cfg, extra_callbacks=[seen])
    assert seen.metrics["reward/timeouts"] == 0 and seen.metrics["reward/crashes"] == 0
    assert seen.pool.stats["items"] == 2 * 2 * 2 + 2 * 2 * 4  # one step's rollouts + eval before and after
    assert seen.pool._pool is None  # closed in teardown


# -- user code isolated by default: the fourth round of hostile inputs (2026-11-28) ------------------------------


def test_what_a_reward_raises_that_is_not_an_exception_fails_its_item_in_a_worker_and_in_process(caplog):
    """SystemExit(0), KeyboardInterrupt and GeneratorExit from a reward used to end the run with status 0 (or read as
    the user's Ctrl-C): each is now one failed item naming the reward and the exception, the rest scored."""
    responses, golds = ["SYSEXIT", "\\boxed{2}", "KBINT", "GENEXIT"], ["1", "2", "1", "1"]
    with caplog.at_level(logging.WARNING), RewardPool(faulty_reward, workers=1, timeout_s=5) as pooled:
        assert pooled.score(responses, golds) == [0.0, 1.0, 0.0, 0.0]
    serial = RewardPool(faulty_reward, workers=0, timeout_s=5)
    assert serial.score(responses, golds) == [0.0, 1.0, 0.0, 0.0]
    for pool in (pooled, serial):
        assert pool.failures == {0: "errors", 2: "errors", 3: "errors"}
        assert pool.failure_causes[0] == "raised SystemExit(0)"
        assert pool.failure_causes[2] == "raised KeyboardInterrupt()"
        assert pool.failure_causes[3] == "raised GeneratorExit()"
    assert "faulty_reward: item 0 of the batch raised SystemExit(0); it scores 0.0" in caplog.text


def test_a_real_ctrl_c_while_a_reward_runs_in_process_is_still_the_users():
    def interrupted(response, gold):
        os.kill(os.getpid(), signal.SIGINT)  # a real signal, handled by Python's default handler
        time.sleep(1)
        return 1.0

    with pytest.raises(KeyboardInterrupt):
        RewardPool(interrupted, workers=0, timeout_s=5).score(["a"], ["a"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the watch put the handler back


def test_an_in_process_reward_gets_copies_of_the_rows_fields(tmp_path):
    code = tmp_path / "mutating.py"
    code.write_text("def take(response, gold, seen):\n    seen.append(response)\n    return float(len(seen) == 1)\n")
    row = {"seen": []}  # one row, answered twice (G samples share their example's fields)
    reward = Reward.of(f"{code}:take")
    assert RewardPool(reward, workers=0, timeout_s=5).score(["a", "b"], ["x", "x"], [row, row]) == [1.0, 1.0]
    assert row == {"seen": []}


def test_a_field_no_row_has_stops_at_the_first_batch_in_one_line(tmp_path):
    code = tmp_path / "tol.py"
    code.write_text("def within(response, gold, tolerance):\n    return 1.0\n")
    pool = RewardPool(Reward.of(f"{code}:within"), workers=0, timeout_s=5)
    with pytest.raises(RewardError) as info:
        pool.score(["1", "2"], ["1", "2"], [{"unit": "m"}, {"unit": "s"}])
    message = str(info.value)
    assert "\n" not in message and "needs the field 'tolerance'" in message and "(the rows' fields: ['unit'])" in message
    assert "fix: add a 'tolerance' column to the data files" in message
    assert pool.stats["items"] == 0  # nothing was scored


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit(0)"])
def test_a_reward_file_that_stops_the_process_at_import_is_a_configuration_problem(tmp_path, raised):
    code = tmp_path / "stops.py"
    code.write_text(f"raise {raised}\n\ndef fn(response, gold):\n    return 1.0\n")
    with pytest.raises(RewardError) as info:
        load_function(f"{code}:fn")
    message = str(info.value)
    assert f"importing {code} raised {raised.replace('(0)', '')}" in message and "fix the file" in message
    assert "not a Ctrl-C" in message


@pytest.mark.slow
def test_a_warm_up_that_sleeps_is_cut_off_after_the_timeout_and_the_items_are_scored():
    with RewardPool(warm_up_sleeps, workers=1, timeout_s=1) as pool:
        assert pool.score(["\\boxed{2}", "\\boxed{3}"], ["2", "4"]) == [1.0, 0.0]
    assert pool.failures == {}


@pytest.mark.slow
@pytest.mark.parametrize("reward, code", [(warm_up_exits, "exit code 0: os._exit or a clean exit"),
                                          (warm_up_crashes, "exit code 3")])
def test_a_warm_up_that_ends_its_worker_fails_the_call_in_one_line_not_a_hang(reward, code):
    pool = RewardPool(reward, workers=1, timeout_s=1)
    with pytest.raises(RewardWorkersFailed) as info:
        pool.score(["\\boxed{2}"], ["2"])
    message = str(info.value)
    assert f"the reward '{reward.__name__}' ended" in message and "in their warm-up call" in message
    assert code in message and "__main__" not in message  # the real cause, not the guard
    assert pool._pool is None  # the workers were stopped


@pytest.mark.slow
def test_a_warm_up_that_no_signal_can_interrupt_fails_the_call_after_the_stall_limit(monkeypatch):
    monkeypatch.setattr(pool_module, "STALL_SLACK_S", 1.0)
    pool = RewardPool(warm_up_blocks, workers=1, timeout_s=0.5)
    with pytest.raises(RewardWorkersFailed, match=r"no worker finished an item in 2 s.*warm-up call .* never returned"):
        pool.score(["\\boxed{2}"], ["2"])
    assert pool._pool is None


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_process_a_reward_forks_has_default_signal_handling_and_ends_with_the_pool(tmp_path):
    marker = tmp_path / "child.pid"
    pool = RewardPool(faulty_reward, workers=1, timeout_s=5)
    assert pool.score([f"FORK:{marker}"], ["1"]) == [0.5]
    child = int(marker.read_text())
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{child}/status").read_text().splitlines())
    caught, ignored = int(status["SigCgt"], 16), int(status["SigIgn"], 16)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # none caught or ignored: SIG_DFL
        assert not (caught | ignored) & (1 << (signum - 1)), signal.Signals(signum).name
    (worker,) = pool_module._worker_pids(pool._pool)
    assert os.getpgid(worker) == worker and os.getpgid(child) == worker  # their own group, not the terminal's
    pool.close()
    assert _gone(child) and _gone(worker)


EXITS = """
import sys
sys.path.insert(0, {tests!r})
from hacrl_lightning.rewards import RewardPool
from reward_faults import faulty_reward

if __name__ == "__main__":
    import threading
    pool = RewardPool(faulty_reward, workers=1, timeout_s=300)
    threading.Thread(target=pool.score, args=(["SLEEP"], ["1"]), daemon=True).start()
    while not pool._pool or not pool_workers(pool):
        pass
    raise SystemExit(4)  # the run fails while a worker runs an item: the exit must not wait on it
""".replace("pool_workers(pool)", "__import__('hacrl_lightning.rewards.pool').rewards.pool._worker_pids(pool._pool)")


@pytest.mark.slow
def test_a_process_that_fails_while_a_worker_runs_an_item_exits_at_once(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(EXITS.format(tests=str(REPO / "tests")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stderr[-2000:]


@pytest.mark.slow
def test_too_few_file_descriptors_for_the_workers_is_one_line_naming_the_limit(tmp_path):
    script = tmp_path / "fds.py"
    script.write_text(f"""
import resource, sys
sys.path.insert(0, {str(REPO / 'tests')!r})
from hacrl_lightning.rewards import RewardPool
from hacrl_lightning.errors import RunFailed
from reward_faults import faulty_reward

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    try:
        RewardPool(faulty_reward, workers=2, timeout_s=5).score(["a"] * 4, ["a"] * 4)
    except RunFailed as err:
        print(err)
        raise SystemExit(1)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    line = done.stdout.strip()
    assert "at most 16 files (ulimit -n 16)" in line and "ulimit -n 4096" in line and "data.reward_workers=0" in line
