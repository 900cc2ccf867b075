"""The update loop made GPU-friendly (`hacrl_lightning/update.py`, `plan.py`): AdamW's implementation by device,
on real zoo agents."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl_lightning.agents.lora import trainable_parameters
from hacrl_lightning.update import adamw, adamw_options


def test_adamw_is_fused_where_every_parameter_is_on_cuda_and_torch_s_default_elsewhere():
    assert adamw_options(["cuda", "cuda"]) == {"fused": True}
    assert adamw_options(["cpu"]) == {} and adamw_options(["cuda", "cpu"]) == {} and adamw_options(["mps"]) == {}


def test_the_cpu_optimizer_is_today_s_and_steps_alike(load_zoo_agent):
    """On the CPU `adamw` is the plain `AdamW(params, lr, betas, weight_decay)` the module built before: the same
    defaults (no fused, no forced foreach) and a bit-identical step."""
    agent = load_zoo_agent("tiny_a")
    params = trainable_parameters(agent)
    ours = adamw(params, agent.cfg)
    assert ours.defaults["fused"] is None and ours.defaults["foreach"] is None
    before = [p.detach().clone() for p in params]
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    plain = torch.optim.AdamW(twins, lr=agent.cfg.lr, betas=tuple(agent.cfg.betas), weight_decay=agent.cfg.weight_decay)
    generator = torch.Generator().manual_seed(0)
    for p, twin in zip(params, twins):
        p.grad = torch.randn(p.shape, generator=generator)
        twin.grad = p.grad.clone()
    ours.step()
    plain.step()
    assert all(torch.equal(p, twin) for p, twin in zip(params, twins))
    assert not all(torch.equal(p, old) for p, old in zip(params, before))  # it stepped


CONVERSIONS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
"""The ways a tensor's value reaches Python or the host: on a GPU each waits for every queued kernel."""


class Conversions:
    """Every tensor-to-host conversion (`CONVERSIONS`) while `phase` is set and no host-side or foreign function
    runs (`paused`), as (phase, name) events beside the passes' own events; `foreign` counts those of the model's
    forward, the loss and the optimizer (not the update loop's to remove)."""

    def __init__(self):
        self.events: list[tuple[str, object]] = []
        self.phase: str | None = None
        self.paused = 0
        self.foreign = 0

    def count(self, name: str) -> None:
        if self.phase is not None:
            if self.paused:
                self.foreign += 1
            else:
                self.events.append((self.phase, name))

    def pausing(self, fn):
        def paused(*args, **kwargs):
            self.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused -= 1
        return paused

    def in_phase(self, phase: str, fn):
        def inside(*args, **kwargs):
            self.phase = phase
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = None
        return inside


@pytest.fixture(scope="module")
def one_step(tmp_path_factory, zoo_cache):
    """One real step of the tiny pair (hacpo, shared rollouts), 2 mini-batches of 4 rows per learner in passes of
    1 row, every tensor-to-host conversion of the old log-probs' pass and the update recorded."""
    import lightning.pytorch as pl

    from hacrl_lightning import module as module_file, update as update_file
    from hacrl_lightning.agents.agent import Agent
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.exchange import AgentView
    from hacrl_lightning.training import build_system, build_trainer

    run_dir = tmp_path_factory.mktemp("update_loop") / "run"
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "algorithm=hacpo", "trainer.steps=1", "data.prompts_per_step=2",
                             "trainer.mini_batch_prompts=1", "rollout.group_size=2", "trainer.micro_batch_size=1",
                             "trainer.eval_every=0", "data.eval_size=2", "trainer.export_agents=false",
                             "trainer.diagnostics_every=0", f"zoo_cache={zoo_cache}", f"run_dir={run_dir}"])
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module, datamodule, callbacks, _ = build_system(cfg, Path(run_dir))
    seen = Conversions()
    with pytest.MonkeyPatch.context() as patch:
        for name in CONVERSIONS:
            real = getattr(torch.Tensor, name)

            def counted(self, *args, _real=real, _name=name, **kwargs):
                seen.count(_name)
                return _real(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        # host-side by construction (the host's view), and foreign: the model, the loss, the optimizer
        patch.setattr(AgentView, "select", seen.pausing(AgentView.select))
        patch.setattr(update_file, "first_target_column", seen.pausing(update_file.first_target_column))
        patch.setattr(module_file, "hacpo_loss", seen.pausing(module_file.hacpo_loss))
        patch.setattr(torch.optim.AdamW, "step", seen.pausing(torch.optim.AdamW.step))
        real_logprobs = Agent.token_logprobs

        def token_logprobs(self, *args, **kwargs):
            seen.events.append((seen.phase, "forward"))
            return seen.pausing(real_logprobs)(self, *args, **kwargs)

        patch.setattr(Agent, "token_logprobs", token_logprobs)
        patch.setattr(module_file, "score_own_rows", seen.in_phase("score", module_file.score_own_rows))
        module.update_learner = seen.in_phase("update", module.update_learner)
        real_backward = module._backward

        def backward(agent, view, plan, tables, lowers, m, *args, **kwargs):
            seen.events.append(("update", ("pass", m)))
            return real_backward(agent, view, plan, tables, lowers, m, *args, **kwargs)

        module._backward = backward
        build_trainer(cfg, Path(run_dir), callbacks).fit(module, datamodule=datamodule)
    return module, seen


def _runs(events: list, phase: str) -> list[tuple[object, list[str]]]:
    """The events of `phase` cut at each forward (or pass): (what starts the run, the conversions up to the next)."""
    runs: list = []
    for where, what in events:
        if where != phase:
            continue
        if what == "forward" and phase == "update":
            continue
        if what == "forward" or isinstance(what, tuple):
            runs.append((what, []))
        elif runs:
            runs[-1][1].append(what)
        else:
            runs.append((None, [what]))
    return runs


def test_no_pass_of_the_update_or_the_old_log_probs_reads_a_value_to_the_host(one_step):
    """The update's passes run back to back: the only conversions are one copy per mini-batch (its finite check and
    its passes' metrics, `host_values`: `.cpu()` and the host tensor's `.tolist()`) and two per learner at its end
    (the mean gradient norm; the zero-advantage fraction, a host table); the old log-probs' pass copies its scores
    (tokens, means, engine distances) once per source after its last forward. Each learner: 8 rows (2 prompts, 2
    sources, G = 2) in 4 mini-batches of 2, passes of 1 row."""
    module, seen = one_step
    runs = _runs(seen.events, "update")
    assert [start for start, _ in runs] == [("pass", m) for learner in range(2) for m in range(4) for _ in range(2)]
    after = [conversions for _, conversions in runs]
    assert after[0::2] == [[]] * 8                                            # nothing between two passes
    once = ["cpu", "tolist"]
    assert after[1::2] == [once, once, once, once + ["__float__"] * 2] * 2
    scores = _runs(seen.events, "score")
    assert [(start, len(c)) for start, c in scores] == [("forward", 0)] * 3 + [("forward", 3)] + [("forward", 0)] * 3 + [
        ("forward", 3)]                                                       # each source's 4 own rows, passes of 1
    assert all(c == ["cpu"] * 3 for _, c in scores if c)
    assert module.last_metrics["tiny_a/updates"] == 4.0
