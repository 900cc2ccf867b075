"""The rollout engine's mismatch with the trainer: the per-step metric and the truncated importance-sampling
correction (`algorithm.rollout_is_cap`), by hand and on a real run with the transformers engine.

The vLLM lane (tests/test_vllm.py) checks the same metric with vLLM's engine; here the engine is the
trainer's own model (HF `generate`), so the sampler's log-probs must equal the trainer's forward pass up
to the difference between a cached, token-by-token forward and a full one (fp32): a misplaced or shifted
log-prob would read ~1 instead.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_lightning.exchange import Rollout, view_for
from hacrl_lightning.algorithms import hacpo_loss, truncated_is_weight
from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import AlgorithmConfig
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.preflight import validate
from hacrl_lightning.training import train

D = torch.float64
NAN = float("nan")


HACPO = AlgorithmConfig().loss_settings()
"""The paper's HACPO settings; a test changes the ones it is about."""


def test_truncated_is_weight_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=D)
    engine = torch.tensor([[-1.5, -1.0, NAN, -30.0]], dtype=D)
    mask = torch.tensor([[True, True, True, False]])
    weight = truncated_is_weight(old, engine, mask, cap=2.0)
    # exp(0.5), exp(-1), NaN (not reported) -> 1, outside the mask -> 1
    torch.testing.assert_close(weight, torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0, 1.0]], dtype=D))
    capped = truncated_is_weight(old, engine, mask, cap=1.5)
    torch.testing.assert_close(capped, torch.tensor([[1.5, math.exp(-1.0), 1.0, 1.0]], dtype=D))
    assert not truncated_is_weight(old.requires_grad_(True), engine, mask, cap=2.0).requires_grad  # a weight, detached


def test_the_correction_weights_own_tokens_only():
    """One own response (2 tokens) and one partner's (1 token), every ratio 1 and A = 1, alpha = 0, omega = 1:
    each term is 1, so seq-mean-token-mean gives -(1 + 1) / 2 = -1 without the correction and
    -(mean(w_own) + 1) / 2 with it; the partner's row is never weighted."""
    logp = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    old = torch.tensor([[-1.0, -2.0], [0.0, 0.0]], dtype=D)
    engine = torch.tensor([[-1.5, -1.0], [-9.0, NAN]], dtype=D)  # the partner row's values must not count
    common = dict(logp_new=logp, loss_mask=mask, advantages=torch.ones(2, dtype=D), is_own=torch.tensor([True, False]),
                  old_logp_mean=torch.tensor([-1.5, -1.0], dtype=D), old_logp=old, omega_factor=torch.ones(2, dtype=D),
                  cross_lower=0.8, **{**HACPO, "alpha": 0.0, "clip_low": 0.2, "clip_high": 0.2})
    base, _ = hacpo_loss(**common)
    assert float(base.detach()) == pytest.approx(-1.0)
    loss, metrics = hacpo_loss(**{**common, "rollout_is_cap": 2.0}, engine_logp=engine)
    w = (math.exp(0.5) + math.exp(-1.0)) / 2
    assert float(loss.detach()) == pytest.approx(-(w + 1.0) / 2)
    assert float(metrics["rollout_is/weight_mean"]) == pytest.approx(w)
    assert float(metrics["rollout_is/capped_frac"]) == 0.0
    with pytest.raises(ValueError, match="engine_logp"):
        hacpo_loss(**{**common, "rollout_is_cap": 2.0})


def test_a_cap_below_one_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"algorithm.rollout_is_cap.*0 \(off\) or a cap >= 1"):
        validate(compose_config(["algorithm.rollout_is_cap=0.5", f"run_dir={tmp_path / 'run'}"])[0])


def test_the_view_puts_the_engines_log_probs_on_own_response_tokens(load_zoo_agent):
    agent = load_zoo_agent("tiny_a")
    own = Rollout("p0", "1+1=", "tiny_a", "2", [5, 6, agent.eos_token_id], "stop", engine_logprobs=[-0.5, -0.25, NAN])
    partner = Rollout("p0", "1+1=", "tiny_b", "2", [7, 8], "stop", engine_logprobs=[-1.0, -2.0])
    view = view_for(agent, [own, partner], sources=["tiny_a", "tiny_b"])
    response = view.loss_mask[0]
    torch.testing.assert_close(view.engine_logp[0][response], torch.tensor([-0.5, -0.25, NAN]), equal_nan=True)
    assert view.engine_logp[0][~response].isnan().all()  # prompt and padding
    assert view.engine_logp[1].isnan().all()  # a partner's tokens are re-encoded: its engine's log-probs do not apply


def run(tmp_path, zoo_cache, *overrides):
    cfg, _ = compose_config([
        "trainer.steps=2", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
        "trainer.eval_every=0", "data.eval_size=8", "trainer.export_agents=false", "trainer.micro_batch_size=8",
        f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}", *overrides,
    ])
    return train(cfg)


MISMATCH_FP32 = 1e-4
"""HF `generate` (a cached forward, one token at a time) against the trainer's full forward in fp32: the same
weights and arithmetic up to the order of a few sums, ~1e-6 in a log-prob; 1e-4 leaves 100x for another CPU's
kernels and is still 1e4 below what one token misplaced would read (~1)."""


@pytest.mark.slow
def test_with_the_correction_the_run_reports_the_mismatch_and_weights_near_one(tmp_path, zoo_cache):
    """rollout_is_cap > 0 asks the engines for their log-probs: each step logs |engine - trainer| per agent,
    summary.json keeps it, and with the trainer's own model as sampler the weights are 1 to the same
    precision. Without the cap the transformers engine is not asked (no score tensor per token)."""
    summary = run(tmp_path, zoo_cache, "algorithm.rollout_is_cap=2")
    for name, row in summary["agents"].items():
        mismatch = row["rollout_logp_diff"]
        assert mismatch is not None and mismatch["steps"] == 2, name
        assert 0.0 <= mismatch["mean"] <= mismatch["max"] < MISMATCH_FP32, (name, mismatch)
    plain = run(tmp_path / "plain", zoo_cache)
    assert all(row["rollout_logp_diff"] is None for row in plain["agents"].values())


class CheapLogprobEngine:
    """Stands for a vLLM engine where only its `free_logprobs` flag is read (no engine is built here)."""

    free_logprobs = True


@pytest.mark.parametrize("overrides, asked", [
    ([], [True] + [False] * 9 + [True, False]),                                  # steps 0 and 10 (every 10)
    (["trainer.mismatch_every=3"], [True, False, False, True, False, False, True, False, False, True, False, False]),
    (["trainer.mismatch_every=0"], [False] * 12),                                 # never measured
    (["algorithm.rollout_is_cap=2", "trainer.mismatch_every=0"], [True] * 12),     # the correction needs them always
])
def test_cheap_engine_log_probs_are_asked_only_on_the_steps_that_measure_the_mismatch(load_zoo_agent, tmp_path,
                                                                                     overrides, asked):
    """An engine that reports log-probs cheaply (vLLM) is asked for them on steps 0, k, 2k, ... only (k =
    `trainer.mismatch_every`), unless the truncated importance-sampling correction needs them every step;
    the transformers engine (not cheap) only for the correction."""
    from hacrl_lightning.training import make_datamodule

    cfg, _ = compose_config([f"run_dir={tmp_path / 'run'}", *overrides])
    agents = {name: load_zoo_agent(name) for name in cfg.agents}
    datamodule = make_datamodule(cfg, agents)
    first = next(iter(agents.values()))
    datamodule.engines = {first.name: CheapLogprobEngine()}
    assert [datamodule.sampling(first, n=2, seed=0, step=step).return_logprobs for step in range(12)] == asked
    other = list(agents.values())[1]  # no engine registered: the transformers backend's case (not cheap)
    assert [datamodule.sampling(other, n=2, seed=0, step=step).return_logprobs for step in range(12)] == \
        [cfg.algorithm.rollout_is_cap > 0] * 12
