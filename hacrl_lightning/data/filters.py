"""Prompts too long for an agent, dropped at load as the authors' recipe does (verl's `filter_overlong_prompts`).

`drop_overlong_prompts(examples, agents)` keeps the examples whose prompt, in each agent's own chat
template and tokenizer, fits that agent's `max_prompt_len`: a prompt too long for any agent is
dropped, so no agent ever trains on a left-truncated prompt (docs/spec.md §11). It returns the kept
examples and a count of what was dropped, and raises a `ConfigError` naming the lengths and the fix
when nothing is left. Deliberately not here: when it runs and where the count is shown (the
DataModule's `setup`, `training.make_summary`), gold answers a reward cannot score
(`rewards.exclude_unscorable`), and the run-time left-truncation of `data.filter_overlong_prompts=false`
(`exchange.py`).
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence, TypeVar

from hacrl_lightning.errors import ConfigError, Problem

T = TypeVar("T")


class PromptEncoder(Protocol):
    """What the filter needs of an agent (`agents.Agent` has it)."""

    max_prompt_len: int

    def encode_prompts(self, texts: Sequence[str], *, truncate: bool = True) -> list[list[int]]: ...


def prompt_lengths(agents: Mapping[str, PromptEncoder], texts: Sequence[str]) -> dict[str, list[int]]:
    """Each agent's chat-templated token count of each text (one batched tokenizer call per agent)."""
    return {name: [len(ids) for ids in agent.encode_prompts(list(texts), truncate=False)]
            for name, agent in agents.items()}


def drop_overlong_prompts(examples: Sequence[T], agents: Mapping[str, PromptEncoder], *,
                          what: str) -> tuple[list[T], dict[str, int]]:
    """(the examples whose `.prompt` fits every agent's `max_prompt_len`, the count) where the count is
    {"dropped": n, "total": N, "<agent>": prompts too long for that agent}. `what` names the set in the
    error raised when every prompt is too long for some agent (a data set with nothing left)."""
    examples = list(examples)
    lengths = prompt_lengths(agents, [ex.prompt for ex in examples])
    limits = {name: agent.max_prompt_len for name, agent in agents.items()}
    return keep_fitting(examples, lengths, limits, what=what)


def keep_fitting(examples: Sequence[T], lengths: Mapping[str, list[int]], limits: Mapping[str, int], *,
                 what: str) -> tuple[list[T], dict[str, int]]:
    """`drop_overlong_prompts` from each agent's prompt lengths (`lengths[agent][i]`: example i's prompt in its
    tokens) and limits: agents held on other ranks (`trainer.placement=split`) send theirs."""
    agents = list(limits)
    examples = list(examples)
    fits = [all(lengths[name][i] <= limits[name] for name in agents) for i in range(len(examples))]  # [N]
    kept = [ex for ex, ok in zip(examples, fits) if ok]
    count = {"dropped": len(examples) - len(kept), "total": len(examples),
             **{name: sum(n > limits[name] for n in lengths[name]) for name in agents}}
    if examples and not kept:
        raise ConfigError(_nothing_left(lengths, limits, what))
    return kept, count


def _nothing_left(lengths: dict[str, list[int]], limits: dict[str, int], what: str) -> list[Problem]:
    """One problem per agent whose limit must grow for the prompt that is closest to fitting every agent."""
    total = len(next(iter(lengths.values())))
    closest = min(range(total), key=lambda i: max(lengths[a][i] - limits[a] for a in limits))
    return [Problem(f"agents.{name}.max_prompt_len", limits[name],
                    f">= {lengths[name][closest]} for at least one prompt of {what} to fit (each agent's chat "
                    f"template; the longest of its {total} prompts has {max(lengths[name])} tokens)",
                    f"all {total} prompts of {what} are longer than some agent's max_prompt_len and are dropped "
                    f"at load: set agents.{name}.max_prompt_len={lengths[name][closest]} or more (or "
                    "data.filter_overlong_prompts=false to left-truncate them instead)")
            for name in limits if lengths[name][closest] > limits[name]]
