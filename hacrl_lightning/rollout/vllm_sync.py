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
weights, and under FSDP2 what one gather holds: a weight up to the bucket's size gathered whole, a larger one in row
ranges of a quarter bucket (`row_items`, `gather_rows`; a LoRA model's weights whole, to merge the adapters), never a
copy of the model; what vLLM's reload itself takes in the engine is
vLLM's (`bench.py sync` measures both). A failed push leaves the engine stale (`VLLMEngine` then refuses to
generate until a sync completes).

The buffer is a file in `/dev/shm` (memory, not disk) where that exists and has the room, else beside the
engine's model directory; it is unlinked once every worker has mapped it, so nothing is left behind by a crash. Where
the trainer's weights are on a GPU, the buffer is instead a block of that GPU's memory, which every worker maps
through a CUDA IPC handle (sent once per buffer; the worker finds the trainer's GPU among its own by its UUID): the
weights go GPU -> GPU, never through host memory. The trainer waits for its copies into the buffer before a bucket
is sent, and a worker for its copies out of it before its call returns, so a bucket is never overwritten while
read. A worker that cannot see the trainer's GPU (an engine on another device) refuses the handle, and the sync
then stages its buckets in host shared memory, said once (`transport` tells which).
Deliberately not here: the file path (`vllm.write_weights`, the portable fallback, `rollout.weight_sync=file`)
and engines in the trainer's process (they take the tensors themselves).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Union

import torch

ALIGN = 64
"""Byte alignment of each tensor in the buffer (any dtype's element size divides it)."""
SHM_DIR = Path("/dev/shm")


class Rows(NamedTuple):
    """Rows `first` .. `first + len(data)` of the weight `name` of shape `shape` (a weight gathered in row ranges)."""

    name: str
    shape: tuple
    first: int
    data: torch.Tensor


Item = Union[tuple[str, torch.Tensor], Rows]
"""What `SharedMemorySync.push` takes: a whole weight (name, tensor), or some of its rows."""


def is_row_sharded(tensor) -> bool:
    """A DTensor sharded along its first dimension over a 1-D mesh (how FSDP2's `fully_shard` holds a weight)."""
    placements = getattr(tensor, "placements", None)
    return (placements is not None and len(placements) == 1 and tensor.device_mesh.ndim == 1
            and getattr(placements[0], "dim", None) == 0 and tensor.dim() > 0)


def gather_rows(tensor, first: int, rows: int) -> torch.Tensor:
    """Rows `first` .. `first + rows` of a row-sharded DTensor (`is_row_sharded`), whole, on every rank of its mesh
    (a collective): each rank gives its shard's part of the range, padded to the widest part (FSDP2 cuts a weight as
    `torch.chunk` does, so every rank knows every part's size without asking), and one all_gather brings them."""
    import torch.distributed as dist

    mesh, total = tensor.device_mesh, tensor.shape[0]
    world, rank = mesh.size(), mesh.get_local_rank()
    chunk = -(-total // world)
    parts = [max(0, min(first + rows, (r + 1) * chunk, total) - max(first, r * chunk)) for r in range(world)]
    local = tensor.to_local()
    if local.shape[0] != max(0, min(total, (rank + 1) * chunk) - rank * chunk):
        raise RuntimeError(f"a shard of {local.shape[0]} rows on rank {rank}: not torch.chunk's cut of {total} rows")
    width = max(parts)
    mine = local.new_zeros((width, *local.shape[1:]))
    begin = max(first, rank * chunk) - rank * chunk
    mine[:parts[rank]] = local[begin:begin + parts[rank]]
    pieces = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(pieces, mine, group=mesh.get_group())
    return torch.cat([piece[:size] for piece, size in zip(pieces, parts) if size])


def row_items(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Item]:
    """`items` (name, tensor; DTensors not yet gathered) with every DTensor gathered: whole where it is at most
    `bucket_bytes` (as before row ranges existed: one gather), else, where it is row-sharded, in row ranges of at most
    a quarter bucket (`Rows`). Under FSDP2 a gather holds about two copies of what it gathers (its parts and its
    output), so a sync's extra memory beyond the buffer is then at most about two buckets, not two copies of the
    largest weight. A collective on every rank of the mesh, in the same order."""
    for name, tensor in items:
        if not hasattr(tensor, "full_tensor"):
            yield name, tensor
        elif is_row_sharded(tensor) and tensor.numel() * tensor.element_size() > bucket_bytes:
            row_bytes = tensor.numel() // tensor.shape[0] * tensor.element_size()
            step = max(1, bucket_bytes // 4 // max(row_bytes, 1))
            for first in range(0, tensor.shape[0], step):
                yield Rows(name, tuple(tensor.shape), first, gather_rows(tensor, first, min(step, tensor.shape[0] - first)))
        else:
            yield name, tensor.full_tensor()


def cuda_handle(exported: tuple) -> dict:
    """The plain values of `torch.multiprocessing.reductions.reduce_tensor`'s arguments for a CUDA uint8 tensor
    (`vllm_worker.WorkerExtension.hacrl_map_cuda_buffer` rebuilds it from them)."""
    return dict(storage=exported[7], storage_bytes=exported[8], offset_bytes=exported[9], counter=exported[11],
                counter_offset=exported[12], event=exported[13], event_sync=exported[14])


def _last_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


class SharedMemorySync:
    """Trainer side of the shared-memory weight sync of one engine (`llm`: a `vllm.LLM` built with
    `worker_extension_cls=vllm_worker.WorkerExtension`). `bucket_mb`: the buffer's size in MiB (`rollout.weight_sync_mb`);
    a larger weight is sent in row ranges, and the buffer grows only for a single row larger than the bucket. The
    buffer is host shared memory, or the trainer's GPU memory where its weights are on one (`transport`)."""

    def __init__(self, llm, *, dtype: torch.dtype, bucket_mb: float, near: Path, cuda_ipc: bool = True):
        self.llm, self.dtype = llm, dtype
        self.cuda_ipc = cuda_ipc
        """Weights on a GPU go through CUDA IPC (False: staged in host shared memory, as the GPU check compares)."""
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.near = near
        self.device: torch.device | None = None
        self.buffer: torch.Tensor | None = None
        self.buffer_bytes = 0
        self.buckets_sent = 0
        """Buckets of the last sync (for tests and `bench.py sync`)."""
        self.transport: str | None = None
        """`cuda_ipc` (the buffer in the trainer's GPU memory) or `host` (a shared file); set by the first push."""

    def _choose_transport(self, device: torch.device) -> None:
        """At the first push: `cuda_ipc` where the first weight is on a GPU and the workers map a block of it,
        else `host`."""
        self.transport = "host"
        if device.type != "cuda" or not self.cuda_ipc:
            return
        try:
            self._map_cuda(self.bucket_bytes, device)
            self.transport = "cuda_ipc"
        except Exception as err:  # e.g. the engine's workers do not see this GPU
            warnings.warn(f"the vLLM weight sync stages its buckets in host shared memory: no CUDA IPC buffer on "
                          f"{device} that the engine's workers map ({_last_line(err)})",
                          stacklevel=3)

    def _map_cuda(self, nbytes: int, device: torch.device) -> None:
        """A block of `nbytes` of `device`'s memory, mapped by every worker through one CUDA IPC handle. Only
        plain values cross (`cuda_handle`): vLLM sends a call to its engine process as msgpack, which refuses the
        function, classes and dtype of torch's own `reduce_tensor` tuple."""
        from torch.multiprocessing.reductions import reduce_tensor

        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        _, exported = reduce_tensor(buffer)
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        try:
            self.llm.collective_rpc("hacrl_map_cuda_buffer", args=(cuda_handle(exported), nbytes, uuid))
        except BaseException:
            # no worker took the handle: torch keeps an exported block until a reader lets it go
            try:
                torch.UntypedStorage._release_ipc_counter(exported[11], exported[12], device=device.index)
            except Exception:
                pass
            raise
        self.buffer, self.buffer_bytes = buffer, nbytes  # only once every worker has mapped it

    def _ensure_buffer(self, nbytes: int) -> None:
        """Map (or grow) the shared buffer to at least `nbytes`. `cuda_ipc`: a new block of the same GPU.
        `host`: a file in `/dev/shm`, its space reserved (a container's `/dev/shm` may be smaller than a bucket:
        writing past it would kill the process), else beside the engine's model directory; every worker maps the
        same file, then it is unlinked."""
        if self.buffer is not None and self.buffer_bytes >= nbytes:
            return
        if self.transport == "cuda_ipc":
            self.buffer = None  # the old block goes once the workers map the new one
            self._map_cuda(nbytes, self.device)
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

    def push(self, items: Iterable[Item]) -> None:
        """Send every (name, tensor) of `items` (full tensors, read lazily) to the engine, one bucket at a time:
        each tensor is copied into the buffer as it arrives (under FSDP2 it is gathered just before), whole where
        it fits the room left, else in row ranges that do. An entry is (name, dtype, shape, byte offset, first row,
        rows); rows = shape[0] (or 1 for a scalar) is the whole tensor. A `Rows` item is placed the same way, from its
        first row on."""
        self.llm.collective_rpc("hacrl_begin_weights")
        entries, used, sent = [], 0, 0
        failed = None
        try:
            for item in items:
                if isinstance(item, Rows):
                    name, shape, offset, tensor = item.name, list(item.shape), item.first, item.data
                else:
                    (name, tensor), offset = item, 0
                    shape = list(tensor.shape)
                if self.transport is None:
                    self.device = tensor.device
                    self._choose_transport(tensor.device)
                dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
                rows = tensor.shape[0] if tensor.dim() and tensor.numel() else 1  # a scalar or an empty tensor: whole
                row_bytes = tensor.numel() * dtype.itemsize // rows
                first = 0
                while first < rows:
                    start = -(-used // ALIGN) * ALIGN
                    room = max(self.bucket_bytes, self.buffer_bytes) - start
                    take = rows - first if (rows - first) * row_bytes <= room else room // max(row_bytes, 1)
                    if take < 1 and entries:  # not a row more fits: send the bucket
                        self._send(entries)
                        entries, used, sent = [], 0, sent + 1
                        continue
                    take = max(take, 1)  # a row larger than the bucket: the buffer grows to it
                    nbytes = take * row_bytes
                    self._ensure_buffer(max(start + nbytes, self.bucket_bytes))  # grows only between buckets
                    piece = tensor if take == rows else tensor[first:first + take]
                    view = self.buffer[start:start + nbytes].view(dtype).view(piece.shape)
                    view.copy_(piece.detach())  # the cast, straight into the buffer (GPU -> host for `host` on a GPU)
                    entries.append((name, str(dtype).removeprefix("torch."), shape, start, offset + first, take))
                    used, first = start + nbytes, first + take
            if entries:
                self._send(entries)
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

    def _send(self, entries: list) -> None:
        """One bucket to every worker; on a GPU, once this process's copies into the buffer are done (the workers
        read it on their own streams; each returns once its copies out of it are done)."""
        if self.buffer.is_cuda:
            torch.cuda.synchronize(self.buffer.device)
        self.llm.collective_rpc("hacrl_load_bucket", args=(entries,))

    def close(self) -> None:
        """Let go of the buffer; a GPU buffer is unmapped by the workers first (their mapping holds it), while the
        engine still runs."""
        if self.transport == "cuda_ipc" and self.buffer is not None:
            try:
                self.llm.collective_rpc("hacrl_unmap_buffer")
            except Exception:
                pass  # the engine is gone: its mapping went with it
            self.buffer = None
            torch.cuda.ipc_collect()
        self.buffer = None
