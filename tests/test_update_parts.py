"""The update loop's stateless parts (`hacrl_lightning/update.py`): the one micro-batch iterator and its
zero-weight rule, and a micro-batch's loss inputs, on real zoo agents' views and real `hacpo_loss`."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from hacrl_lightning.exchange import make_rollouts, view_for
from hacrl_lightning.algorithms import hacpo_loss
from hacrl_lightning.config import DataConfig
from hacrl_lightning.data import synthetic_examples
from hacrl_lightning.plan import StepPlan
from hacrl_lightning.presets import get_preset
from hacrl_lightning.update import LearnerTables, loss_inputs

from conftest import ZOO_AGENTS


def test_every_rank_runs_as_many_passes_and_a_missing_one_weighs_nothing():
    """5 rows over 2 ranks in micro-batches of 2: rank 0 holds 3 rows (2 passes), rank 1 holds 2 (1 pass),
    so rank 1 runs a second pass over the stand-in row with weight 0 (FSDP's forwards are collectives)."""
    order = torch.tensor([4, 0, 3, 1, 2])
    passes = {}
    for rank in range(2):
        plan = StepPlan.build(order, mini_batch_size=5, rank=rank, world=2)
        passes[rank] = plan.passes(0, 2)
    assert [len(p) for p in passes.values()] == [2, 2]
    assert [(m.rows.tolist(), m.weight, m.counts) for m in passes[0]] == [([4, 0], 1.0, True), ([3], 1.0, True)]
    assert [(m.rows.tolist(), m.weight, m.counts) for m in passes[1]] == [([1, 2], 1.0, True), ([4], 0.0, False)]
    # the count the KL mean divides by: this rank's passes with rows (2 and 1), times the ranks
    assert [[m.passes for m in p] for p in passes.values()] == [[4, 4], [2, 2]]
    # the rows that count are each row once, over both ranks
    counted = sorted(r for p in passes.values() for m in p if m.counts for r in m.rows.tolist())
    assert counted == list(range(5))


@dataclass
class Gen:
    token_ids: list[int]
    finish_reason: str


def _view(zoo_agents):
    """tiny_a's view of 2 own and 2 of tiny_b's responses to one prompt."""
    example = synthetic_examples(DataConfig(), "eval", 1)
    rollouts = []
    for source in ("tiny_a", "tiny_b"):
        agent = zoo_agents[source]
        gens = [Gen(agent.encode_response([text])[0] + [agent.eos_token_id], "stop")
                for text in ("So \\boxed{7}.", "\\boxed{12}")]
        rollouts += make_rollouts(agent, example, gens)
    return view_for(zoo_agents["tiny_a"], rollouts, sources=ZOO_AGENTS, rows=[0, 1, 2, 3])


def test_loss_inputs_read_the_rows_and_normalise_over_the_global_mini_batch(zoo_agents):
    view, agent = _view(zoo_agents), zoo_agents["tiny_a"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        old = agent.token_logprobs(view.input_ids, view.attention_mask)                       # [4, T]
    tables = LearnerTables.of_step(
        view, 0, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), old_mean=torch.randn(4, generator=generator),
        old_tokens=old + 0.01 * torch.randn(old.shape, generator=generator), ref_tokens=None,
        omega=torch.tensor([[1.0, 1.0, 1.0], [0.7, 1.0, 1.0], [1.0, 1.0, 1.0]]), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert tables.omega_factor.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7])  # omega[source, learner 0]
    rows, mini = torch.tensor([1, 2]), torch.tensor([0, 1, 2, 3])
    micro = view.select(rows)
    logp = agent.token_logprobs(micro.input_ids, micro.attention_mask)                        # [2, T']
    settings = replace(get_preset("hacpo"), kl_coef=0.0).loss_settings()
    common = dict(cross_lower=0.8, loss_scale_factor=float(agent.cfg.max_response_len), engine_logp=False)
    inputs = loss_inputs(view, micro, rows, mini, logp, tables, **common)
    assert inputs["advantages"].tolist() == [-1.0, 0.5] and inputs["rewards"].tolist() == [0.0, 1.0]
    assert float(inputs["total_seqs"]) == 4.0                                                 # the mini-batch's
    assert int(inputs["total_tokens"]) == int(view.loss_mask.sum())
    assert inputs["old_logp"].shape == logp.shape and inputs["engine_logp"] is None
    # the self and cross parts give every token to exactly one of them: their losses sum to the loss
    whole, _ = hacpo_loss(**settings, **inputs)
    parts = {part: loss_inputs(view, micro, rows, mini, logp, tables, part=part, **common) for part in ("self", "cross")}
    assert parts["self"]["rewards"] is None
    assert torch.equal(parts["self"]["loss_mask"] | parts["cross"]["loss_mask"], micro.loss_mask)
    assert not bool((parts["self"]["loss_mask"] & parts["cross"]["loss_mask"]).any())
    total = sum(hacpo_loss(**settings, **part)[0] for part in parts.values())
    whole, total = float(whole.detach()), float(total.detach())
    assert whole != 0.0 and total == pytest.approx(whole, rel=1e-6)


def test_before_the_first_update_own_rows_take_their_new_log_probs_as_old_and_no_noise_clips_them(zoo_agents):
    """A planted batch-dependent perturbation of the scores (what bf16 kernels do to a row batched otherwise: 8.2e-4
    of a sequence ratio on Qwen3-1.7B): the old log-probs' pass over all 4 rows reads 2e-3 lower per token than the
    update's pass over 2. Scored apart, an own row with A < 0 lands past GSPO's own clip (1 - 3e-4) and loses its
    gradient before any update; with `own_old_is_new` its ratio is exactly 1 and nothing clips, while the partner's
    rows keep the old log-probs their source scored."""
    view, agent = _view(zoo_agents), zoo_agents["tiny_a"]

    def scores(ids, mask):  # the planted perturbation: a function of the batch's composition (its row count)
        return agent.token_logprobs(ids, mask) - 1e-3 * (len(ids) - 2)

    with torch.no_grad():
        old = scores(view.input_ids, view.attention_mask)                                      # [4, T], 2e-3 low
    from hacrl_lightning.algorithms import sequence_mean_logp

    tables = LearnerTables.of_step(
        view, 0, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), old_mean=sequence_mean_logp(old, view.loss_mask),
        old_tokens=old, ref_tokens=None, omega=torch.ones(3, 3), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    rows, mini = torch.tensor([0, 1]), torch.tensor([0, 1, 2, 3])                            # the 2 own rows
    micro = view.select(rows)
    logp = scores(micro.input_ids, micro.attention_mask)                                       # [2, T'], unperturbed
    settings = replace(get_preset("hacpo"), kl_coef=0.0).loss_settings()
    common = dict(cross_lower=0.8, loss_scale_factor=float(agent.cfg.max_response_len), engine_logp=False)
    _, apart = hacpo_loss(**settings, **loss_inputs(view, micro, rows, mini, logp, tables, **common))
    assert float(apart["clip/self_frac"]) == 0.5                                              # the row with A < 0
    inputs = loss_inputs(view, micro, rows, mini, logp, tables, own_old_is_new=True, **common)
    _, alike = hacpo_loss(**settings, **inputs)
    assert float(alike["clip/self_frac"]) == 0.0
    assert torch.equal(inputs["old_logp"], logp.detach()) and not inputs["old_logp"].requires_grad
    assert torch.equal(inputs["old_logp_mean"], sequence_mean_logp(logp.detach(), micro.loss_mask))
    cross = view.select(torch.tensor([2, 3]))                                                  # tiny_b's rows
    cross_logp = agent.token_logprobs(cross.input_ids, cross.attention_mask)
    kept = loss_inputs(view, cross, torch.tensor([2, 3]), mini, cross_logp, tables, own_old_is_new=True, **common)
    assert torch.equal(kept["old_logp_mean"], tables.old_logp_mean[2:])
