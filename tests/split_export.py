"""The gather behind an export under `trainer.placement=split` (`agent._full_state_dict`), on 3 gloo ranks: an agent
sharded by FSDP2 over the group {0, 1}, rank 2 outside it. The agent has two one-row weights (rank 1's shards of
both are empty) and a tied weight. tests/test_split_export.py launches it (torch's launcher) and reads its lines.

    python -m torch.distributed.run --standalone --nproc_per_node=3 tests/split_export.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from hacrl_lightning.agents.agent import _full_state_dict


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight  # tied: 5 rows, shards of 3 and 2
        self.first = nn.Parameter(torch.randn(1, 3))  # one row: rank 1's shard is empty
        self.second = nn.Parameter(torch.randn(1, 2))  # one row again: two empty shards on rank 1
        self.mix = nn.Linear(3, 3)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.new_group([0, 1])  # collectives: every rank, in the same order
    dist.new_group([2])
    if rank in (0, 1):
        torch.manual_seed(0)
        model = Tiny()
        reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
        fully_shard(model, mesh=DeviceMesh.from_group(group, "cpu"))
        empty = sorted(k for k, v in model.state_dict().items() if v.to_local().numel() == 0)
        state, writer = _full_state_dict(model)
        assert writer == (rank == 0), (rank, writer)
        assert set(state) == set(reference), sorted(state)
        for key, value in reference.items():
            assert torch.equal(state[key], value), key
        assert state["head.weight"] is state["embed.weight"]  # tied names stay one tensor
        print(f"SPLIT-EXPORT rank={rank} empty={','.join(empty) or '-'}", flush=True)
    dist.barrier()
    print(f"SPLIT-EXPORT-DONE rank={rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
