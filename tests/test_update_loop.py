"""The update loop made GPU-friendly (`hacrl_lightning/update.py`, `plan.py`): AdamW's implementation by device,
no value read to the host inside a pass loop, rows of like length sharing a pass; on real zoo agents and one real
step of the tiny pair."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hacrl_lightning.agents.agent import first_target_column
from hacrl_lightning.agents.lora import trainable_parameters
from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.config import DataConfig
from hacrl_lightning.data import synthetic_examples
from hacrl_lightning.exchange import make_rollouts, view_for
from hacrl_lightning.plan import StepPlan
from hacrl_lightning.presets import get_preset
from hacrl_lightning.update import LearnerTables, adamw, adamw_options, loss_inputs, padding_metrics

from conftest import ZOO_AGENTS


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
    forward and the optimizer (not the update loop's to remove)."""

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
        # host-side by construction (the host's view), and foreign: the model, the optimizer
        patch.setattr(AgentView, "select", seen.pausing(AgentView.select))
        patch.setattr(update_file, "first_target_column", seen.pausing(update_file.first_target_column))
        patch.setattr(update_file, "rows_present", seen.pausing(update_file.rows_present))  # of the host's view
        # the loss is not paused: given the host's `rows_present`, it reads nothing back either
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


def test_rows_of_like_length_share_a_pass_within_each_rank_s_share_and_pad_less():
    """Six rows of lengths 5 1 4 2 3 6 in one mini-batch, passes of 2. In plan order the passes compute
    2·5 + 2·4 + 2·6 = 30 tokens for 21 real ones (padding 0.3); longest first 2·6 + 2·4 + 2·2 = 24 (0.125).
    Over 2 ranks each keeps its share (rows 0-2, 3-5) and orders it: 2·5 + 1 and 2·6 + 2, 25 tokens, and both
    run 2 passes."""
    lengths, order = torch.tensor([5, 1, 4, 2, 3, 6]), torch.arange(6)
    plain = StepPlan.build(order, mini_batch_size=6, lengths=lengths, by_length=False)
    grouped = StepPlan.build(order, mini_batch_size=6, lengths=lengths)
    assert plain.padding(2) == (21, 30) and grouped.padding(2) == (21, 24)
    assert [p.rows.tolist() for p in grouped.passes(0, 2)] == [[5, 0], [2, 4], [3, 1]]
    ranks = [StepPlan.build(order, mini_batch_size=6, rank=r, world=2, lengths=lengths) for r in range(2)]
    assert [[p.rows.tolist() for p in plan.passes(0, 2)] for plan in ranks] == [[[0, 2], [1]], [[5, 4], [3]]]
    assert ranks[0].padding(2) == ranks[1].padding(2) == (21, 25)
    assert [p.passes for p in ranks[0].passes(0, 2)] == [4, 4]                 # the pass count is today's
    own = torch.tensor([True, False, True, True, False, True])                 # the old log-probs' rows: 0 2 3 5
    assert [p.rows.tolist() for p in grouped.passes_where(own, 2)] == [[5, 0], [2, 3]]
    assert grouped.padding(2, own) == (17, 2 * 6 + 2 * 4)
    assert padding_metrics({"a": grouped}, {"a": SimpleNamespace(is_own=own)}, 2) == {
        "a/perf/padding_frac/old_logprobs": 1 - 17 / 20, "a/perf/padding_frac/update": 1 - 21 / 24}


@dataclass
class Gen:
    token_ids: list[int]
    finish_reason: str


def _varied_view(agent_a, agent_b):
    """tiny_a's view of 6 own and 2 of tiny_b's responses to one prompt, of 1 to about 20 tokens."""
    example = synthetic_examples(DataConfig(), "eval", 1)
    texts = {"tiny_a": ["7", "We add 3 and 4, which gives seven, so the answer is \\boxed{7}.", "\\boxed{12}",
                        "So \\boxed{7}.", "Adding the two numbers: 5 + 7 = 12. \\boxed{12}", "12"],
             "tiny_b": ["The sum is \\boxed{7} after adding both terms together.", "\\boxed{9}"]}
    rollouts = []
    for agent in (agent_a, agent_b):
        gens = [Gen(agent.encode_response([text])[0] + [agent.eos_token_id], "stop") for text in texts[agent.name]]
        rollouts += make_rollouts(agent, example, gens)
    return view_for(agent_a, rollouts, sources=ZOO_AGENTS, rows=list(range(8)))


def _mini_batch(agent, view, tables, plan, size):
    """The mini-batch's loss (the sum of its passes') and the gradient its passes accumulate."""
    params = trainable_parameters(agent)
    for p in params:
        p.grad = None
    settings = replace(get_preset("hacpo"), kl_coef=0.0).loss_settings()
    total = torch.zeros(())
    for micro_batch in plan.passes(0, size):
        micro = view.select(micro_batch.rows)
        logp = agent.token_logprobs(micro.input_ids, micro.attention_mask,
                                    first_target=first_target_column(micro.loss_mask))
        loss, _ = hacpo_loss(**settings, **loss_inputs(
            view, micro, micro_batch.rows, plan.mini_batches[0], logp, tables, cross_lower=0.8,
            loss_scale_factor=float(agent.cfg.max_response_len), engine_logp=False, micro_batches=micro_batch.passes))
        (loss * micro_batch.weight).backward()
        total = total + loss.detach() * micro_batch.weight
    return total, torch.cat([p.grad.flatten() for p in params])


def test_grouping_by_length_keeps_the_mini_batch_s_loss_and_gradient(load_zoo_agent, zoo_agents):
    """Eight rows of 2 to 22 response tokens, passes of 3, in plan order and longest first: the mini-batch's loss
    and gradient agree to float32 rounding. Every row's term is normalised by the mini-batch's global counts, so
    only the summation order differs (and the matmul shapes, which a narrower pass changes): a few ulp of the
    largest values, 1e-6 relative at most; a row dropped or counted twice moves both by about 1/8."""
    agent = load_zoo_agent("tiny_a")
    agent.eval()
    view = _varied_view(agent, zoo_agents["tiny_b"])
    lengths = view.attention_mask.sum(-1)
    assert int(view.loss_mask.sum(-1).min()) <= 3 and int(view.loss_mask.sum(-1).max()) >= 15
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        old = agent.token_logprobs(view.input_ids, view.attention_mask)                        # [8, T]
    old = old + 0.02 * torch.randn(old.shape, generator=generator) * view.loss_mask
    from hacrl_lightning.algorithms import sequence_mean_logp

    tables = LearnerTables.of_step(
        view, 0, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 0.8, -0.3, 0.6, -0.9]),
        old_mean=sequence_mean_logp(old, view.loss_mask), old_tokens=old, ref_tokens=None,
        omega=torch.tensor([[1.0, 1.0, 1.0], [0.7, 1.0, 1.0], [1.0, 1.0, 1.0]]), rewards=torch.ones(8))
    order = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    plain = StepPlan.build(order, mini_batch_size=8, lengths=lengths, by_length=False)
    grouped = StepPlan.build(order, mini_batch_size=8, lengths=lengths)
    assert grouped.padding(3)[1] < plain.padding(3)[1]                       # fewer tokens computed
    assert [p.rows.tolist() for p in grouped.passes(0, 3)] != [p.rows.tolist() for p in plain.passes(0, 3)]
    loss_plain, grad_plain = _mini_batch(agent, view, tables, plain, 3)
    loss_grouped, grad_grouped = _mini_batch(agent, view, tables, grouped, 3)
    assert float(loss_plain) != 0.0 and float(grad_plain.abs().max()) > 0
    assert float(loss_grouped) == pytest.approx(float(loss_plain), rel=1e-6)
    assert float((grad_grouped - grad_plain).abs().max()) <= 1e-6 * float(grad_plain.abs().max())


def test_each_pass_s_padding_is_a_metric(one_step):
    """`{agent}/perf/padding_frac/{old_logprobs,update}` of the real step: passes of 1 row pad nothing."""
    module, _ = one_step
    keys = [f"{name}/perf/padding_frac/{phase}" for name in ("tiny_a", "tiny_b") for phase in ("old_logprobs", "update")]
    assert [module.last_metrics[key] for key in keys] == [0.0] * 4


def test_passes_by_tokens_pack_a_rank_s_rows_to_the_budget_and_keep_the_ranks_in_step():
    """Lengths 5 1 4 2 3 6, passes of at most 4 rows and 8 padded tokens, longest first: [6] alone (with the 5:
    2 x 6 > 8), [5], [4 3] (2 x 4 = 8), [2 1]. Over 2 ranks with 6 tokens: rank 0 (5 1 4) needs [5] [4] [1], rank 1
    (2 3 6) [6] [3 2] (2 x 3 = 6), so it ends with a zero-weight pass over the stand-in row: 3 passes each."""
    lengths, order = torch.tensor([5, 1, 4, 2, 3, 6]), torch.arange(6)
    plan = StepPlan.build(order, mini_batch_size=6, lengths=lengths, tokens=8)
    assert [p.rows.tolist() for p in plan.passes(0, 4)] == [[5], [0], [2, 4], [3, 1]]
    assert plan.padding(4) == (21, 6 + 5 + 8 + 4)
    ranks = [StepPlan.build(order, mini_batch_size=6, rank=r, world=2, lengths=lengths, tokens=6) for r in range(2)]
    passes = [plan.passes(0, 4) for plan in ranks]
    assert [[(p.rows.tolist(), p.weight) for p in mine] for mine in passes] == [
        [([0], 1.0), ([2], 1.0), ([1], 1.0)], [([5], 1.0), ([4, 3], 1.0), ([0], 0.0)]]
    assert [[p.passes for p in mine] for mine in passes] == [[6, 6, 6], [4, 4, 4]]  # this rank's passes x ranks
    own = torch.tensor([True, True, False, False, True, True])          # old log-probs: rank 0 rows 0 1, rank 1 4 5
    assert [[p.rows.tolist() for p in plan.passes_where(own, 4)] for plan in ranks] == [[[0], [1]], [[5], [4]]]
    with pytest.raises(ValueError, match="lengths"):
        StepPlan.build(order, mini_batch_size=6, tokens=8)


def _summed(agent, view, tables, plans, size):
    """`_mini_batch` over every rank's passes (FSDP's mean over ranks of world x each rank's loss is their sum)."""
    losses, grads = zip(*(_mini_batch(agent, view, tables, plan, size) for plan in plans))
    return sum(losses), sum(grads)


def test_passes_by_tokens_keep_the_mini_batch_s_loss_and_gradient_on_one_rank_or_two(load_zoo_agent, zoo_agents):
    """The eight varied rows in passes of 3 rows, and in passes of up to 8 rows and 2 x the median row's tokens, on
    one rank and over two: the same loss and gradient to float32 rounding (as for `by_length`, 1e-6 relative)."""
    agent = load_zoo_agent("tiny_a")
    agent.eval()
    view = _varied_view(agent, zoo_agents["tiny_b"])
    lengths = view.attention_mask.sum(-1)
    budget = 2 * int(lengths.median())
    tables = LearnerTables.of_step(
        view, 0, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 0.8, -0.3, 0.6, -0.9]),
        old_mean=torch.full((8,), -3.0), old_tokens=torch.full(view.input_ids.shape, -3.0) * view.loss_mask,
        ref_tokens=None, omega=torch.tensor([[1.0, 1.0, 1.0], [0.7, 1.0, 1.0], [1.0, 1.0, 1.0]]), rewards=torch.ones(8))
    order = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    rows = StepPlan.build(order, mini_batch_size=8, lengths=lengths)
    loss_rows, grad_rows = _mini_batch(agent, view, tables, rows, 3)
    for world in (1, 2):
        plans = [StepPlan.build(order, mini_batch_size=8, rank=r, world=world, lengths=lengths, tokens=budget)
                 for r in range(world)]
        shapes = [[len(p.rows) for p in plan.passes(0, 8) if p.counts] for plan in plans]
        assert sum(map(sum, shapes)) == 8 and max(map(max, shapes)) > 1 and min(map(min, shapes)) < 3
        assert len({len(plan.passes(0, 8)) for plan in plans}) == 1           # every rank as many passes
        loss, grad = _summed(agent, view, tables, plans, 8)
        assert float(loss) == pytest.approx(float(loss_rows), rel=1e-6)
        assert float((grad - grad_rows).abs().max()) <= 1e-6 * float(grad_rows.abs().max())


def test_the_memory_plan_sizes_a_pass_by_its_token_budget_and_lowers_it_to_fit():
    """A budget of 2 longest sequences plans like 2 rows a pass; a pass never holds less than one longest row; and
    `fixes` (scripts/plan.py) lowers the budget where passes go by tokens."""
    from hacrl_lightning.cli import compose_config
    from hacrl_lightning.memory import GIB, fixes, pass_shape, plan_memory
    from hacrl_lightning.architecture import run_architectures

    assert pass_shape(8, 4096, 0) == (8, 4096) and pass_shape(8, 4096, 16384) == (1, 16384)
    assert pass_shape(8, 4096, 2048) == (1, 4096) and pass_shape(2, 1000, 4096) == (2, 1000)
    cfg, _ = compose_config(["experiment=paper_model", "rollout=vllm", "trainer.micro_batch_size=8"])
    architectures, _ = run_architectures(cfg)
    longest = max(agent.max_prompt_len + agent.max_response_len for agent in cfg.agents.values())
    assert len({agent.max_prompt_len + agent.max_response_len for agent in cfg.agents.values()}) == 1
    cfg.trainer.micro_batch_tokens = 2 * longest
    by_tokens = plan_memory(cfg, architectures, 80 * GIB)
    cfg.trainer.micro_batch_tokens, cfg.trainer.micro_batch_size = 0, 2
    by_rows = plan_memory(cfg, architectures, 80 * GIB)
    assert [(a.activations, a.forward_peak) for a in by_tokens.agents] == [
        (a.activations, a.forward_peak) for a in by_rows.agents]
    cfg.trainer.micro_batch_size, cfg.trainer.micro_batch_tokens = 8, 8 * longest
    assert not plan_memory(cfg, architectures, 80 * GIB).fits
    first = fixes(cfg, architectures, 80 * GIB)[0]["overrides"]
    assert first[0].startswith("trainer.micro_batch_tokens=") and int(first[0].split("=")[1]) < 8 * longest
