"""The global plan of a step (hacrl_lightning/plan.py), hand-checked: the same mini-batches on any
number of ranks, shares that cover each mini-batch once, and as many micro-batches on every rank."""

from __future__ import annotations

import pytest
import torch

from hacrl_lightning.plan import StepPlan, learner_order


def test_order_is_own_first_then_partners_in_agent_order():
    # 2 prompts x 3 sources x 2 samples; learner 1
    source = torch.tensor([0, 0, 1, 1, 2, 2] * 2)
    prompt = torch.tensor([0] * 6 + [1] * 6)
    order = learner_order(source == 1, source, prompt, learner=1, cross_cap=None,
                          generator=torch.Generator().manual_seed(0))
    assert source[order].tolist() == [1] * 4 + [0] * 4 + [2] * 4
    assert sorted(order.tolist()) == list(range(12))


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_rank_sees_the_same_mini_batches_and_their_shares_cover_them(world):
    order = torch.randperm(36, generator=torch.Generator().manual_seed(1))
    one = StepPlan.build(order, mini_batch_size=9)
    plans = [StepPlan.build(order, mini_batch_size=9, rank=r, world=world) for r in range(world)]
    assert len(one) == 4
    for plan in plans:
        assert [b.tolist() for b in plan.mini_batches] == [b.tolist() for b in one.mini_batches]
    for m in range(len(one)):
        shares = [plan.share(m) for plan in plans]
        assert torch.cat(shares).tolist() == one.mini_batches[m].tolist()  # each row once, in order
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_shorter_share_gets_empty_micro_batches_so_every_rank_runs_as_many():
    plans = [StepPlan.build(torch.arange(9), mini_batch_size=9, rank=r, world=2) for r in range(2)]
    # shares 5 and 4 rows; micro-batches of 2: rank 0 runs 2+2+1, rank 1 runs 2+2 and one empty pass
    assert [len(rows) for rows in plans[0].micro_batches(0, 2)] == [2, 2, 1]
    assert [len(rows) for rows in plans[1].micro_batches(0, 2)] == [2, 2, 0]


def test_rows_where_and_their_micro_batches_match_across_ranks():
    own = torch.tensor([True] * 6 + [False] * 6)
    plans = [StepPlan.build(torch.arange(12), mini_batch_size=3, rank=r, world=2) for r in range(2)]
    assert [plan.rows_where(own).tolist() for plan in plans] == [[0, 1, 3, 4], [2, 5]]
    counts = [[len(rows) for rows in plan.micro_batches_where(own, 3)] for plan in plans]
    assert counts == [[3, 1], [2, 0]]
