"""Choose the Lightning strategy: one device, or `ModelParallelStrategy` with each agent sharded by FSDP2.

Lightning's `FSDPStrategy` cannot run manual optimization (docs/engineering.md §1), so several GPUs
(or nodes) use `ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)` and
`shard_agent` wraps every agent separately with `fully_shard` in `configure_model`: each agent is
its own FSDP2 root with its own optimizer. The same path runs on CPU over gloo for the tests.
Deliberately not here: tensor parallelism (agents are data-parallel only).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from hacrl_lightning.config import TrainerConfig


def make_strategy(cfg: TrainerConfig):
    """`auto`/`single` -> Lightning's single-device default; `fsdp` -> per-agent FSDP2."""
    if cfg.strategy == "fsdp":
        return ModelParallelStrategy(data_parallel_size=cfg.devices * cfg.num_nodes, tensor_parallel_size=1)
    return "auto"


def lightning_precision(cfg: TrainerConfig) -> str:
    """The precision plugin Lightning gets. Under `fsdp` the agents' FSDP2 mixed-precision policy
    (`shard_agent`) does bf16 compute, so Lightning adds no autocast; on one device `bf16-mixed` is
    Lightning's autocast over fp32 weights. Either way weights and optimizer state stay fp32."""
    return "32-true" if cfg.strategy == "fsdp" else cfg.precision


def shard_agent(model: torch.nn.Module, mesh, *, precision: str = "32-true") -> torch.nn.Module:
    """FSDP2-shard one HF causal LM: every transformer block (the classes the model lists in
    `_no_split_modules`), then the whole model as the root. No per-architecture code.

    `precision="bf16-mixed"`: fp32 shards (the master weights, and so fp32 gradients and AdamW
    state), all-gathered as bf16 for compute, gradients reduce-scattered in fp32 (verl's policy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
