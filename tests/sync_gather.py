"""The shared-memory sync under FSDP2 on 2 gloo ranks, without vLLM (tests/test_vllm_sync.py launches it with torch's
launcher): every rank pushes its sharded model through its own `SharedMemorySync` into a stand-in worker that decodes
the buckets as an engine's worker does (`vllm_worker.bucket_tensors`). Weights larger than the bucket are gathered in
row ranges (`vllm_sync.row_items`), including ones whose row count does not divide by the ranks and a one-row one
(rank 1's shard of it is empty); each must arrive bitwise equal to the whole gather.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/sync_gather.py <folder>
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hacrl_lightning.rollout.vllm_sync import Rows, SharedMemorySync, row_items
from hacrl_lightning.rollout.vllm_worker import bucket_tensors

BUCKET = 4096


class Worker:
    """One engine worker's `collective_rpc` calls, loading into a dict (as tests/test_vllm_sync.py's `Worker`)."""

    def __init__(self):
        self.loaded, self.partial, self.bucket_ends, self.buffer = {}, {}, [], None

    def collective_rpc(self, method, args=()):
        if method == "hacrl_map_buffer":
            self.buffer = torch.from_file(args[0], shared=True, size=args[1], dtype=torch.uint8)
        elif method == "hacrl_load_bucket":
            (entries,) = args
            self.bucket_ends += [offset + rows * math.prod(shape[1:]) * getattr(torch, dtype).itemsize
                                 for _, dtype, shape, offset, _, rows in entries]
            self.loaded.update(bucket_tensors(self.buffer, entries, self.partial))
        elif method == "hacrl_end_weights":
            assert not self.partial, sorted(self.partial)
        return [None]


def main(folder: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.ParameterDict({"big": nn.Parameter(torch.randn(37, 40)),     # 5920 B: rows in ranges, 19 + 18
                              "odd": nn.Parameter(torch.randn(5, 300)),     # 1200 B rows: one row a range
                              "one": nn.Parameter(torch.randn(1, 1100)),    # one 4400 B row, rank 1's shard empty
                              "small": nn.Parameter(torch.randn(3, 4))})    # whole
    whole = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    items = list(row_items(model.state_dict().items(), BUCKET))
    cut = sorted({item.name for item in items if isinstance(item, Rows)})
    assert cut == ["big", "odd", "one"], cut
    worker = Worker()
    sync = SharedMemorySync(worker, dtype=torch.float32, bucket_mb=BUCKET / 2**20, near=Path(folder))
    sync.push(iter(items))
    for name, tensor in whole.items():
        assert torch.equal(worker.loaded[name], tensor), name
    assert max(worker.bucket_ends) <= 4400 and sync.buffer_bytes == 4400  # the bucket, or the one row larger
    print(f"SYNC-GATHER-DONE rank={rank} buckets={sync.buckets_sent}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
