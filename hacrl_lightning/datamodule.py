"""RolloutDataModule: prompt batches, one rollout engine per agent, on-policy rollouts and rewards.

The loader serves *prompts*, never rollouts: batch t is a fixed, seeded slice of the train set
(step-indexed, so a resumed run sees exactly the prompts it would have seen), from a sized loader
that Lightning does not prefetch. The module calls `rollout(batch)` inside `training_step`, i.e.
after the previous update, so rollouts are strictly on-policy (DESIGN §4, engineering.md §0.6).
Engines are built in `setup`, after the process group exists. Deliberately not here: forward
passes, advantages and optimizer steps (the module), and the math of retokenization (exchange.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.agents.exchange import Rollout, make_rollouts
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.data.tasks import load_task
from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.rewards import RewardPool, exclude_unscorable, get_reward
from hacrl_lightning.rollout import RolloutEngine, SamplingSettings, engine_options, make_engine


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A reproducible seed for (run seed, training step, salt) that stays within 63 bits."""
    return (seed * 1_000_003 + step * 10_007 + salt * 101 + 17) % (2**63 - 1)


class StepBatchSampler(Sampler[list[int]]):
    """Batch t = the t-th slice of P prompts of a seeded permutation of the dataset (a new permutation
    each pass; a batch never spans two passes, so its prompts are distinct), this rank's contiguous
    share of it. Resumable: the loader's `state_dict` holds the next step."""

    def __init__(self, dataset_size: int, prompts_per_step: int, num_steps: int, *, seed: int,
                 rank: int = 0, world_size: int = 1):
        if prompts_per_step % world_size:
            raise ValueError(f"data.prompts_per_step={prompts_per_step} must be a multiple of the number of "
                             f"data-parallel ranks ({world_size}) so every rank gets the same share")
        if dataset_size < prompts_per_step:
            raise ValueError(f"the train set has {dataset_size} prompts, fewer than data.prompts_per_step={prompts_per_step}")
        self.size, self.per_step, self.num_steps = dataset_size, prompts_per_step, num_steps
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start = 0
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:  # keep only the current pass's permutation
            generator = torch.Generator().manual_seed(step_seed(self.seed, epoch, salt=1))
            self._perms = {epoch: torch.randperm(self.size, generator=generator).tolist()}
        return self._perms[epoch]

    def indices(self, step: int) -> list[int]:
        steps_per_pass = self.size // self.per_step
        share = self.per_step // self.world_size
        first = (step % steps_per_pass) * self.per_step + self.rank * share
        return self._perm(step // steps_per_pass)[first : first + share]

    def __iter__(self):
        for step in range(self.start, self.num_steps):
            yield self.indices(step)

    def __len__(self) -> int:
        # the whole run's length even when resuming at `start`: Lightning counts the batches already
        # done (restored from the checkpoint) towards it, so `num_steps - start` would end the run early
        return self.num_steps


class ResumableLoader(DataLoader):
    """A DataLoader whose position Lightning saves in checkpoints (it is `_Stateful`)."""

    def __init__(self, dataset, batch_sampler: StepBatchSampler, served: int = 0):
        super().__init__(dataset, batch_sampler=batch_sampler, collate_fn=list, num_workers=0)
        self._sampler = batch_sampler
        self.served = served

    def __iter__(self):
        for batch in super().__iter__():
            self.served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self._sampler.start + self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._sampler.start = int(state["next_step"])
        self.served = 0


@dataclass
class StepRollouts:
    """One step's responses over the global batch (every rank's prompts, in rank order):
    `rollouts[(p * n + j) * G + i]` is sample i of agent j on prompt p, and `rewards[p, j, i]` its reward."""

    examples: list[Example]
    rollouts: list[Rollout]
    rewards: torch.Tensor                      # [P, n, G]
    group_size: int
    timings: dict[str, float] = field(default_factory=dict)
    """This rank's seconds of generation and scoring."""
    reward_stats: dict[str, int] = field(default_factory=dict)
    """The reward pool's counters (timeouts, crashes) summed over ranks."""


class RolloutDataModule(pl.LightningDataModule):
    def __init__(self, cfg: TrainConfig, agents: dict[str, Agent]):
        super().__init__()
        self.cfg = cfg
        self.agents = agents
        self.names = list(agents)
        self.reward_fn = get_reward(cfg.data.reward)
        self.reward_pool = RewardPool(self.reward_fn, workers=cfg.data.reward_workers,
                                      timeout_s=cfg.data.reward_timeout_s)  # workers start on first use
        self.engines: dict[str, RolloutEngine] = {}
        self.train_set: PromptDataset | None = None
        self.eval_set: PromptDataset | None = None
        self._loader: ResumableLoader | None = None

    @property
    def group_size(self) -> int:
        """Responses per prompt per agent: G times the algorithm's rollout multiplier (gspo_x2: 2G)."""
        return self.cfg.rollout.group_size * self.cfg.algorithm.rollout_multiplier

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            train, held_out = load_task(self.cfg.data)
            reward = self.cfg.data.reward
            self.train_set = PromptDataset(exclude_unscorable(train, reward, what=f"{train.name} (train)"), name=train.name)
            self.eval_set = PromptDataset(exclude_unscorable(held_out, reward, what=f"{held_out.name} (held out)"),
                                          name=held_out.name)
        if not self.engines:
            for name, agent in self.agents.items():
                self.engines[name] = make_engine(self.cfg.rollout.backend, agent.model, **engine_options(
                    agent, self.cfg.rollout.backend, batch_size=self.cfg.rollout.generation_batch_size,
                    seed=self.cfg.seed, export_to=Path(self.cfg.run_dir) / "engine_dirs" / name))

    def teardown(self, stage: str | None = None) -> None:
        self.reward_pool.close()  # no reward worker outlives the run

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = StepBatchSampler(len(self.train_set), self.cfg.data.prompts_per_step, self.cfg.trainer.steps,
                                   seed=self.cfg.seed, rank=rank, world_size=world)
        self._loader = ResumableLoader(self.train_set, sampler)
        return self._loader

    # -- one step's rollouts ----------------------------------------------------------------------

    def sampling(self, agent: Agent, *, n: int, seed: int, greedy: bool = False) -> SamplingSettings:
        """The agent's sampling settings. No engine log-probs: the step recomputes old log-probs with a
        forward pass, and HF `generate` would keep a [batch, vocab] score tensor per token for them."""
        cfg = agent.cfg
        return SamplingSettings(max_new_tokens=cfg.max_response_len, n=n,
                                temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p,
                                top_k=cfg.top_k, seed=seed, return_logprobs=False)

    def generate(self, examples: Sequence[Example], *, step: int, n: int, greedy: bool = False,
                 salt: int = 0) -> dict[str, list]:
        """Every agent answers every prompt n times: agent name -> flat Generations (prompt-major)."""
        out = {}
        rank = self.trainer.global_rank if self.trainer is not None else 0
        for j, (name, agent) in enumerate(self.agents.items()):
            prompt_ids = agent.encode_prompts([ex.prompt for ex in examples])
            settings = self.sampling(agent, n=n, greedy=greedy, seed=step_seed(self.cfg.seed, step, salt + 1000 * j + 7 * rank))
            out[name] = self.engines[name].generate(prompt_ids, settings)
        return out

    def rollout(self, examples: Sequence[Example], *, step: int) -> StepRollouts:
        """Generate G responses per prompt with every agent's current weights, decode, and score once;
        each rank does its own prompts, and every rank gets the whole step back."""
        examples, group, n = list(examples), self.group_size, len(self.names)
        start = time.perf_counter()
        generations = self.generate(examples, step=step, n=group)
        rollout_s = time.perf_counter() - start

        start = time.perf_counter()
        per_source = {name: make_rollouts(self.agents[name], examples, generations[name]) for name in self.names}
        rollouts: list[Rollout] = [rollout for p in range(len(examples)) for name in self.names  # prompt-major,
                                   for rollout in per_source[name][p * group : (p + 1) * group]]  # source, sample
        golds = [examples[idx // (n * group)].gold for idx in range(len(rollouts))]
        for rollout, reward in zip(rollouts, self.reward_pool.score([r.response for r in rollouts], golds)):
            rollout.reward = reward
        reward_s = time.perf_counter() - start
        examples, rollouts, reward_stats = self._gather(examples, rollouts)
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32).view(len(examples), n, group)
        return StepRollouts(examples, rollouts, rewards, group, {"rollout": rollout_s, "reward": reward_s},
                            reward_stats)

    def _gather(self, examples: list[Example], rollouts: list[Rollout]):
        """Every rank's prompts and scored rollouts, in rank order (= the global batch's prompt order,
        `StepBatchSampler`), and the reward pool's counters summed over ranks: each rank then holds
        the whole step, so the step plan is global (`hacrl_lightning.plan`)."""
        stats = dict(self.reward_pool.stats)
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return examples, rollouts, stats
        import torch.distributed as dist

        shares: list = [None] * trainer.world_size
        dist.all_gather_object(shares, (examples, rollouts, stats))
        examples = [example for share in shares for example in share[0]]
        rollouts = [rollout for share in shares for rollout in share[1]]
        stats = {key: sum(share[2].get(key, 0) for share in shares) for key in stats}
        return examples, rollouts, stats

    # -- held-out evaluation ------------------------------------------------------------------------

    def evaluate(self, *, samples: int = 1, limit: int | None = None, step: int = 0) -> dict[str, dict[str, float]]:
        """Per agent on the held-out set: greedy accuracy, and avg@k / pass@k over k sampled answers (k > 1)."""
        from hacrl_lightning.algorithms.metrics import avg_at_k, pass_at_k

        examples = list(self.eval_set)[:limit]
        results: dict[str, dict[str, float]] = {}
        greedy = self.generate(examples, step=step, n=1, greedy=True, salt=5)
        sampled = self.generate(examples, step=step, n=samples, salt=9) if samples > 1 else None
        for name, agent in self.agents.items():
            answers = make_rollouts(agent, examples, greedy[name])
            correct = self.reward_pool.score([r.response for r in answers], [ex.gold for ex in examples])
            row = {"acc": sum(correct) / max(1, len(correct))}
            if sampled is not None:
                answers = make_rollouts(agent, examples, sampled[name])
                golds = [examples[idx // samples].gold for idx in range(len(answers))]
                hits = torch.tensor(self.reward_pool.score([r.response for r in answers], golds)).view(len(examples), samples)
                row[f"avg@{samples}"] = float(avg_at_k(hits))
                row[f"pass@{samples}"] = float(pass_at_k(hits, samples))
            results[name] = row
        return results
