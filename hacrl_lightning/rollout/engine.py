"""The rollout engine contract: token ids in, sampled token ids + finish reasons + log-probs out.

One engine serves one agent. Engines know nothing about tokenizers, chat templates, rewards or
other agents (DESIGN §3): the caller encodes prompts with the agent's own chat template and
decodes what comes back. `make_engine` picks the backend by name, so the training loop never
knows which one runs. Deliberately not here: weight export formats (each backend's own module).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingSettings:
    """What to sample. The defaults are plain sampling: no top-k, no nucleus (HF would otherwise
    apply top_k=50, engineering.md §0.9). temperature == 0 means greedy."""

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    return_logprobs: bool = True
    """Fill `Generation.logprobs`. The training step recomputes old log-probs with a forward pass, so
    the DataModule turns this off: the HF backend then skips keeping a [batch, vocab] score tensor per
    generated token (docs/PERFORMANCE.md)."""
    min_new_tokens: int = 0
    """Stop tokens are masked until this many tokens are out (0: off). The benchmark sets it to
    `max_new_tokens` so that two paths generate exactly the same number of tokens."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def for_agent(cls, cfg, *, n: int, seed: int | None, temperature: float | None = None,
                  max_new_tokens: int | None = None) -> "SamplingSettings":
        """An agent's own sampling (`AgentConfig`: temperature, top_p, top_k, max_response_len), the one
        builder every caller uses; `temperature=0.0` asks for greedy answers. No engine log-probs: the
        training step recomputes old log-probs with a forward pass, and HF `generate` would keep a
        [batch, vocab] score tensor per token for them."""
        return cls(max_new_tokens=cfg.max_response_len if max_new_tokens is None else max_new_tokens, n=n,
                   temperature=cfg.temperature if temperature is None else temperature, top_p=cfg.top_p,
                   top_k=cfg.top_k, seed=seed, return_logprobs=False)


@dataclass
class Generation:
    """One sampled response, in the generating agent's token space.

    `token_ids` include the terminal stop token when `finish_reason == "stop"`; `logprobs[t]` is the
    engine's log-probability of `token_ids[t]` under the sampling distribution (temperature applied);
    empty when the settings said `return_logprobs=False`.
    """

    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[float] = field(default_factory=list)


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        """`sampling.n` generations per prompt, grouped: result[p * n + i] is sample i of prompt p."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the next `generate` use `model`'s current weights."""


BACKENDS = ("hf", "vllm")


def make_engine(backend: str, model: torch.nn.Module, **options) -> RolloutEngine:
    """Build the engine of `backend` (`hf` or `vllm`) for one agent's model."""
    if backend == "hf":
        from hacrl_lightning.rollout.hf import HFEngine

        return HFEngine(model, **options)
    if backend == "vllm":
        from hacrl_lightning.rollout.vllm import VLLMEngine

        return VLLMEngine(model, **options)
    raise ValueError(f"rollout.backend={backend!r} is unknown: allowed {list(BACKENDS)}; use rollout=hf or rollout=vllm")


def engine_options(agent, backend: str, *, batch_size: int, seed: int = 0,
                   gpu_memory_utilization: float | None = None, export_to: str | os.PathLike | None = None) -> dict:
    """`make_engine` options for one agent (an `Agent`: token ids, lengths, export).

    vLLM loads weights from a Hugging Face dir, so the agent is first exported to `export_to`
    (default `engine_dirs/<name>`; also the dir its weight sync writes to); its memory share is the
    agent's own `gpu_memory_utilization` unless one is given for all.
    """
    options = dict(eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id, batch_size=batch_size)
    if backend == "vllm":
        share = agent.cfg.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
        options.update(model_dir=agent.export(Path(export_to or Path("engine_dirs") / agent.name)), gpu_memory_utilization=share,
                       seed=seed, max_model_len=agent.max_prompt_len + agent.max_response_len, dtype=agent.cfg.dtype)
    return options
