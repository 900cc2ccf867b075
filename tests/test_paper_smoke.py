"""`experiment=paper_smoke`: the CPU stand-in of the paper's GPU launch, run end to end in `make test`.

It is `experiment=paper_size` (Qwen3-1.7B-Base + Qwen3-4B-Base on MATH with HACPO and the pair's
Table 5 values, KL on, `trainer=fsdp` with bf16 compute and fp32 masters) with the paper's real
tokenizers (Qwen3 and Llama 3.2) on tiny models in place of the hub models, the math fixtures
instead of MATH, 2 gloo ranks instead of 8 GPUs, and a few prompts for 2 steps. The first test pins
that nothing else differs; the others run it through `scripts/train.py` as a user would, with one
prompt per rank instead of two (`SMALLER`: the same 2 own + 2 cross mini-batches per step at half the
compute).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from hacrl_lightning.cli import compose_dictconfig

REPO = Path(__file__).resolve().parents[1]

SMOKE_AGENTS = ["tiny_qwen3", "tiny_llama32"]
ALLOWED = {  # what paper_smoke may change, and why
    "agents",                                      # real-tokenizer tiny models for the hub models
    "data.train_files", "data.eval_files",         # the math fixtures for MATH / MATH-500
    "data.prompts_per_step", "data.eval_size",     # 4 prompts a step (two per rank), 3 held out
    "rollout.group_size", "rollout.generation_batch_size",
    "trainer.steps", "trainer.mini_batch_prompts",  # 2 steps; P / mini = 2 as in the paper (128 / 64)
    "trainer.micro_batch_size", "trainer.accelerator", "trainer.devices",  # 2 CPU ranks over gloo
    "trainer.eval_every", "trainer.checkpoint_every",
}


def leaves(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def test_paper_smoke_is_paper_size_but_for_the_cpu_stand_ins():
    smoke = OmegaConf.to_container(compose_dictconfig(["experiment=paper_smoke"]), resolve=True)
    paper = OmegaConf.to_container(compose_dictconfig(["experiment=paper_size"]), resolve=True)
    assert list(smoke["agents"]) == SMOKE_AGENTS
    per_agent = ("agents", "agent_defaults", "run_dir")  # the agents' settings: compared below, where they land
    flat_smoke, flat_paper = leaves({k: v for k, v in smoke.items() if k not in per_agent}), \
        leaves({k: v for k, v in paper.items() if k not in per_agent})
    differing = {key for key in flat_smoke.keys() | flat_paper.keys() if flat_smoke.get(key) != flat_paper.get(key)}
    assert differing <= ALLOWED, sorted(differing - ALLOWED)
    for agents in (smoke["agents"], paper["agents"]):  # as the paper agents: bf16, lr 1e-6, weight decay 0.01
        assert {(a["dtype"], a["lr"], a["weight_decay"]) for a in agents.values()} == {("bfloat16", 1e-6, 0.01)}
    # the GPU path itself: FSDP2, bf16 compute over fp32 masters, the paper's algorithm and KL
    assert (smoke["trainer"]["strategy"], smoke["trainer"]["precision"]) == ("fsdp", "bf16-mixed")
    assert (smoke["trainer"]["accelerator"], smoke["trainer"]["devices"]) == ("cpu", 2)
    assert smoke["algorithm"]["name"] == "hacpo" and smoke["algorithm"]["kl_coef"] == 0.001
    assert (smoke["data"]["name"], smoke["data"]["reward"]) == ("math", "math_verify")
    assert smoke["data"]["prompts_per_step"] // smoke["trainer"]["mini_batch_prompts"] == \
        paper["data"]["prompts_per_step"] // paper["trainer"]["mini_batch_prompts"]  # 2 own + 2 cross mini-batches


SMALLER = ["data.prompts_per_step=2", "trainer.mini_batch_prompts=1"]
"""One prompt per rank: P / mini_batch_prompts stays 2 (the paper's 128 / 64), every path runs, half the compute."""


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, zoo_cache):
    run = tmp_path_factory.mktemp("paper_smoke") / "run"
    result = subprocess.run([sys.executable, "scripts/train.py", "experiment=paper_smoke", *SMALLER, f"run_dir={run}",
                             f"zoo_cache={zoo_cache}"], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return run


@pytest.mark.slow
def test_paper_smoke_trains_on_two_ranks_in_bf16_and_writes_its_summary(smoke_run):
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["algorithm"] == "hacpo" and summary["steps"] == 2
    for name in SMOKE_AGENTS:
        row = summary["agents"][name]
        assert row["optimizer_updates"] == 2 * 4  # per step n·P/mini = 2·2/1, whatever the 2 ranks hold
        assert row["rollouts_generated"] == 2 * 2 * 2  # steps · P · G, the global batch
        assert 0.0 <= row["final"]["acc"] <= 1.0
        assert json.loads((Path(row["export"]) / "config.json").read_text())["dtype"] == "bfloat16"  # served as bf16
    saved = OmegaConf.load(smoke_run / "config.yaml")
    assert (saved.trainer.strategy, saved.trainer.precision, saved.trainer.devices) == ("fsdp", "bf16-mixed", 2)


def test_paper_smoke_checkpoint_holds_fp32_masters_and_moments(smoke_run):
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint = smoke_run / "checkpoints" / "step_0000002.ckpt"
    assert checkpoint.is_dir()  # a distributed checkpoint: one shard file per rank
    metadata = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    weights = {k: m.properties.dtype for k, m in metadata.items() if k.startswith("state_dict.agents.")}
    moments = {k: m.properties.dtype for k, m in metadata.items() if "exp_avg" in k}
    assert weights and set(weights.values()) == {torch.float32}
    assert moments and set(moments.values()) == {torch.float32}
