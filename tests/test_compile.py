"""`trainer.compile` (`compiling.py`): each agent's transformer blocks and its log-prob chunks compiled with
torch.compile, rows padded to a multiple of 64 columns, the compile's seconds kept out of the step's clock.

One update of a tiny zoo agent compiled with inductor equals the eager one: the same loss and gradients within the
reordering of float32 reductions inductor's fused kernels do (each reordered sum of K terms moves by at most
gamma_K = K u of the sum of their magnitudes, u = 2^-24; over the tiny model's two blocks and its output layer,
measured at most a few 1e-6 relative), and lengths within one 64-column bucket compile nothing new.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from hacrl_lightning.agents.agent import COMPILE_BUCKET
from hacrl_lightning.callbacks.timing import StepTimer
from hacrl_lightning.cli import compose_config
from hacrl_lightning.compiling import compile_agent, compile_metrics, compile_wanted
from hacrl_lightning.errors import ConfigError

INDUCTOR = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
"""Inductor's CPU kernels are C++: without a compiler only dynamo's capture (`backend="eager"`) can be tested."""


def batch(agent, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows of `width` columns (the last one right-padded), their response mask and a weight per row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, agent.model.get_input_embeddings().num_embeddings, (3, width), generator=g)
    mask = torch.ones(3, width, dtype=torch.long)
    mask[2, width - 3:] = 0
    response = mask.bool().clone()
    response[:, : width // 2] = False
    return ids, mask, torch.randn(3, generator=g)


def update(agent, ids, mask, response, advantages) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A policy-gradient loss of the response tokens' log-probs and its gradients."""
    agent.model.zero_grad(set_to_none=True)
    logp = agent.token_logprobs(ids, mask, temperature=0.7, first_target=ids.shape[1] // 2)   # [B, T]
    loss = -(advantages[:, None] * logp * response).sum() / response.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in agent.model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.skipif(not INDUCTOR, reason="no C++ compiler: inductor cannot build its CPU kernels here")
def test_a_compiled_update_equals_the_eager_one_and_a_bucket_compiles_once(load_zoo_agent):
    torch._dynamo.reset()
    eager, compiled = (load_zoo_agent("tiny_b", dtype="float32") for _ in range(2))
    assert compile_agent(compiled) == compiled.model.config.num_hidden_layers  # every block
    ids, mask, advantages = batch(eager, 21, seed=0)
    response = mask.bool() & (torch.arange(21) >= 10)
    loss, grads = update(eager, ids, mask, response, advantages)
    compiled_loss, compiled_grads = update(compiled, ids, mask, response, advantages)
    assert compiled_loss == pytest.approx(float(loss), rel=1e-5)
    assert grads.keys() == compiled_grads.keys() and len(grads) == len(list(eager.model.parameters()))
    for key in grads:
        assert (compiled_grads[key] - grads[key]).norm() <= 1e-4 * grads[key].norm(), key
    graphs = compile_metrics()["compile/graphs"]
    assert graphs > 0 and compile_metrics()["time/compile"] > 0
    for width in (30, COMPILE_BUCKET - 1):  # the same 64-column bucket: nothing compiled again
        ids, mask, advantages = batch(eager, width, seed=width)
        update(compiled, ids, mask, mask.bool(), advantages)
    with torch.no_grad():  # the old log-probs' pass: its own graphs once, then equal to eager
        first = compiled.token_logprobs(ids, mask)
        assert torch.allclose(first, eager.token_logprobs(ids, mask), rtol=0, atol=1e-5)
    after_no_grad = compile_metrics()["compile/graphs"]
    with torch.no_grad():
        compiled.token_logprobs(ids[:, :40], mask[:, :40])
    assert compile_metrics()["compile/graphs"] == after_no_grad


@pytest.mark.slow
def test_the_wiring_with_dynamo_alone_keeps_the_values(load_zoo_agent):
    """`backend="eager"`: dynamo captures the blocks and the chunks and runs the captured graphs as they are (no
    inductor), so the log-probs are eager's but for the rows' padding to 64 columns (the attention's softmax then
    sums over more keys, masked to 0: a few ulp of |logp| ~ 14, 1e-5); a LoRA agent's blocks carry their adapters."""
    torch._dynamo.reset()
    eager, compiled = (load_zoo_agent("tiny_c", dtype="float32", lora={"rank": 4}) for _ in range(2))
    compile_agent(compiled, backend="eager")
    ids, mask, _ = batch(eager, 12, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(compiled.token_logprobs(ids, mask), eager.token_logprobs(ids, mask),
                                   rtol=0, atol=1e-5)
    assert compile_metrics()["compile/graphs"] > 0


@pytest.mark.slow
def test_the_setting_and_its_clock():
    assert not compile_wanted("auto", "cpu") and compile_wanted("True") and compile_wanted("true", "cpu")
    assert not compile_wanted("false", "gpu") and compile_wanted("auto", "gpu") == torch.cuda.is_available()
    cfg, _ = compose_config(["trainer.compile=true"])
    assert compile_wanted(cfg.trainer.compile)
    with pytest.raises(ConfigError, match="trainer.compile"):
        compose_config(["trainer.compile=yes"])

    class Module:
        reported: dict = {}

        def report(self, metrics):
            self.reported.update(metrics)

    torch._dynamo.reset()
    timer, module = StepTimer(compiled=True), Module()
    timer.on_train_batch_start(None, module, None, 0)
    torch.compile(lambda x: x.sin() + 1, backend="eager")(torch.ones(3))  # compiled inside the step
    timer.on_train_batch_end(None, module, None, None, 0)
    assert timer.compile_s > 0 and module.reported["time/compile"] == pytest.approx(timer.compile_s)
    assert module.reported["compile/graphs"] >= 1 and timer.steps == 1 and timer.train_s >= 0
    assert StepTimer().state_dict()["compile_s"] == 0.0


def test_a_compile_in_the_step_s_rollout_is_kept_out_of_its_clock_too():
    """The rollout's compile (`rollout.hf_compile`'s decode step) runs in the DataModule, before the module's hooks:
    the step's batch carries torch's compile seconds at its start (`StepBatch.compile_started`), and the timer
    counts from there."""
    import time
    from types import SimpleNamespace

    from hacrl_lightning.compiling import compile_seconds

    reported = {}
    module = SimpleNamespace(report=reported.update)
    torch._dynamo.reset()
    step = SimpleNamespace(started=time.perf_counter(), compile_started=compile_seconds())  # the DataModule's start
    torch.compile(lambda x: x.cos() * 2, backend="eager")(torch.ones(3))                    # the rollout compiles
    compiled_in_rollout = compile_seconds() - step.compile_started
    timer = StepTimer(compiled=True)
    timer.on_train_batch_start(None, module, step, 0)
    timer.on_train_batch_end(None, module, None, step, 0)
    assert compiled_in_rollout > 0 and timer.compile_s == pytest.approx(compiled_in_rollout)
    assert reported["time/compile"] == pytest.approx(compiled_in_rollout)


def test_the_timer_counts_compiles_where_the_transformers_engine_compiles_its_decode_step(tmp_path, zoo_cache):
    from hacrl_lightning.training import build_system

    def timer_compiled(*overrides):
        cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "trainer.steps=1", f"zoo_cache={zoo_cache}",
                                 f"run_dir={tmp_path}", "trainer.compile=false", *overrides])
        return build_system(cfg, tmp_path)[3]["timer"].compiled

    assert timer_compiled("rollout.hf_cache=static", "rollout.hf_compile=true")
    assert not timer_compiled("rollout.hf_cache=static", "rollout.hf_compile=false")
    assert not timer_compiled("rollout.hf_cache=static")  # auto: off without CUDA, as the engine decides
    assert not timer_compiled()                           # the dynamic cache compiles nothing
