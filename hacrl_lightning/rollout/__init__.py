"""Rollout: one engine per agent, token ids in, sampled token ids + finish reasons + log-probs out.

The contract (`RolloutEngine`, `SamplingSettings`, `Generation`, `FinishReason`) is `engine.py`; the
backends are `hf.py` (transformers generate, CPU or GPU) and `vllm.py` (GPU, the optional [vllm]
extra). `make_engine(backend, model, **options)` builds one by name and `engine_options(agent, ...)`
gives an agent's options, so callers never import a backend. Deliberately not here: tokenizers,
chat templates, rewards (engines speak token ids only, docs/engineering.md §13).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

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


DEFAULT_SHARE = 0.3
"""An engine's share of a GPU's memory where `agents.<key>.gpu_memory_utilization` is null."""
CPU_ENGINES_SHARE = 0.25
"""On vLLM's CPU build: the part of the machine's memory that the KV caches of the engines whose share is null
divide among them (the trainer processes, the engines' weights and their processes need the rest)."""


def engine_shares(shares: dict[str, float | None], engines_per_agent: dict[str, int], *, total_bytes: int,
                  available_bytes: int, platform: str) -> tuple[dict[str, float], list[tuple], str]:
    """Each agent's engine memory share on this host, what cannot fit, and what was decided, before any engine
    starts. `shares`: `agents.<key>.gpu_memory_utilization` (None: not set); `engines_per_agent`: that agent's
    engines on this host (its ranks here). On a GPU a null share is `DEFAULT_SHARE` (the memory plan checks
    what a GPU holds). On vLLM's CPU build, where a share is the machine's memory its KV cache takes, the
    shares of every engine on the host are summed: the set ones must fit in the memory available now (else a
    problem line, with the figures and the setting), and the null ones divide `CPU_ENGINES_SHARE` of the
    machine's memory, less the set ones, equally (at most `DEFAULT_SHARE` each). Returns (shares, problems as
    (key, value, allowed, fix), a line saying what was decided, empty when nothing was)."""
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    if platform != "cpu":
        return {name: DEFAULT_SHARE if share is None else share for name, share in shares.items()}, [], ""
    fixed = {name: share for name, share in shares.items() if share is not None}
    wanted = sum(share * engines_per_agent[name] for name, share in fixed.items()) * total_bytes
    problems = []
    if fixed and wanted > available_bytes:
        name = max(fixed, key=lambda n: fixed[n] * engines_per_agent[n])
        parts = " + ".join(f"{engines_per_agent[n]} x {fixed[n]:g} ({n})" for n in fixed)
        problems.append((f"agents.{name}.gpu_memory_utilization", fixed[name],
                         f"shares whose KV caches fit in this machine's free memory: its engines ask for {parts} of "
                         f"{gib(total_bytes)}, {gib(wanted)}, and {gib(available_bytes)} are free",
                         f"lower the shares, or leave them unset (the engines then share {CPU_ENGINES_SHARE:g} of the "
                         "machine's memory)"))
    auto = [name for name, share in shares.items() if share is None]
    count = sum(engines_per_agent[name] for name in auto)
    left = max(0.0, CPU_ENGINES_SHARE - sum(share * engines_per_agent[n] for n, share in fixed.items()))
    each = min(DEFAULT_SHARE, left / count) if count else 0.0
    if auto and each <= 0:
        problems.append((f"agents.{auto[0]}.gpu_memory_utilization", None,
                         f"room for its engines: the shares set for the others take {CPU_ENGINES_SHARE:g} of the machine's "
                         "memory or more", "lower the others' shares, or set this one"))
    line = (f"vLLM (CPU): {count} engine(s) on this machine without a memory share ({', '.join(auto)}): each engine's KV "
            f"cache takes {each:.4g} of its memory ({gib(each * total_bytes)}; agents.<key>.gpu_memory_utilization "
            "sets it)") if auto else ""
    return {**{name: each for name in auto}, **fixed}, problems, line


def engine_options(agent, backend: str, *, batch_size: int, seed: int = 0,
                   gpu_memory_utilization: float | None = None, export_to: str | os.PathLike | None = None,
                   in_process: bool = False, writes: bool | None = None, sleep: bool = False) -> dict:
    """`make_engine` options for one agent (an `Agent`: token ids, lengths, export).

    vLLM loads weights from a Hugging Face dir, so the agent is first exported to `export_to`
    (default `engine_dirs/<name>`; also the dir its weight sync writes to); its memory share is the
    agent's own `gpu_memory_utilization` unless one is given for all. `in_process`: the engine's
    worker in this process (`RolloutConfig.vllm_in_process`); `writes`: whether this rank writes that export
    (`Agent.export`); `sleep`: the engine sleeps between rollouts (`RolloutConfig.sleep`, vLLM on CUDA).
    """
    options = dict(eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id, batch_size=batch_size)
    if backend == "vllm":
        share = agent.cfg.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
        share = DEFAULT_SHARE if share is None else share
        options.update(model_dir=agent.export(Path(export_to or Path("engine_dirs") / agent.name), writes=writes), gpu_memory_utilization=share,
                       seed=seed, max_model_len=agent.max_prompt_len + agent.max_response_len, dtype=agent.cfg.dtype,
                       in_process=in_process, **(dict(sleep=True) if sleep else {}))
    return options
