"""RewardPool: per-item timeouts, crash recovery and serial-identical results, on real worker processes.

The fault-injecting reward lives in tests/reward_faults.py so the workers can import it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.rewards import RewardPool, math_verify_reward
from reward_faults import char_parity, faulty_reward

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


def test_the_synthetic_default_scores_exact_match_in_process():
    cfg, _ = compose_config([])
    assert (cfg.data.name, cfg.data.reward, cfg.data.reward_workers) == ("synthetic", "exact_match", 0)


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
