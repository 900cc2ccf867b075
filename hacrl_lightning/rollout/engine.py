"""The rollout engine contract: token ids in, sampled token ids + finish reasons + log-probs out.

One engine serves one agent. Engines know nothing about tokenizers, chat templates, rewards or
other agents (docs/engineering.md §13): the caller encodes prompts with the agent's own chat template and
decodes what comes back. `hacrl_lightning.rollout.make_engine` picks the backend by name, so the
training loop never knows which one runs. Deliberately not here: the backends themselves (`hf.py`,
`vllm.py`: this module imports neither) and weight export formats (each backend's own module).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args, runtime_checkable

import torch

FinishReason = Literal["stop", "length"]
"""Why a response ended: its stop token (`stop`, included in the token ids) or the length limit (`length`)."""
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)


@dataclass(frozen=True)
class SamplingSettings:
    """What to sample. The defaults are plain sampling: no top-k, no nucleus (HF would otherwise
    apply top_k=50, docs/engineering.md §7). temperature == 0 means greedy."""

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
    engine's log-probability of `token_ids[t]` under the sampling distribution (temperature applied),
    NaN where the engine reported none (vLLM leaves out a stop token's); empty when the settings said
    `return_logprobs=False`.
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

    def close(self) -> None:
        """Release what the engine holds (its processes, its memory); it generates no more afterwards."""


BACKENDS = ("hf", "vllm")
"""The backends `hacrl_lightning.rollout.make_engine` builds: `hf` (`hf.py`) and `vllm` (`vllm.py`)."""
