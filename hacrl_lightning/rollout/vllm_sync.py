"""Weight sync for a vLLM engine in a process of its own, without a disk round trip: the weights go in bounded
buckets through one shared-memory buffer that the trainer and the engine's workers both map.

`SharedMemorySync` (trainer side) casts each weight to the engine's dtype straight into the buffer; a weight larger
than the room left goes in row ranges (along its first dimension) over as many buckets as it needs, so the buffer is
never larger than the bucket (`rollout.weight_sync_mb`), unless a single row is. When the next piece would not fit,
the bucket is sent: one `collective_rpc` carrying only names, dtypes, shapes, offsets and row ranges, and every
worker (`vllm_worker.WorkerExtension`, vLLM's `worker_extension_cls`) loads those tensors, putting a weight that came
in row ranges together before vLLM sees it. A sync is one vLLM
layerwise reload (the same `initialize_layerwise_reload` ... `finalize_layerwise_reload` that `reload_weights`
runs, and that vLLM's own weight-transfer engines run around their chunks), so a layer whose weights arrive over
two buckets is processed (repacked for the CPU kernels) once it is complete. Workers copy a bucket's tensors out
of the buffer before loading (the reload holds a partly loaded layer's tensors until the layer is complete, and
the buffer is refilled with the next bucket). The trainer holds the buffer (kept mapped between syncs) beyond its
weights, and under FSDP2 one gathered tensor (`vllm.full_state_items` gathers each weight whole), never a copy of
the model; what vLLM's reload itself takes in the engine is
vLLM's (`bench.py sync` measures both). A failed push leaves the engine stale (`VLLMEngine` then refuses to
generate until a sync completes).

The buffer is a file in `/dev/shm` (memory, not disk) where that exists and has the room, else beside the
engine's model directory; it is unlinked once every worker has mapped it, so nothing is left behind by a crash. On CUDA the
bucket is staged in host memory too (GPU -> host -> GPU, no disk): CUDA IPC handles are not implemented here.
Deliberately not here: the file path (`vllm.write_weights`, the portable fallback, `rollout.weight_sync=file`)
and engines in the trainer's process (they take the tensors themselves).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

import torch

ALIGN = 64
"""Byte alignment of each tensor in the buffer (any dtype's element size divides it)."""
SHM_DIR = Path("/dev/shm")


class SharedMemorySync:
    """Trainer side of the shared-memory weight sync of one engine (`llm`: a `vllm.LLM` built with
    `worker_extension_cls=vllm_worker.WorkerExtension`). `bucket_mb`: the buffer's size in MiB (`rollout.weight_sync_mb`);
    a larger weight is sent in row ranges, and the buffer grows only for a single row larger than the bucket."""

    def __init__(self, llm, *, dtype: torch.dtype, bucket_mb: float, near: Path):
        self.llm, self.dtype = llm, dtype
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.near = near
        self.buffer: torch.Tensor | None = None
        self.buffer_bytes = 0
        self.buckets_sent = 0
        """Buckets of the last sync (for tests and `bench.py sync`)."""

    def _ensure_buffer(self, nbytes: int) -> None:
        """Map (or grow) the shared buffer to at least `nbytes`: a file in `/dev/shm`, its space reserved (a
        container's `/dev/shm` may be smaller than a bucket: writing past it would kill the process), else beside
        the engine's model directory; every worker maps the same file, then it is unlinked."""
        if self.buffer is not None and self.buffer_bytes >= nbytes:
            return
        folders = [SHM_DIR] if SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK) else []
        for folder in [*folders, self.near]:
            handle, path = tempfile.mkstemp(prefix="hacrl-weights-", dir=folder)
            try:
                try:
                    os.posix_fallocate(handle, 0, nbytes)
                except OSError:
                    if folder != self.near:
                        continue  # /dev/shm too small: the next folder
                    raise
                finally:
                    os.close(handle)
                buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
                self.llm.collective_rpc("hacrl_map_buffer", args=(path, nbytes))
                self.buffer, self.buffer_bytes = buffer, nbytes  # only once every worker has mapped it
                return
            finally:
                Path(path).unlink(missing_ok=True)

    def push(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send every (name, tensor) of `items` (full tensors, read lazily) to the engine, one bucket at a time:
        each tensor is copied into the buffer as it arrives (under FSDP2 it is gathered just before), whole where
        it fits the room left, else in row ranges that do. An entry is (name, dtype, shape, byte offset, first row,
        rows); rows = shape[0] (or 1 for a scalar) is the whole tensor."""
        self.llm.collective_rpc("hacrl_begin_weights")
        entries, used, sent = [], 0, 0
        failed = None
        try:
            for name, tensor in items:
                dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
                rows = tensor.shape[0] if tensor.dim() and tensor.numel() else 1  # a scalar or an empty tensor: whole
                row_bytes = tensor.numel() * dtype.itemsize // rows
                first = 0
                while first < rows:
                    start = -(-used // ALIGN) * ALIGN
                    room = max(self.bucket_bytes, self.buffer_bytes) - start
                    take = rows - first if (rows - first) * row_bytes <= room else room // max(row_bytes, 1)
                    if take < 1 and entries:  # not a row more fits: send the bucket
                        self.llm.collective_rpc("hacrl_load_bucket", args=(entries,))
                        entries, used, sent = [], 0, sent + 1
                        continue
                    take = max(take, 1)  # a row larger than the bucket: the buffer grows to it
                    nbytes = take * row_bytes
                    self._ensure_buffer(max(start + nbytes, self.bucket_bytes))  # grows only between buckets
                    piece = tensor if take == rows else tensor[first:first + take]
                    view = self.buffer[start:start + nbytes].view(dtype).view(piece.shape)
                    view.copy_(piece.detach())  # the cast, straight into the buffer (from GPU: the copy to host)
                    entries.append((name, str(dtype).removeprefix("torch."), list(tensor.shape), start, first, take))
                    used, first = start + nbytes, first + take
            if entries:
                self.llm.collective_rpc("hacrl_load_bucket", args=(entries,))
                sent += 1
        except BaseException as err:
            failed = err
            raise
        finally:
            try:
                self.llm.collective_rpc("hacrl_end_weights")
            except Exception:
                if failed is None:
                    raise  # else the first error is the one to see
        self.buckets_sent = sent

    def close(self) -> None:
        self.buffer = None
