"""`trainer.placement`: group sizes, which agents a rank holds, and resumes that change the layout (pure, fast).

The multi-process behaviour (the same update as one process, a rank holds only its agent, exact resume) is
tests/test_distributed.py and tests/test_training.py.
"""

from __future__ import annotations

import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import flat_values
from hacrl_lightning.placement import Placement, group_sizes, split_problems
from hacrl_lightning.resume import resume_changes


def cfg_of(*overrides: str):
    """A split-capable config; vLLM rollouts, where groups may differ in size (with `rollout=hf` they may not)."""
    cfg, _ = compose_config(["trainer=fsdp", "trainer.accelerator=cpu", "rollout.backend=vllm", *overrides])
    return cfg


def test_sizes_follow_what_each_agent_holds_with_at_least_one_rank_each():
    cfg = cfg_of("agents=[tiny_a,tiny_b,tiny_c]", "trainer.devices=8", "data.prompts_per_step=120")
    # one rank each first, the other 5 in proportion 6 : 3 : 1: shares 4, 2.5, 1.5 -> 4, 3 (largest remainder), 1
    assert group_sizes(cfg, {"tiny_a": 6.0, "tiny_b": 3.0, "tiny_c": 1.0}) == {"tiny_a": 4, "tiny_b": 3, "tiny_c": 1}
    assert group_sizes(cfg) == {"tiny_a": 3, "tiny_b": 3, "tiny_c": 2}  # equal weights: the first ones larger
    assert group_sizes(cfg, {"tiny_a": 1e9, "tiny_b": 1.0, "tiny_c": 1.0}) == {"tiny_a": 6, "tiny_b": 1, "tiny_c": 1}
    fixed = cfg_of("agents=[tiny_a,tiny_b,tiny_c]", "trainer.devices=8", "agents.tiny_b.ranks=5",
                   "data.prompts_per_step=120")
    assert group_sizes(fixed, {"tiny_a": 1.0, "tiny_b": 1.0, "tiny_c": 3.0}) == {"tiny_a": 1, "tiny_b": 5, "tiny_c": 2}


def test_sizes_divide_the_steps_prompts_nearest_the_proportional_shares():
    """A group answers every prompt of the step, divided over its ranks: 8 prompts cannot go over 3 ranks."""
    cfg = cfg_of("agents=[tiny_a,tiny_b,tiny_c]", "trainer.devices=8", "data.prompts_per_step=8")
    # shares 4, 2.5, 1.5 round to 4, 3, 1; of the sizes dividing 8, (4, 2, 2) is nearest in squared error
    assert group_sizes(cfg, {"tiny_a": 6.0, "tiny_b": 3.0, "tiny_c": 1.0}) == {"tiny_a": 4, "tiny_b": 2, "tiny_c": 2}
    four = cfg_of("agents=[tiny_a,tiny_b,tiny_c,tiny_d]", "trainer.devices=16", "data.prompts_per_step=128")
    # two 8B and two 4B agents on 16 ranks: shares 5.3, 5.3, 2.7, 2.7; powers of two nearest: 4 each
    assert group_sizes(four, {"tiny_a": 8.0, "tiny_b": 8.0, "tiny_c": 4.0, "tiny_d": 4.0}) == \
        {"tiny_a": 4, "tiny_b": 4, "tiny_c": 4, "tiny_d": 4}
    assert split_problems(four) == []


def test_with_transformers_rollouts_every_group_has_one_size():
    """transformers' generation under FSDP2 synchronises every rank of the world at each token
    (`synced_gpus`): groups answering different numbers of prompts per rank would hang."""
    cfg = cfg_of("agents=[tiny_a,tiny_b]", "trainer.devices=4", "data.prompts_per_step=8", "rollout.backend=hf")
    assert group_sizes(cfg, {"tiny_a": 3.0, "tiny_b": 1.0}) == {"tiny_a": 2, "tiny_b": 2}  # the weights left out
    cfg.agents["tiny_a"].ranks, cfg.agents["tiny_b"].ranks = 3, 1
    cfg.trainer.placement = "split"
    cfg.data.prompts_per_step = 12
    (problem,) = split_problems(cfg)
    assert problem[0] == "agents.tiny_a.ranks" and "groups of one size with rollout=hf" in problem[2]
    assert problem[3] == "set every agents.<key>.ranks=2"
    cfg.rollout.backend = "vllm"
    assert split_problems(cfg) == []


def test_groups_are_contiguous_in_agent_order_and_each_rank_holds_one_agent():
    sizes = {"tiny_a": 1, "tiny_b": 3}
    seen = []
    for rank in range(4):
        placement = Placement.split(sizes, rank=rank, world=4)
        (name,) = placement.local
        seen.append((name, placement.rank_in(name), placement.size_of(name), placement.prompt_share))
    assert seen == [("tiny_a", 0, 1, (0, 1)), ("tiny_b", 0, 3, (0, 3)), ("tiny_b", 1, 3, (1, 3)), ("tiny_b", 2, 3, (2, 3))]
    shared = Placement.shared(["tiny_a", "tiny_b"], rank=1, world=2)
    assert shared.local == ("tiny_a", "tiny_b") and shared.process_group("tiny_a") is None
    with pytest.raises(ValueError, match="sum to the world size"):
        Placement.split({"tiny_a": 1, "tiny_b": 2}, rank=0, world=4)


def test_split_problems_name_the_key():
    assert split_problems(cfg_of("trainer.devices=2", "trainer.placement=split")) == []
    cfg = cfg_of("trainer.devices=3", "trainer.placement=split", "data.prompts_per_step=6", "trainer.mini_batch_prompts=2")
    cfg.agents["tiny_a"].ranks = 3  # (compose_config would refuse it: this is the check it runs)
    (problem,) = split_problems(cfg)
    assert problem[0] == "agents.tiny_a.ranks" and "at most 2" in problem[2]
    cfg.agents["tiny_a"].ranks = 2
    assert split_problems(cfg) == []
    cfg.agents["tiny_b"].ranks = 2
    (problem,) = split_problems(cfg)
    assert "sum to the world size 3" in problem[2]


@pytest.mark.parametrize("change, key", [("trainer.placement=shared", "trainer.placement"),
                                         ("agents.tiny_b.ranks=1", "agents.tiny_b.ranks")])
def test_a_resume_under_another_layout_is_refused_naming_the_setting_and_its_value(change, key):
    split = ("trainer.devices=2", "trainer.placement=split", "agents.tiny_a.ranks=1")
    saved = _nested(flat_values(cfg_of(*split)))
    changed = cfg_of(*split, change)  # tiny_b: 0 (the plan picks: 1) -> 1 by hand, a change all the same
    problems, _ = resume_changes(saved, changed, at_step=1, completed=False)
    (problem,) = problems
    assert problem.key == key and "the value the run was started with" in problem.allowed
    assert ("'split'" if key == "trainer.placement" else "0,") in problem.allowed


def test_a_run_saved_before_placement_existed_resumes_as_shared():
    run = cfg_of("trainer.devices=2")
    saved = _nested({key: value for key, value in flat_values(run).items()
                     if not key.endswith((".placement", ".ranks", ".offload_idle", ".sleep"))})
    problems, changes = resume_changes(saved, run, at_step=1, completed=False)
    assert problems == [] and changes == {}


def _nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
