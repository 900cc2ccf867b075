"""What runs inside a vLLM engine's worker process (vLLM's `worker_extension_cls`, given by `VLLMEngine` to every
engine in a process of its own): the engine side of the shared-memory weight sync (`vllm_sync.SharedMemorySync`)
and a shorter idle spin. The buffer is a shared file, or the trainer's GPU memory mapped through a CUDA IPC
handle (`hacrl_map_cuda_buffer`).

The idle spin: vLLM's worker reads its requests from a shared-memory queue and, after each one, busy-waits
(`sched_yield` in a loop) for a second before it sleeps on a socket (`SpinCondition.busy_loop_s = 1`, not a
setting in vLLM 0.32). An RL step leaves each engine idle between its rollout and its weight sync, so every
engine burnt a CPU core for the second after each of its calls: 1.02 s of CPU per second idle, measured, and
on a 2-core machine those spins took the cores from the trainer's update. `hacrl_spin_briefly` lowers it to
`ENGINE_SPIN_S`, long enough for the next decoding step of a generation to be read without a wake-up.
Deliberately not here: anything the trainer's process runs (`vllm.py`, `vllm_sync.py`).
"""

from __future__ import annotations

import gc
import math
from typing import Iterator

import torch

ENGINE_SPIN_S = 0.01
"""How long an engine's worker spins for its next message before it sleeps (vLLM's own: 1 s)."""


def bucket_tensors(buffer: torch.Tensor, entries: list, partial: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of one bucket of the shared buffer (uint8), as `SharedMemorySync.push` describes
    them: (name, dtype name, shape, byte offset, first row, rows). A weight sent in row ranges is put together in
    `partial` (name -> (tensor, rows received), kept by the caller across the buckets of one sync) and yielded once
    its last rows arrive. Copies: the reload may hold a partly loaded layer's tensors past this bucket, and the
    buffer is refilled by the next."""
    for name, dtype_name, shape, offset, first, rows in entries:
        dtype = getattr(torch, dtype_name)
        whole = not shape or not math.prod(shape) or rows == shape[0]
        piece_shape = shape if whole else [rows, *shape[1:]]
        data = buffer[offset:offset + math.prod(piece_shape) * dtype.itemsize].view(dtype).view(piece_shape)
        if whole:
            yield name, data.clone()
            continue
        target, received = partial.pop(name, None) or (torch.empty(shape, dtype=dtype, device=buffer.device), 0)
        target[first:first + rows].copy_(data)
        if received + rows == shape[0]:
            yield name, target
        else:
            partial[name] = (target, received + rows)


def release_copies(buffer: torch.Tensor | None) -> None:
    """After a sync through a GPU buffer: the GPU memory of the bucket copies, cached by torch's allocator outside
    vLLM's memory share, given back (vLLM's sleep does not free it)."""
    if buffer is not None and buffer.is_cuda:
        torch.cuda.empty_cache()


def cuda_index(uuid: str) -> int:
    """This process's index of the GPU whose UUID is `uuid`; LookupError where it does not see that GPU."""
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise LookupError(f"no GPU with UUID {uuid} among this process's {torch.cuda.device_count()} devices")


class WorkerExtension:
    """Mixed into each vLLM worker of an engine in its own process (`worker_extension_cls`): the `hacrl_*`
    calls. Names carry the prefix so that they cannot clash with the worker's own."""

    def hacrl_spin_briefly(self, seconds: float) -> list[float]:
        """Let every shared-memory queue this process reads spin at most `seconds` after a message before it
        waits on its socket; returns the values now set (one per queue)."""
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        readers = [obj for obj in gc.get_objects() if isinstance(obj, SpinCondition) and obj.is_reader]
        for reader in readers:
            reader.busy_loop_s = min(reader.busy_loop_s, seconds)
        return [reader.busy_loop_s for reader in readers]

    def hacrl_map_buffer(self, path: str, nbytes: int) -> None:
        self.hacrl_buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)

    def hacrl_map_cuda_buffer(self, handle: dict, nbytes: int, uuid: str) -> None:
        """Map the trainer's GPU buffer of `nbytes` from its CUDA IPC handle (`vllm_sync.cuda_handle`), if the GPU
        whose UUID is `uuid` is this worker's own (device numbers differ between processes that see different
        devices; a buffer on another GPU would put this worker's copies there): else LookupError, and the trainer
        stages its buckets in host memory."""
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        index = cuda_index(uuid)
        if index != torch.cuda.current_device():
            raise LookupError(f"the trainer's GPU (cuda:{index} here) is not this worker's (cuda:"
                              f"{torch.cuda.current_device()})")
        self.hacrl_buffer = rebuild_cuda_tensor(
            torch.Tensor, (nbytes,), (1,), 0, torch.UntypedStorage, torch.uint8, index, handle["storage"],
            handle["storage_bytes"], handle["offset_bytes"], False, handle["counter"], handle["counter_offset"],
            handle["event"], handle["event_sync"])

    def hacrl_unmap_buffer(self) -> None:
        """Let go of the buffer (a GPU buffer's block is the trainer's again once no worker maps it)."""
        buffer, self.hacrl_buffer = getattr(self, "hacrl_buffer", None), None
        if buffer is not None and buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)

    def hacrl_begin_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())
        self.hacrl_partial = {}  # weights arriving in row ranges, until their last rows come

    def hacrl_load_bucket(self, entries: list) -> None:
        from vllm.config import set_current_vllm_config

        tensors = self.hacrl_read_bucket(entries)
        if not tensors:  # a bucket of one weight's first rows: nothing is whole yet
            return
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(tensors)

    def hacrl_read_bucket(self, entries: list) -> list[tuple[str, torch.Tensor]]:
        """The bucket's whole weights, copied out of the buffer (`bucket_tensors`); on a GPU, once the copies are
        done, so that the trainer may refill the buffer as soon as this call returns."""
        tensors = list(bucket_tensors(self.hacrl_buffer, entries, self.hacrl_partial))
        if self.hacrl_buffer.is_cuda:
            torch.cuda.synchronize(self.hacrl_buffer.device)
        return tensors

    def hacrl_end_weights(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner
        incomplete, self.hacrl_partial = sorted(getattr(self, "hacrl_partial", {})), {}
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), runner.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as `reload_weights` does
            getattr(runner, reset, lambda: None)()
        release_copies(getattr(self, "hacrl_buffer", None))  # None: a sync that sent nothing
        if incomplete:  # a sync cut short: the trainer's error is the one raised (`SharedMemorySync.push`)
            raise RuntimeError(f"weights whose last rows never arrived: {incomplete}")
