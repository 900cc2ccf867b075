"""The faults that end a run in one line: an allocation failure (`is_out_of_memory`, on the GPU or the CPU),
what the run can continue from (`checkpoints_note`), and a generation that ran out of memory
(`generation_failed`, raised by the DataModule; an update's failure is `module.update_failed`).
Deliberately not here: catching them (the DataModule and the module do) and printing them (the scripts).
"""

from __future__ import annotations

import torch

from hacrl_lightning.errors import RunFailed

__all__ = ["GenerationFailed", "checkpoints_note", "generation_failed", "is_out_of_memory"]


OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")
"""How an allocation failure reads: CUDA's, the CPU allocator's ("DefaultCPUAllocator: can't allocate memory"),
the operating system's."""


def is_out_of_memory(err: BaseException) -> bool:
    """True for an allocation failure on the GPU or the CPU (whatever exception type carries it)."""
    return isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)) or \
        any(words in str(err).lower() for words in OUT_OF_MEMORY)


def checkpoints_note(run_dir: str) -> str:
    """What a failed run can continue from: its newest checkpoint, or that none was written yet."""
    from pathlib import Path

    if any(Path(run_dir, "checkpoints").glob("step_*.ckpt")):
        return (f"Checkpoints already written are intact; resume={run_dir} continues from the newest if the cause "
                "has passed (memory another process held)")
    return "No checkpoint was written yet (nothing to resume): start the run again once the cause is fixed"


class GenerationFailed(RunFailed):
    """The engine ran out of memory generating the step's responses: the run ends naming the agent and the
    settings that size generation."""


def generation_failed(name: str, step: int, err: BaseException, generation_batch_size: int, max_response_len: int,
                      run_dir: str, *, backend: str = "hf") -> GenerationFailed:
    """The `GenerationFailed` for an out-of-memory `err` raised while agent `name` generated in step `step`."""
    first = (str(err).strip().splitlines() or [""])[0]
    return GenerationFailed(
        f"agent {name!r}: generating the responses of training step {step + 1} ran out of memory "
        f"({type(err).__name__}: {first}). Fix: lower rollout.generation_batch_size (now {generation_batch_size}: "
        f"sequences generated at once) or agents.{name}.max_response_len (now {max_response_len})"
        + (", or use rollout=vllm on a GPU" if backend == "hf" else f", or agents.{name}.gpu_memory_utilization")
        + f". {checkpoints_note(run_dir)}")
