"""A stand-in for a vLLM engine in a process of its own, for the weight sync where vLLM is absent (the lent GPU's
image has none; `gpu_check.py`'s `sync` part): a child process holding the agent's model (transformers) at the
engine's dtype on the trainer's device, driven through a pipe with the calls `vllm_sync.SharedMemorySync` makes
of `collective_rpc`. Its worker is `vllm_worker.WorkerExtension` itself (the buffer's mapping, shared file or CUDA
IPC handle, and the reading of each bucket, row ranges put together); only vLLM's layerwise reload and
`load_weights` are replaced, by a copy into the model's tensors by name (`StandInWorker`), and the file path's
reload by reading the safetensors file.

Deliberately not here: vLLM's loader (its name mapping, fused and repacked weights), which the vLLM lane
(tests/test_vllm.py) runs with the same sync into real engines.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from hacrl_lightning.rollout.vllm_worker import WorkerExtension, release_copies


class StandInWorker(WorkerExtension):
    """`WorkerExtension` over a transformers model: the vLLM calls replaced by copies into `model`'s tensors."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.tensors = model.state_dict(keep_vars=False)
        self.loaded: set[str] = set()

    def hacrl_begin_weights(self) -> None:
        self.hacrl_partial, self.loaded = {}, set()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()

    def hacrl_load_bucket(self, entries: list) -> None:
        self._load(self.hacrl_read_bucket(entries))

    def hacrl_end_weights(self) -> None:
        incomplete, self.hacrl_partial = sorted(self.hacrl_partial), {}
        release_copies(getattr(self, "hacrl_buffer", None))
        if incomplete:
            raise RuntimeError(f"weights whose last rows never arrived: {incomplete}")

    def hacrl_load_file(self, path: str) -> None:
        """The file path's reload: every tensor of the safetensors file at `path`."""
        from safetensors.torch import load_file

        device = next(iter(self.tensors.values())).device
        self.hacrl_begin_weights()
        self._load(load_file(path, device=str(device)).items())

    def _load(self, items) -> None:
        with torch.no_grad():
            for name, tensor in items:
                if name not in self.tensors:
                    raise KeyError(f"the engine has no weight {name!r}")
                self.tensors[name].copy_(tensor)
                self.loaded.add(name)

    def hacrl_report(self) -> dict:
        """What the last sync loaded, each tensor's float64 sum (to compare with the trainer's cast), and on CUDA
        the peak memory the sync took above what the engine held before it (bytes)."""
        out = {"loaded": sorted(self.loaded)}
        if torch.cuda.is_available():  # read before the sums below allocate
            out["extra_bytes"] = torch.cuda.max_memory_allocated() - self.before
        out["sums"] = {name: t.double().sum().item() for name, t in self.tensors.items()}
        return out

    @torch.no_grad()
    def hacrl_greedy(self, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
        device = next(iter(self.tensors.values())).device
        ids = torch.tensor(prompt_ids, device=device)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()


def serve(conn, model_dir: str, dtype: str, device: str) -> None:
    """The child's loop: load the model, then answer (method, args) until `close`."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        worker = StandInWorker(model)
        conn.send(("ok", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        method, args = conn.recv()
        if method == "close":
            return
        try:
            conn.send(("ok", getattr(worker, method)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


PLAIN = (str, int, float, bool, bytes, type(None))


def plain(value, where: str) -> None:
    """Refuse what vLLM could not send to its engine process: a call's arguments cross as msgpack there, which
    takes plain values only (no functions, classes, dtypes or tensors); the pipe here would pickle anything."""
    if isinstance(value, (list, tuple)):
        for item in value:
            plain(item, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            plain(key, where)
            plain(item, where)
    elif not isinstance(value, PLAIN):
        raise TypeError(f"{where}: an argument of type {type(value).__name__} cannot cross vLLM's msgpack RPC")


class StandInEngine:
    """The parent's side: `collective_rpc` as `vllm.LLM` has it (one worker: a list of one result)."""

    def __init__(self, model_dir: str | Path, *, dtype: str, device: str):
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a CUDA context cannot be forked
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, str(model_dir), dtype, device), daemon=True)
        self.process.start()
        self._answer()

    def _answer(self):
        status, result = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"the stand-in engine failed:\n{result}")
        return result

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        plain(args, method)
        self.conn.send((method, tuple(args)))
        return [self._answer()]

    def close(self) -> None:
        try:
            self.conn.send(("close", ()))
        except OSError:
            pass
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
