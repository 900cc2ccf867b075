"""torch.compile of the agents' log-prob passes (`trainer.compile`): the old log-probs', the update's and the KL
reference's forward and backward.

`compile_agent` compiles each transformer block of an agent's model in place (`nn.Module.compile`: the blocks the
model lists in `_no_split_modules`, those FSDP2 shards one by one, `strategies.shard_agent`), as the torch
distributed recipes (torchtune, torchtitan) compile per block under FSDP2; a LoRA agent's blocks carry their
adapters. The agent's `token_logprobs` then pads its rows to a multiple of `agents.agent.COMPILE_BUCKET` columns (few
distinct lengths, so few recompiles) and runs the output layer's chunks through a compiled log-softmax
(`agents.agent.head_logprobs`). Compile before FSDP2 shards the blocks, and after the KL reference is copied from
its policy (a deep copy of a compiled block would call the original's forward). `compile_metrics` reads torch's
own counters: the graphs compiled (recompiles included) and the seconds spent compiling, which
`callbacks/timing.py` keeps out of the step's clock, from the step's start (its rollout's compile included).

Deliberately not here: generation (the engines run eager: `rollout/hf.py` under `torch.compiler.set_stance`, vLLM its
own model), the embedding, final norm and optimizer step (not compiled), and CUDA graphs.
"""

from __future__ import annotations

import torch

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.agents.lora import is_lora

__all__ = ["compile_agent", "compile_metrics", "compile_seconds", "compile_wanted"]


def compile_wanted(setting: str, accelerator: str = "auto") -> bool:
    """`trainer.compile` decided: `true`, `false`, or `auto`, on where the run computes on CUDA (`accelerator` not
    `cpu` and a GPU present)."""
    value = str(setting).lower()
    if value == "auto":
        return accelerator != "cpu" and torch.cuda.is_available()
    return value == "true"


def compile_agent(agent: Agent, *, backend: str = "inductor") -> int:
    """Compile each transformer block of `agent` in place and its log-prob chunks (`Agent.compile_backend`), with
    the torch.compile `backend` (`eager`: dynamo's capture without inductor). Returns the blocks compiled."""
    model = agent.model.get_base_model() if is_lora(agent.model) else agent.model
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    for block in blocks:
        block.compile(backend=backend)
    agent.compile_backend = backend
    return len(blocks)


def compile_seconds() -> float:
    """Seconds torch has spent compiling in this process so far: dynamo's captures with their forward compiles,
    and the backward compiles (which inductor runs at the first backward). 0.0 before anything imported dynamo
    (nothing compiled), without importing it: the DataModule reads it at every step's start."""
    import sys

    if "torch._dynamo.utils" not in sys.modules:
        return 0.0
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_TIME_KEYS))


COMPILE_TIME_KEYS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")
"""torch._dynamo's timers (`compilation_time_metrics`) of a capture with its forward compile, and of inductor's
backward compile, which runs at the first backward."""


def compile_metrics() -> dict[str, float]:
    """`compile/graphs` (the graphs dynamo captured: one per block kind, grad mode and bucket until its length is
    marked dynamic, and one more for each recompile) and `time/compile` (`compile_seconds`), over this process so
    far."""
    from torch._dynamo.utils import counters

    return {"compile/graphs": float(counters["stats"]["unique_graphs"]), "time/compile": compile_seconds()}
