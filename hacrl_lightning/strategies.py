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
    """`auto`/`single` -> Lightning's single-device default; `fsdp` -> per-agent FSDP2 (`SplitStrategy` under
    `placement=split`)."""
    if cfg.strategy == "fsdp":
        kind = SplitStrategy if cfg.placement == "split" else ModelParallelStrategy
        return kind(data_parallel_size=cfg.world_size, tensor_parallel_size=1)
    return "auto"


class SplitStrategy(ModelParallelStrategy):
    """`ModelParallelStrategy` for `trainer.placement=split`, where each rank holds other agents' optimizers.

    Lightning keys a distributed checkpoint's optimizer states by their index on the rank (`optimizer_0`) and
    writes the rest (LR schedules among it) from rank 0 alone: under `split` optimizer 0 is another agent's on
    every group, so here the states are keyed by agent (`optimizer_<agent>`) and every agent's LR schedule is
    gathered from its group into the metadata rank 0 writes (`lr_schedulers_by_agent`); loading reads each
    rank's own back. The module's placement (`Placement.local`) names this rank's optimizers, in order.
    A resume with another agent set (`resume_agents=change`): the agents in `fresh` (added by it) read nothing
    (their group joins the collective reads with an empty request) and keep their preset's weights and fresh
    optimizer and LR schedule; `adapt` maps the rest of the metadata (`resume.adapt_checkpoint`)."""

    fresh: frozenset = frozenset()
    adapt = None

    def _local_names(self) -> tuple[str, ...]:
        return tuple(self.lightning_module.placement.local)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        from pathlib import Path

        import torch.distributed as dist
        from lightning.fabric.strategies.model_parallel import _distributed_checkpoint_save

        if storage_options is not None:
            raise TypeError("SplitStrategy.save_checkpoint(..., storage_options=...) is not supported")
        names = self._local_names()
        optimizers = checkpoint.pop("optimizer_states", [])
        schedules = checkpoint.pop("lr_schedulers", [])
        shares: list = [None] * self.world_size
        dist.all_gather_object(shares, dict(zip(names, schedules)))
        checkpoint["lr_schedulers_by_agent"] = {name: state for share in shares for name, state in share.items()}
        path = Path(self.broadcast(filepath))
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        converted = {"state_dict": checkpoint.pop("state_dict"),
                     **{f"optimizer_{name}": state for name, state in zip(names, optimizers)}}
        _distributed_checkpoint_save(converted, path)
        if self.global_rank == 0:
            from lightning.fabric.utilities.load import _METADATA_FILENAME

            torch.save(checkpoint, path / _METADATA_FILENAME)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        from pathlib import Path

        from lightning.fabric.strategies.model_parallel import _load_checkpoint

        path = Path(self.broadcast(checkpoint_path))
        names = self._local_names()
        if set(names) & self.fresh:  # a group of its own: as many (empty) collective reads as a kept agent's
            from lightning.fabric.strategies.fsdp import _distributed_checkpoint_load
            from lightning.fabric.utilities.load import _METADATA_FILENAME

            for _ in range(1 + len(self.optimizers)):
                _distributed_checkpoint_load({}, path)
            metadata = torch.load(path / _METADATA_FILENAME, weights_only=weights_only)
        else:
            state = {"state_dict": self.model, **{f"optimizer_{name}": opt for name, opt in zip(names, self.optimizers)}}
            metadata = _load_checkpoint(path=path, state=state, strict=self.lightning_module.strict_loading,
                                        weights_only=weights_only)
        by_agent = metadata.pop("lr_schedulers_by_agent", {})
        schedules = [config.scheduler.state_dict() for config in self.lightning_module.trainer.lr_scheduler_configs]
        metadata["lr_schedulers"] = [schedule if name in self.fresh else by_agent[name]
                                     for name, schedule in zip(names, schedules)]
        return self.adapt(metadata) if self.adapt is not None else metadata


def lightning_precision(cfg: TrainerConfig) -> str:
    """The precision plugin Lightning gets. Under `fsdp` the agents' FSDP2 mixed-precision policy
    (`shard_agent`) does bf16 compute, so Lightning adds no autocast; on one device `bf16-mixed` is
    Lightning's autocast over fp32 weights. Either way weights and optimizer state stay fp32."""
    return "32-true" if cfg.strategy == "fsdp" else cfg.precision


def shard_agent(model: torch.nn.Module, mesh, *, precision: str = "32-true") -> torch.nn.Module:
    """FSDP2-shard one HF causal LM: every transformer block (the classes the model lists in
    `_no_split_modules`), then the whole model as the root (of a LoRA agent: the transformers model inside its peft
    wrapper). No per-architecture code.

    `precision="bf16-mixed"`: fp32 shards (the master weights, and so fp32 gradients and AdamW
    state), all-gathered as bf16 for compute, gradients reduce-scattered in fp32 (verl's policy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from hacrl_lightning.agents.lora import is_lora

    if is_lora(model):  # the root is the transformers model inside: peft's `generate` calls its forward, not
        # the peft model's, and the root's forward is where FSDP2 gathers the weights outside the blocks
        model = model.get_base_model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
