"""Which partner responses a learner trains on: `select_cross_samples` (beyond the paper).

The paper trains every learner on all n·G responses of a prompt, so a learner's cost grows with n.
`algorithm.cross_samples_per_prompt` caps the partner responses per prompt: they are drawn
uniformly at random, without replacement, from all partners' responses to that prompt pooled
together, with a seeded `torch.Generator`. Own responses are always kept. The advantages are still
computed over the whole joint group (the baseline sees every response; only training is capped).
Deliberately not here: ordering the kept responses into mini-batches (the trainer, own first).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["select_cross_samples"]


def select_cross_samples(
    source_index: Tensor,
    prompt_index: Tensor,
    *,
    learner: int,
    per_prompt: Optional[int],
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """keep [B] bool: True for every own response and for at most `per_prompt` partner responses per prompt.

    source_index, prompt_index: [B] integer tensors (the source agent and the prompt of each
    response in the learner's view). per_prompt: an int >= 1, or None = all (the config's `"all"`).
    The draw depends only on the
    generator's state and the inputs, so a seeded generator makes it reproducible.
    """
    if source_index.shape != prompt_index.shape or source_index.ndim != 1:
        raise ValueError(
            "source_index and prompt_index must both be [B], "
            f"got {tuple(source_index.shape)} and {tuple(prompt_index.shape)}"
        )
    is_own = source_index == learner  # [B]
    if per_prompt is not None and (isinstance(per_prompt, bool) or not isinstance(per_prompt, int) or per_prompt < 1):
        raise ValueError(f"per_prompt must be None (all) or an int >= 1, got {per_prompt!r}")
    cap = per_prompt
    if cap is None:
        return torch.ones_like(is_own)
    # a random key per response; own responses get key 2 (> any draw) so they rank after partners
    keys = torch.rand(source_index.shape[0], generator=generator, dtype=torch.float64).to(source_index.device)
    keys = torch.where(is_own, torch.full_like(keys, 2.0), keys)  # [B]
    # order by prompt, then by key: two stable sorts
    order = torch.argsort(keys, stable=True)
    order = order[torch.argsort(prompt_index[order], stable=True)]  # [B]
    sorted_prompt = prompt_index[order]  # [B]
    position = torch.arange(order.numel(), device=order.device)  # [B]
    starts_group = torch.ones_like(sorted_prompt, dtype=torch.bool)
    starts_group[1:] = sorted_prompt[1:] != sorted_prompt[:-1]
    group_start = torch.where(starts_group, position, torch.zeros_like(position)).cummax(dim=0).values  # [B]
    rank = torch.empty_like(order)
    rank[order] = position - group_start  # rank within its prompt
    return is_own | (rank < cap)
