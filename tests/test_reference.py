"""`hacrl_lightning/reference.py` makes the framework's update: one HACPO step of the tiny zoo pair through
`HACRLModule` (a Lightning trainer, as `train()` builds it, minus held-out evaluation and checkpoints) and one
step of `reference.hacpo_step`, from the same initial weights on the same prompts.

The reference generates its own rollouts with the DataModule's seeds and the same HF engine; they come out
bitwise the framework's (asserted first), so both paths train on the same responses and rewards. What may
then differ is the order of fp32 sums: the framework cuts each mini-batch of 8 rows into micro-batches of
2 (gradient accumulation, each micro-batch padded to its own width), the reference runs one forward and
one backward pass per mini-batch; same CPU, float32. The tolerances are tests/test_distributed.py's, which
compares the same kind of difference (fp32 sums reordered by micro-batching and by FSDP), and its constants:
- `GRAD_RTOL`: each update's gradient of a whole agent, as the optimizer is about to apply it (clipped),
  within 1e-3 of its norm. Reordered fp32 sums move it by ~1e-7 to 1e-6 of it (measured here: 2e-7 to
  6e-6); a different mini-batch, advantage or bound moves it by O(1) (test_distributed.py's
  `test_the_gradient_bound_has_power`).
- `REPLAY_ATOL`: each path's final weights are AdamW applied to its own recorded gradients, replayed in
  float64 from the initial weights (`adamw_replay`): 1e-6, the fp32 rounding of 4 updates to weights below 2
  in size; a missing, extra or differently applied update is off by about lr.
- Every parameter of the two paths, element by element, within `WEIGHT_ATOL` = lr = 1e-4: AdamW moves an
  element by lr·m/(sqrt(v)+eps), whose sensitivity to the gradient reaches lr/eps where the gradient is
  near zero, so a last-bit difference there can become up to about one update (test_distributed.py saw
  6.9e-5); measured here: 1.8e-6, against moves of up to 4e-4. Since that bound is about one update, the
  power comes from the gradients and from `UPDATE_RTOL`: the two paths' weight changes differ by at most
  1e-2 of their norm (measured 5e-6 and 3e-5; one amplified element of the 2e5 costs 7e-4 of it).
- `LOSS_TOL`: a mini-batch loss summed from micro-batches or taken at once, 1e-5 (relative, or absolute
  for a loss near 0 made of terms of size ~1).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hacrl_lightning import reference
from hacrl_lightning.cli import compose_config
from test_distributed import GRAD_RTOL, REPLAY_ATOL, adamw_replay, flat

NAMES = ("tiny_a", "tiny_b")
WEIGHT_ATOL = 1e-4
UPDATE_RTOL = 1e-2
LOSS_TOL = 1e-5


def small_config(run_dir: Path, zoo_cache: Path, *overrides: str):
    """The default pair (hacpo) on 4 prompts, G = 4, mini-batches of 2 prompts (8 rows: 2 own and 2 cross
    updates per learner), micro-batches of 2 rows in the framework."""
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "algorithm=hacpo", "trainer.steps=1",
                             "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=4",
                             "trainer.micro_batch_size=2", "trainer.eval_every=0", "data.eval_size=2",
                             "trainer.export_agents=false", "trainer.checkpoint_every=0",
                             "trainer.diagnostics_every=0", f"zoo_cache={zoo_cache}", f"run_dir={run_dir}",
                             *overrides])
    return cfg


class GradientLog:
    """Every optimizer step's gradients by parameter name (as the step applies them: clipped) and settings, per
    agent, from a global optimizer pre-hook: the framework's optimizers and the reference's are watched alike."""

    def __init__(self, agents: dict):
        self.owner = {id(p): (name, key) for name, agent in agents.items() for key, p in agent.model.named_parameters()}
        self.updates: dict[str, list[dict]] = {name: [] for name in agents}

    def __enter__(self):
        self.handle = register_optimizer_step_pre_hook(self._record)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def _record(self, optimizer, args, kwargs):
        group = optimizer.param_groups[0]
        grads = {self.owner[id(p)]: p.grad.detach().clone() for p in group["params"]}
        (name,) = {name for name, _ in grads}
        self.updates[name].append({"grads": {key: grad for (_, key), grad in grads.items()},
                                   "hparams": {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}})


def weights(agents: dict) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {key: p.detach().clone() for key, p in agent.model.named_parameters()}
            for name, agent in agents.items()}


def run_framework(cfg):
    from hacrl_lightning.callbacks.checkpoint import StepCheckpoint
    from hacrl_lightning.callbacks.evaluation import HeldOutEvalCallback
    from hacrl_lightning.training import build_system, build_trainer

    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module, datamodule, callbacks, _ = build_system(cfg, Path(cfg.run_dir))
    callbacks = [c for c in callbacks if not isinstance(c, (HeldOutEvalCallback, StepCheckpoint))]  # not a step
    steps, real = [], datamodule.rollout

    def rollout(examples, *, step):
        steps.append(real(examples, step=step))
        return steps[-1]

    datamodule.rollout = rollout
    initial = weights(module.agents)
    with GradientLog(module.agents) as log:
        build_trainer(cfg, Path(cfg.run_dir), callbacks).fit(module, datamodule=datamodule)
    return {"initial": initial, "weights": weights(module.agents), "updates": log.updates, "batch": steps[0],
            "metrics": dict(module.last_metrics)}


def run_reference(cfg, examples):
    from hacrl_lightning.algorithms import CapabilityWindow
    from hacrl_lightning.training import load_agents

    agents = load_agents(cfg)
    window = CapabilityWindow(len(agents), **cfg.algorithm.capability_settings())
    initial = weights(agents)
    with GradientLog(agents) as log:
        step = reference.hacpo_step(agents, reference.make_optimizers(agents),
                                    reference.hf_engines(agents, cfg.rollout.generation_batch_size), examples,
                                    window, cfg=cfg, step=0)
    return {"initial": initial, "weights": weights(agents), "updates": log.updates, "step": step,
            "capability": window.history}


@pytest.fixture(scope="module", params=[(), ("agents.tiny_a.lora.rank=4",)], ids=["full", "lora"])
def both(request, tmp_path_factory, zoo_cache):
    """`lora`: tiny_a trains a rank-4 adapter in both paths (the same peft model from `Agent.load`)."""
    cfg = small_config(tmp_path_factory.mktemp("reference") / "run", zoo_cache, *request.param)
    framework = run_framework(cfg)
    return cfg, framework, run_reference(cfg, framework["batch"].examples)


@pytest.mark.slow
def test_the_reference_makes_the_framework_update(both):
    cfg, fw, ref = both
    for name in NAMES:  # the same start
        assert all(torch.equal(fw["initial"][name][key], w) for key, w in ref["initial"][name].items())
    # the same rollouts, bitwise: the reference's own generation gives the framework's token ids and rewards
    batch, step = fw["batch"], ref["step"]
    as_tuple = lambda r: (r.prompt_id, r.source, r.token_ids, r.response, r.finish_reason, r.reward)  # noqa: E731
    assert [as_tuple(r) for r in step.rollouts] == [as_tuple(r) for r in batch.rollouts]
    assert torch.equal(step.rewards, batch.rewards) and 0 < float(batch.rewards.mean()) < 1
    for name in NAMES:
        assert torch.equal(step.views[name].input_ids, batch.views[name].input_ids)
    # the same updates: n·P/mini_batch_prompts = 2·4/2 = 4 per learner, gradient by gradient
    for name in NAMES:
        assert len(fw["updates"][name]) == len(ref["updates"][name]) == 4
        for u, (theirs, mine) in enumerate(zip(fw["updates"][name], ref["updates"][name])):
            assert mine["hparams"] == theirs["hparams"] and mine["grads"].keys() == theirs["grads"].keys()
            expected = flat(theirs["grads"])
            if expected.norm() == 0:  # every row of the mini-batch without gradient (A = 0, or clipped)
                assert flat(mine["grads"]).norm() == 0, f"{name} update {u}"
                continue
            difference = float((flat(mine["grads"]) - expected).norm() / expected.norm())
            assert difference <= GRAD_RTOL, f"{name} update {u}: gradients differ by {difference:.2e} of their norm"
    assert sum(flat(u["grads"]).norm() > 0 for name in NAMES for u in fw["updates"][name]) >= 6
    # the same weights
    for name in NAMES:
        keys = list(ref["weights"][name])
        for run in (fw, ref):  # each path applied AdamW to its own gradients, once per mini-batch
            replayed = adamw_replay(run["initial"][name], run["updates"][name])
            for key in keys:
                torch.testing.assert_close(run["weights"][name][key].double(), replayed[key], atol=REPLAY_ATOL,
                                           rtol=0, msg=f"{name}.{key}")
        for key in keys:  # every parameter
            torch.testing.assert_close(ref["weights"][name][key], fw["weights"][name][key], atol=WEIGHT_ATOL, rtol=0,
                                       msg=f"{name}.{key}")
        moved = flat({k: fw["weights"][name][k] - fw["initial"][name][k] for k in keys})
        differ = flat({k: ref["weights"][name][k] - fw["weights"][name][k] for k in keys})
        assert float(moved.abs().max()) > WEIGHT_ATOL  # the step moved the weights further than the bound
        assert float(differ.norm() / moved.norm()) <= UPDATE_RTOL, f"{name}: the updates differ"
    # the same metrics
    mine, theirs = step.metrics, fw["metrics"]
    for name in NAMES:
        partner = [other for other in NAMES if other != name][0]
        for key in ("reward", "acc", f"omega/{partner}", "updates"):
            assert mine[f"{name}/{key}"] == theirs[f"{name}/{key}"], key
        assert mine[f"{name}/loss/total"] == pytest.approx(theirs[f"{name}/loss/total"], rel=LOSS_TOL, abs=LOSS_TOL)
        assert mine[f"{name}/grad_norm"] == pytest.approx(theirs[f"{name}/grad_norm"], rel=GRAD_RTOL)
        # the mean over partner rows of their mini-batch's bound: 2 own then 2 cross mini-batches, so
        # (0.85 + 0.875) / 2 as the bound rises with m (Eq. 14); fp32 in the framework's metric
        assert mine[f"{name}/clip/cross_lower"] == pytest.approx(theirs[f"{name}/clip/cross_lower"], abs=1e-7)
        assert mine[f"{name}/clip/cross_lower"] == pytest.approx(0.8625)
    assert [list(h) for h in ref["capability"]] == [[float(a)] for a in batch.rewards.gt(0).float().mean((0, 2))]


def test_the_reference_refuses_what_it_leaves_out():
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "algorithm=grpo", "algorithm.kl_coef=0.001"])
    with pytest.raises(ValueError, match=r"algorithm.share_rollouts=False.*ratio_level=token.*kl_coef=0.001"):
        reference.check_supported(cfg)
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b]", "algorithm=hacpo"])
    reference.check_supported(cfg)  # HACPO as the paper runs it
