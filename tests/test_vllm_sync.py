"""The shared-memory weight sync's protocol, without vLLM: `SharedMemorySync.push` (trainer side) against
`vllm_worker.bucket_tensors` (what each engine worker reads back), through a real shared-memory file. The
engine's `collective_rpc` is replaced by `Worker` below, which maps the file and decodes each bucket as an engine
worker does but loads into a dict instead of a vLLM model (there is no vLLM in this environment; the vLLM lane,
tests/test_vllm.py, runs the same sync into real engines)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hacrl_lightning.rollout.vllm_sync import ALIGN, SharedMemorySync
from hacrl_lightning.rollout.vllm_worker import bucket_tensors


class Worker:
    """Stands in for one engine worker's `collective_rpc` calls (the `hacrl_*` methods)."""

    def __init__(self):
        self.calls, self.loaded, self.bucket_bytes, self.paths = [], {}, [], []
        self.buffer, self.partial, self.pieces = None, {}, []

    def collective_rpc(self, method, args=()):
        self.calls.append(method)
        if method == "hacrl_map_buffer":
            path, nbytes = args
            self.paths.append(Path(path))
            self.buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        elif method == "hacrl_begin_weights":
            self.partial = {}
        elif method == "hacrl_load_bucket":
            (entries,) = args
            end = max(offset + rows * math.prod(shape[1:]) * getattr(torch, dtype).itemsize if shape
                      else offset + getattr(torch, dtype).itemsize for _, dtype, shape, offset, _, rows in entries)
            self.bucket_bytes.append(end)
            self.pieces += [(name, first, rows) for name, _, _, _, first, rows in entries]
            assert all(offset % ALIGN == 0 for _, _, _, offset, _, _ in entries)
            self.loaded.update(bucket_tensors(self.buffer, entries, self.partial))
        elif method == "hacrl_end_weights":
            assert not self.partial, f"incomplete: {sorted(self.partial)}"
        return [None]


def state(tied: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    embed = torch.randn(300, 64)
    out = {"model.embed_tokens.weight": embed, "model.layers.0.q.weight": torch.randn(64, 64),
           "model.layers.0.k.weight": torch.randn(16, 64), "model.layers.0.norm.weight": torch.randn(64),
           "model.layers.1.q.weight": torch.randn(64, 64), "position_ids": torch.arange(7)}
    out["lm_head.weight"] = embed if tied else torch.randn(300, 64)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tied", [True, False])
def test_every_weight_arrives_cast_and_exact_in_buckets_no_larger_than_asked(tmp_path, dtype, tied):
    """Buckets of 20 KB asked: the embedding (75 KB in fp32) is cut into row ranges over several buckets, the
    layers' tensors fill the room after it, and the head is cut again. Every tensor arrives put together, bitwise
    equal to the trainer's cast to the engine's dtype (integers keep theirs), tied names both present; the buffer
    stays at the bucket's size; the buffer's file is gone once mapped; begin and end enclose the buckets."""
    weights = state(tied)
    worker = Worker()
    sync = SharedMemorySync(worker, dtype=dtype, bucket_mb=20_000 / 2**20, near=tmp_path)
    sync.push(iter(weights.items()))
    assert worker.calls[0] == "hacrl_begin_weights" and worker.calls[-1] == "hacrl_end_weights"
    assert set(worker.loaded) == set(weights)
    for name, tensor in weights.items():
        expected = tensor.to(dtype) if tensor.is_floating_point() else tensor
        assert worker.loaded[name].dtype == expected.dtype and torch.equal(worker.loaded[name], expected), name
    total = sum(t.numel() * (dtype if t.is_floating_point() else t.dtype).itemsize for t in weights.values())
    assert sync.buffer_bytes == 20_000 and max(worker.bucket_bytes) <= 20_000
    assert sync.buckets_sent == len(worker.bucket_bytes) >= -(-total // 20_000)
    cut = [name for name, first, rows in worker.pieces if first or rows < weights[name].shape[0]]
    assert "model.embed_tokens.weight" in cut and "lm_head.weight" in cut  # the large ones came in row ranges
    assert all(not path.exists() for path in worker.paths)
    # a second sync reuses the mapped buffer and sends the new values
    weights["model.layers.0.q.weight"].add_(1.0)
    mapped = len(worker.paths)
    sync.push(iter(weights.items()))
    assert len(worker.paths) == mapped
    assert torch.equal(worker.loaded["model.layers.0.q.weight"], weights["model.layers.0.q.weight"].to(dtype))


def test_a_row_larger_than_the_bucket_grows_the_buffer_to_that_row_only(tmp_path):
    """A weight of 3 rows of 32 KB with 20 KB buckets: each row is a bucket of its own, the buffer grows to one row
    (not to the 96 KB tensor), and the weight arrives whole; the small weight after it, with no room left beside the
    last row, goes in a fourth."""
    weights = {"wide.weight": torch.randn(3, 8000), "small.weight": torch.randn(4, 4)}
    worker = Worker()
    sync = SharedMemorySync(worker, dtype=torch.float32, bucket_mb=20_000 / 2**20, near=tmp_path)
    sync.push(iter(weights.items()))
    assert sync.buffer_bytes == 32_000 and worker.pieces[:3] == [("wide.weight", row, 1) for row in range(3)]
    assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in weights.items())
    assert sync.buckets_sent == 4 and worker.bucket_bytes == [32_000] * 3 + [64]


def test_a_failing_bucket_still_ends_the_reload(tmp_path):
    """An error while loading a bucket ends the engine's reload (`hacrl_end_weights`) before it propagates, so
    the engine is not left in the middle of a layerwise reload."""
    class Failing(Worker):
        def collective_rpc(self, method, args=()):
            if method == "hacrl_load_bucket":
                self.calls.append(method)
                raise RuntimeError("worker died")
            return super().collective_rpc(method, args)

    worker = Failing()
    with pytest.raises(RuntimeError, match="worker died"):
        SharedMemorySync(worker, dtype=torch.float32, bucket_mb=1.0, near=tmp_path).push(iter(state(True).items()))
    assert worker.calls[-1] == "hacrl_end_weights"


def test_a_full_shared_memory_folder_falls_back_beside_the_model(tmp_path, monkeypatch):
    """Where `/dev/shm` cannot reserve the buffer (a container's is often 64 MiB), the buffer is a file beside
    the engine's model directory instead of a sparse file whose first write past the space kills the process."""
    import os

    import hacrl_lightning.rollout.vllm_sync as vllm_sync

    shm, near = tmp_path / "shm", tmp_path / "near"
    shm.mkdir()
    near.mkdir()
    monkeypatch.setattr(vllm_sync, "SHM_DIR", shm)
    reserve = os.posix_fallocate

    def full(handle, offset, nbytes):
        if Path(os.readlink(f"/proc/self/fd/{handle}")).parent == shm:
            raise OSError(28, "No space left on device")
        reserve(handle, offset, nbytes)

    monkeypatch.setattr(vllm_sync.os, "posix_fallocate", full)
    worker = Worker()
    weights = state(tied=False)
    SharedMemorySync(worker, dtype=torch.float32, bucket_mb=1.0, near=near).push(iter(weights.items()))
    assert [path.parent for path in worker.paths] == [near]
    assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in weights.items())
    assert not list(shm.iterdir()) and not list(near.iterdir())  # nothing left behind in either


@pytest.mark.slow
def test_under_fsdp2_weights_larger_than_the_bucket_are_gathered_in_row_ranges_and_arrive_exact(tmp_path):
    """2 gloo ranks (tests/sync_gather.py, torch's launcher): weights above the bucket are gathered in row ranges
    (uneven shards, a one-row weight whose second shard is empty), pushed through each rank's own buffer, and
    decoded bitwise equal to the whole gather; the buffer stays at the bucket, or at the one row larger than it."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(repo / "tests" / "sync_gather.py"), str(tmp_path)], capture_output=True, text=True,
                         timeout=300, cwd=repo)
    assert run.returncode == 0 and run.stdout.count("SYNC-GATHER-DONE") == 2, run.stdout[-2000:] + run.stderr[-3000:]


def test_a_gpu_the_engine_cannot_map_falls_back_to_host_shared_memory(tmp_path, monkeypatch, recwarn):
    """Weights on a GPU go through a CUDA IPC handle of a GPU buffer; where the engine's workers refuse it (they do
    not see that GPU: `vllm_worker.cuda_index` raises LookupError), the sync warns once and stages its buckets in
    host shared memory, and the weights still arrive. (The CUDA path itself runs on a lent GPU: `gpu_check.py`'s
    `sync` part, docs/GPU.md; this machine has no CUDA.)"""
    worker = Worker()
    sync = SharedMemorySync(worker, dtype=torch.float32, bucket_mb=1.0, near=tmp_path)

    def refused(nbytes, device):
        raise RuntimeError("Error in hacrl_map_cuda_buffer\nLookupError: no GPU with UUID GPU-1234 among this "
                           "process's 1 devices")

    monkeypatch.setattr(sync, "_map_cuda", refused)
    sync._choose_transport(torch.device("cuda", 0))
    assert sync.transport == "host"
    (warning,) = [w for w in recwarn if "host shared memory" in str(w.message)]
    assert "no GPU with UUID GPU-1234" in str(warning.message)
    weights = state(tied=False)
    sync.push(iter(weights.items()))
    assert all(torch.equal(worker.loaded[name], tensor) for name, tensor in weights.items())
    assert sync.buffer is not None and not sync.buffer.is_cuda


def test_the_cuda_handle_is_plain_values_that_vllm_can_send():
    """vLLM sends a call's arguments to its engine process as msgpack: plain values only. torch's `reduce_tensor`
    tuple for a CUDA tensor (its rebuild function, classes, a dtype) cannot cross, and `cuda_handle` keeps only
    its plain fields (the worker supplies the rest). `standin_engine.plain` is the check the GPU check's stand-in
    engine applies to every call, so that its pipe does not let through what vLLM would refuse."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from hacrl_lightning.bench.standin_engine import plain
    from hacrl_lightning.rollout.vllm_sync import cuda_handle

    import inspect

    exported = (torch.Tensor, torch.Size([8]), (1,), 0, torch.UntypedStorage, torch.uint8, 0, b"handle", 8, 0,
                False, b"counter", 16, b"event", True)  # what reduce_tensor gives rebuild_cuda_tensor, in its order
    names = list(inspect.signature(rebuild_cuda_tensor).parameters)  # the order cuda_handle's indices assume
    assert [names[i] for i in (7, 8, 9, 11, 12, 13, 14)] == [
        "storage_handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset",
        "event_handle", "event_sync_required"]
    handle = cuda_handle(exported)
    assert handle == dict(storage=b"handle", storage_bytes=8, offset_bytes=0, counter=b"counter", counter_offset=16,
                          event=b"event", event_sync=True)
    plain((handle, 8, "GPU-uuid"), "hacrl_map_cuda_buffer")
    with pytest.raises(TypeError, match="cannot cross vLLM's msgpack RPC"):
        plain(((rebuild_cuda_tensor, exported), "GPU-uuid"), "hacrl_map_cuda_buffer")
