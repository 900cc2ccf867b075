"""vLLM engines' memory shares summed per machine before any engine starts (`placement.engine_shares`).

On vLLM's CPU build a share is the machine's memory an engine's KV cache takes, and every rank starts its own
engines: `experiment=paper_smoke rollout=vllm` (2 ranks x 2 agents at 0.3 each) asked for 1.2 of the machine
and the fourth engine died. Pure arithmetic on given memory figures here; the vLLM lane runs that command
without hand-set shares (tests/test_vllm.py).
"""

from __future__ import annotations

import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.placement import CPU_ENGINES_SHARE, DEFAULT_SHARE, Placement, engine_shares

GIB = 2**30


def test_unset_shares_divide_a_quarter_of_the_machine_among_its_engines():
    shares, problems, line = engine_shares({"a": None, "b": None}, {"a": 2, "b": 2}, total_bytes=24 * GIB,
                                           available_bytes=20 * GIB, platform="cpu")
    assert problems == [] and shares == {"a": CPU_ENGINES_SHARE / 4, "b": CPU_ENGINES_SHARE / 4}  # 0.0625 each
    assert "4 engine(s)" in line and "1.50 GiB" in line  # 0.0625 x 24 GiB, said once


def test_set_shares_are_kept_and_the_unset_ones_take_what_is_left():
    shares, problems, _ = engine_shares({"a": 0.05, "b": None}, {"a": 2, "b": 2}, total_bytes=24 * GIB,
                                        available_bytes=20 * GIB, platform="cpu")
    assert problems == [] and shares == {"a": 0.05, "b": pytest.approx((CPU_ENGINES_SHARE - 0.1) / 2)}
    one, _, _ = engine_shares({"a": None}, {"a": 1}, total_bytes=24 * GIB, available_bytes=20 * GIB, platform="cpu")
    assert one == {"a": CPU_ENGINES_SHARE}  # a quarter of the machine: below a GPU's default 0.3


def test_set_shares_that_cannot_fit_are_refused_with_the_figures_and_the_key():
    _, problems, _ = engine_shares({"a": 0.3, "b": 0.3}, {"a": 2, "b": 2}, total_bytes=24 * GIB,
                                   available_bytes=20 * GIB, platform="cpu")
    ((key, value, allowed, fix),) = problems
    assert key == "agents.a.gpu_memory_utilization" and value == 0.3
    assert "2 x 0.3 (a) + 2 x 0.3 (b)" in allowed and "28.80 GiB" in allowed and "20.00 GiB are free" in allowed
    assert "leave them unset" in fix


def test_on_a_gpu_an_unset_share_is_the_default_and_the_plan_checks_the_rest():
    shares, problems, line = engine_shares({"a": None, "b": 0.2}, {"a": 8, "b": 8}, total_bytes=GIB,
                                           available_bytes=0, platform="cuda")
    assert shares == {"a": DEFAULT_SHARE, "b": 0.2} and problems == [] and line == ""


def test_an_agent_without_an_engine_on_this_machine_is_no_problem():
    """Under split on several machines, an agent's group may have no rank here: nothing to share or refuse."""
    shares, problems, line = engine_shares({"a": 0.25, "b": None}, {"a": 1, "b": 0}, total_bytes=24 * GIB,
                                           available_bytes=20 * GIB, platform="cpu")
    assert problems == [] and line == "" and shares["a"] == 0.25


def test_engines_on_a_machine_count_its_ranks_and_the_agents_they_hold():
    shared, _ = compose_config(["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"])
    assert Placement.of(shared, rank=1).engines_on_node(2) == {"tiny_a": 2, "tiny_b": 2}
    split, _ = compose_config(["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=4", "trainer.placement=split",
                               "rollout.backend=vllm", "agents.tiny_a.ranks=3", "agents.tiny_b.ranks=1",
                               "data.prompts_per_step=12", "trainer.mini_batch_prompts=4"])
    assert Placement.of(split, rank=0).engines_on_node(4) == {"tiny_a": 3, "tiny_b": 1}
    assert Placement.of(split, rank=0).engines_on_node(2) == {"tiny_a": 2, "tiny_b": 0}  # 2 ranks a machine: 0, 1
    assert Placement.of(split, rank=3).engines_on_node(2) == {"tiny_a": 1, "tiny_b": 1}  # ranks 2 (a), 3 (b)
    one, _ = compose_config([])
    assert Placement.of(one, rank=0).engines_on_node(1) == {"tiny_a": 1, "tiny_b": 1}
