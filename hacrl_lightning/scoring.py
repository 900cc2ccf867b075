"""A held-out set answered and scored: each agent's decoded answers to a set of problems (greedy for one answer,
else sampled at the agent's own temperature) and their rewards, [P, samples]. The one held-out scorer, shared by
the training's held-out evaluation (the DataModule) and evaluate.py's benchmark tables.

Deliberately not here: which benchmarks and protocols (`evaluation.py`), the reward functions and their pool
(`rewards/`), and the engines (`rollout/`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.data.records import Example
from hacrl_lightning.rollout import RolloutEngine, SamplingSettings

__all__ = ["BatchScorer", "answer_rewards", "serial_scorer"]


def _answers(agent: Agent, engine: RolloutEngine, examples: Sequence[Example], *, samples: int,
             temperature: float | None, seed: int) -> list[list[str]]:
    """`samples` decoded answers per problem, [P][n]: greedy for one answer unless a temperature is
    given, else sampled at the agent's own temperature."""
    if temperature is None:
        temperature = 0.0 if samples == 1 else agent.cfg.temperature
    sampling = SamplingSettings.for_agent(agent.cfg, n=samples, seed=seed, temperature=temperature)
    prompt_ids = agent.encode_prompts([ex.prompt for ex in examples])
    generations = engine.generate(prompt_ids, sampling)
    texts = [agent.decode_response(g.token_ids) for g in generations]
    return [texts[p * samples : (p + 1) * samples] for p in range(len(examples))]


BatchScorer = Callable[[Sequence[str], Sequence[str]], Sequence[float]]
"""`score(responses, golds) -> rewards`: a reward over a batch (e.g. `RewardPool.score`, hard timeouts)."""


def serial_scorer(reward_fn: Callable[[str, str], float]) -> BatchScorer:
    """A BatchScorer calling `reward_fn(response, gold)` item by item in this process."""
    return lambda responses, golds: [float(reward_fn(r, g)) for r, g in zip(responses, golds)]


def answer_rewards(agent: Agent, engine: RolloutEngine, examples: Sequence[Example], *, samples: int,
                   temperature: float | None, seed: int, score: BatchScorer,
                   answers_out: list | None = None) -> torch.Tensor:
    """One agent's rewards on `samples` answers to each problem, [P, samples] float64 (the one
    held-out scorer: benchmark tables here, and the DataModule's evaluation during training).
    `answers_out`: a list that receives the decoded answers, [P][samples]."""
    answers = _answers(agent, engine, examples, samples=samples, temperature=temperature, seed=seed)
    if answers_out is not None:
        answers_out.extend(answers)
    texts, golds = [text for row in answers for text in row], [ex.gold for ex in examples for _ in range(samples)]
    if any(ex.extras for ex in examples):  # a data file's extra fields reach a reward that asks for them
        flat = score(texts, golds, [ex.extras for ex in examples for _ in range(samples)])
    else:
        flat = score(texts, golds)
    return torch.tensor(list(flat), dtype=torch.float64).view(len(examples), samples)
