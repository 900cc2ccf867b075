"""Rollout: one engine per agent, token ids in, sampled token ids + finish reasons + log-probs out.

The contract (`RolloutEngine`, `SamplingSettings`, `Generation`, `FinishReason`) is `engine.py`; the
backends are `hf.py` (transformers generate, CPU or GPU) and `vllm.py` (GPU, the optional [vllm]
extra). `make_engine(backend, model, **options)` builds one by name and `engine_options(agent, ...)`
gives an agent's options, so callers never import a backend. Deliberately not here: tokenizers,
chat templates, rewards (engines speak token ids only, docs/engineering.md §13).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from hacrl_lightning.config import RolloutConfig
from hacrl_lightning.placement import DEFAULT_SHARE
from hacrl_lightning.rollout.engine import (
    BACKENDS,
    FINISH_REASONS,
    FinishReason,
    Generation,
    RolloutEngine,
    SamplingSettings,
)

__all__ = [
    "BACKENDS",
    "FINISH_REASONS",
    "FinishReason",
    "Generation",
    "RolloutEngine",
    "SamplingSettings",
    "close_engines",
    "engine_options",
    "make_engine",
]


def make_engine(backend: str, model: torch.nn.Module, **options) -> RolloutEngine:
    """Build the engine of `backend` (`hf` or `vllm`) for one agent's model."""
    if backend == "hf":
        from hacrl_lightning.rollout.hf import HFEngine

        return HFEngine(model, **options)
    if backend == "vllm":
        from hacrl_lightning.rollout.vllm import VLLMEngine

        return VLLMEngine(model, **options)
    raise ValueError(f"rollout.backend={backend!r} is unknown: allowed {list(BACKENDS)}; use rollout=hf or rollout=vllm")


def close_engines(engines: Sequence[RolloutEngine]) -> None:
    """Close every engine. Engines in processes of their own close side by side: each close mostly waits for its
    process to end (vLLM 0.32 on CPU gives each 5 s before it kills it), so n engines take one wait, not n. Engines
    in this process close one after another (vLLM's in-process shutdown tears down process-wide state). Every engine
    is closed even when one fails; the first failure is raised after."""
    engines = list(engines)
    apart = [engine for engine in engines if getattr(engine, "in_process", True) is False]
    failures: list[BaseException | None] = []
    if apart:
        with ThreadPoolExecutor(max_workers=len(apart), thread_name_prefix="close-engine") as pool:
            failures += [future.exception() for future in [pool.submit(engine.close) for engine in apart]]
    for engine in engines:
        if engine not in apart:
            try:
                engine.close()
            except Exception as err:  # noqa: BLE001 - the others are closed first, then it is raised
                failures.append(err)
    for failure in failures:
        if failure is not None:
            raise failure


def engine_options(agent, backend: str, *, batch_size: int, seed: int = 0,
                   gpu_memory_utilization: float | None = None, export_to: str | os.PathLike | None = None,
                   in_process: bool = False, writes: bool | None = None, sleep: bool = False,
                   weight_sync: str = RolloutConfig.weight_sync,
                   weight_sync_mb: float = RolloutConfig.weight_sync_mb, hf_cache: str = RolloutConfig.hf_cache,
                   hf_compile: str = RolloutConfig.hf_compile) -> dict:
    """`make_engine` options for one agent (an `Agent`: token ids, lengths, export).

    vLLM loads weights from a Hugging Face dir, so the agent is first exported to `export_to`
    (default `engine_dirs/<name>`; also the dir its weight sync writes to); its memory share is the
    agent's own `gpu_memory_utilization` unless one is given for all. `in_process`: the engine's
    worker in this process (`RolloutConfig.vllm_in_process`); `writes`: whether this rank writes that export
    (`Agent.export`); `sleep`: the engine sleeps between rollouts (`RolloutConfig.sleep`, vLLM on CUDA);
    `weight_sync`, `weight_sync_mb`: how an engine in its own process gets new weights (`RolloutConfig`);
    `hf_cache`, `hf_compile`: the transformers engine's KV cache, sized to the agent's lengths, and its compiled
    decode step (`RolloutConfig`).
    """
    options = dict(eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id, batch_size=batch_size)
    if backend == "hf" and hf_cache != "dynamic":
        options.update(cache=hf_cache, compile_decode=hf_compile, max_len=agent.max_prompt_len + agent.max_response_len)
    if backend == "vllm":
        share = agent.cfg.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
        share = DEFAULT_SHARE if share is None else share
        adapter = agent.cfg.lora.rank > 0 and agent.cfg.lora.engine == "adapter"  # vLLM applies the adapter itself
        options.update(model_dir=agent.export(Path(export_to or Path("engine_dirs") / agent.name), writes=writes,
                                              merged=not adapter),
                       **(dict(lora_rank=agent.cfg.lora.rank) if adapter else {}), gpu_memory_utilization=share,
                       seed=seed, max_model_len=agent.max_prompt_len + agent.max_response_len, dtype=agent.cfg.dtype,
                       in_process=in_process, weight_sync=weight_sync, weight_sync_mb=weight_sync_mb,
                       **(dict(sleep=True) if sleep else {}))
    return options
