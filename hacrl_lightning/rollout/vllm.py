"""vLLM backend: one offline `vllm.LLM` per agent on the GPU, weights pushed after every update.

Imported only when `rollout.backend=vllm` is selected (the `[vllm]` extra, pinned to one release
because its weight-sync API changes between releases; engineering.md §0.8, §2). Each engine gets
its own `gpu_memory_utilization` share, samples with exactly the trainer's settings (no top-k,
processed log-probs, i.e. after temperature, as the trainer recomputes them), and stops at the
agent's own EOS.

Weight sync: where the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the trained
tensors are loaded straight into the engine's model (`load_weights`). Otherwise the portable path
writes the weights into the directory the engine was built from and asks every worker to
`reload_weights` from it: that reload *is* the push, so nothing reloads after a push (TRL#5312).
Deliberately not here: sleep mode (one instance per process, engineering.md §0.7).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from hacrl_lightning.rollout.engine import Generation, SamplingSettings

INSTALL_HINT = ("the vLLM backend needs the optional extra: pip install -e '.[vllm]' on a machine with a "
                "CUDA GPU; without one, use the transformers backend: rollout=hf")


def require_vllm():
    """Import vllm, or raise a clear error naming the [vllm] extra and the HF backend."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"rollout.backend=vllm: vllm is not installed; {INSTALL_HINT}") from err
    if not torch.cuda.is_available():
        raise RuntimeError(f"rollout.backend=vllm: no CUDA GPU is visible; {INSTALL_HINT}")
    return vllm


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
                    logprobs.append(0.0)  # not reported by vLLM for an excluded stop token
            generations.append(Generation(ids, reason, logprobs))
    return generations


def _strip_wrapper_prefixes(name: str) -> str:
    for prefix in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(prefix, "")
    return name


def full_state_items(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every weight; DTensor shards are gathered (a collective on all ranks)."""
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield _strip_wrapper_prefixes(name), tensor.detach()


def write_weights(model_dir: str | os.PathLike, items: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """Replace the weights of the HF directory `model_dir` by `items` (one `model.safetensors`, written
    to a temporary name and renamed, older weight files removed). A tensor that shares its storage with an
    earlier one (tied embeddings: `lm_head.weight` is `embed_tokens.weight` when no cast copied it) is
    written once, as `save_pretrained` does; safetensors refuses shared tensors, and loaders re-tie them
    from the config's `tie_word_embeddings` (issue 25: the file sync of a tied fp32 agent failed)."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    state, seen = {}, set()
    for name, tensor in items:
        tensor = tensor.detach().cpu()
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if storage in seen:
            continue
        seen.add(storage)
        state[name] = tensor.contiguous()
    tmp = model_dir / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    for old in model_dir.glob("model*.safetensors*"):
        if old != tmp:
            old.unlink()
    return tmp.replace(model_dir / "model.safetensors")


class VLLMEngine:
    """One `vllm.LLM` for one agent. `model_dir` is the agent exported as a HF dir (also the sync dir)."""

    def __init__(self, model: torch.nn.Module, *, model_dir: str | os.PathLike, eos_token_ids: Sequence[int],
                 gpu_memory_utilization: float, max_model_len: int, dtype: str = "bfloat16", seed: int = 0,
                 enforce_eager: bool = True, **_unused):
        vllm = require_vllm()
        self.model_dir = Path(model_dir)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.dtype = getattr(torch, dtype)
        """The engine's weight dtype: the trainer's fp32 master weights are cast to it when pushed."""
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(self.model_dir), tokenizer=str(self.model_dir), dtype=dtype, seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", generation_config="vllm",
            skip_tokenizer_init=True,
        )
        self._in_process_model = self._find_in_process_model()

    def _find_in_process_model(self) -> torch.nn.Module | None:
        """The engine's nn.Module when its worker lives in this process (V1 without multiprocessing)."""
        node: Any = self.llm.llm_engine
        for path in (("model_executor", "driver_worker", "worker", "model_runner", "model"),
                     ("model_executor", "driver_worker", "model_runner", "model")):
            current = node
            for attr in path:
                current = getattr(current, attr, None)
                if current is None:
                    break
            if isinstance(current, torch.nn.Module):
                return current
        return None

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        params = self._vllm.SamplingParams(**sampling_params_kwargs(sampling, self.eos_token_ids))
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return to_generations(outputs, self.eos_token_ids + tuple(sampling.stop_token_ids))

    def sync_weights(self, model: torch.nn.Module) -> None:
        items = ((name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)  # lazily, one at a time
                 for name, tensor in full_state_items(model))
        if self._in_process_model is not None:
            self._in_process_model.load_weights(items)
        else:
            write_weights(self.model_dir, items)
            self.llm.collective_rpc("reload_weights")
        self.llm.reset_prefix_cache()
