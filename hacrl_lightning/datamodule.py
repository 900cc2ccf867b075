"""RolloutDataModule: prompt batches in, one whole training step (`StepBatch`) out.

The loader serves *prompts*, never rollouts: batch t is a fixed, seeded slice of the train set
(step-indexed, so a resumed run sees exactly the prompts it would have seen), from a sized loader
that Lightning does not prefetch. Lightning hands each prompt batch to `on_after_batch_transfer`,
which makes the step there, after the previous step's update and weight sync (its `on_train_batch_end`),
so rollouts are strictly on-policy (docs/engineering.md §5), and before the callbacks' and the module's
`on_train_batch_start`: data flows DataModule -> callbacks -> module (docs/training.md).
`rollout` generates with every agent's engine, decodes, scores once, gathers every rank's share,
and builds each learner's token view (`exchange.py`): the module receives the step whole
and only trains. Engines are built in `setup`, after the process group exists. Held-out evaluation
generates here and scores with `scoring.answer_rewards`. Deliberately not here: forward passes,
advantages and optimizer steps (the module), the step's omega and clip bounds (callbacks), and the
math of retokenization (exchange.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.collective import answer_key
from hacrl_lightning.compiling import compile_seconds
from hacrl_lightning.exchange import AgentView, Rollout, make_rollouts, view_for
from hacrl_lightning.config import DataConfig, RolloutConfig
from hacrl_lightning.data.filters import drop_overlong_prompts, keep_fitting, prompt_lengths
from hacrl_lightning.data.records import Example, PromptDataset
from hacrl_lightning.scoring import answer_rewards
from hacrl_lightning.failures import generation_failed, is_out_of_memory
from hacrl_lightning.offload import Residency
from hacrl_lightning.placement import Placement
from hacrl_lightning.errors import RunFailed
from hacrl_lightning.rewards import Reward, RewardPool, exclude_unscorable
from hacrl_lightning.rollout import RolloutEngine, SamplingSettings, close_engines, engine_options, make_engine
from hacrl_lightning.step import PromptBatch, StepBatch, step_seed


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
        for examples in super().__iter__():
            step = self._sampler.start + self.served
            self.served += 1
            yield PromptBatch(step, examples)

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self._sampler.start + self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._sampler.start = int(state["next_step"])
        self.served = 0


def _own_copy(exported: Path, rank: int, group=None) -> Path:
    """This rank's copy of an agent's export, for its own engine to load and sync through (ranks must not
    write one directory at once). The first rank of the agent's `group` (None: the world) wrote the export
    (`Agent.export`); every rank of it waits for it."""
    import shutil

    torch.distributed.barrier(group=group)
    own = exported.with_name(f"{exported.name}-rank{rank}")
    shutil.copytree(exported, own, dirs_exist_ok=True)
    return own


class RewardFailed(RunFailed):
    """The run's reward (or one of its terms) failed on every response of a step."""


class RolloutDataModule(pl.LightningDataModule):
    """Prompts, engines, rewards and views for one run.

    agents: the run's agents in config order; train_set / eval_set: the task, loaded once by the
    caller; data / rollout: their config sections; responses_per_prompt: G times the rollout
    multiplier; share_rollouts: whether a learner's view holds every agent's responses; steps, seed:
    the run's budget and seed; engine_dir: where an engine may write weights (vLLM); engine_logprobs:
    ask every engine for the sampled tokens' log-probs (the truncated importance-sampling correction
    needs them); an engine that reports them cheaply (`free_logprobs`: vLLM) is asked on steps 0, k, 2k, ...
    (k = `mismatch_every`, `trainer.mismatch_every`; 0: never), for the rollout/trainer mismatch metric (each
    time they cost the engine a log-softmax and the trainer a Python object per token, docs/PERFORMANCE.md);
    placement: which agents live on this rank (`agents` are those; default:
    every agent here); residency: brings an offloaded agent's weights back while an engine that generates with
    them (transformers) does (`trainer.offload_idle`)."""

    def __init__(self, agents: dict[str, Agent], *, train_set: PromptDataset, eval_set: PromptDataset,
                 data: DataConfig, rollout: RolloutConfig, responses_per_prompt: int, share_rollouts: bool,
                 steps: int, seed: int, engine_dir: Path, engine_logprobs: bool, mismatch_every: int,
                 placement: Placement | None = None, residency: Residency | None = None):
        super().__init__()
        self.residency = residency or Residency(enabled=False)
        self.agents = agents
        """The agents this rank holds (all of them unless `trainer.placement=split`)."""
        self.placement = placement or Placement.shared(list(agents))
        self.names = list(self.placement.names)
        """Every agent of the run, in config order."""
        self.data, self.rollout_cfg = data, rollout
        self.group_size = responses_per_prompt
        self.share_rollouts = share_rollouts
        self.steps, self.seed, self.engine_dir = steps, seed, Path(engine_dir)
        self.engine_logprobs = engine_logprobs
        self.mismatch_every = mismatch_every
        self._task = (train_set, eval_set)
        self.reward = Reward.of(data.reward, data.rewards)
        """What scores a response (`data.reward`, or the weighted terms of `data.rewards`)."""
        self.reward_pool = RewardPool(self.reward, workers=data.reward_workers,
                                      timeout_s=data.reward_timeout_s)  # workers start on first use
        self.engines: dict[str, RolloutEngine] = {}
        self.engine_shares: dict[str, float] | None = None
        """Each agent's vLLM memory share as this machine's engines divide it (`training.run_engine_shares`;
        None: each agent's own setting)."""
        self.train_set: PromptDataset | None = None
        self.eval_set: PromptDataset | None = None
        self.overlong: dict[str, dict[str, int]] | None = None
        """Prompts dropped at set-up for being longer than an agent's max_prompt_len, per split
        (`data.filters.drop_overlong_prompts`); None when `data.filter_overlong_prompts` is off."""
        self._loader: ResumableLoader | None = None
        self.greedy_answers: dict[str, dict[str, list]] = {}
        """The last held-out evaluation's greedy answers per agent: `answers` (`collective.answer_key` of each)
        and `correct` (each one's verifier score), for the group's figures (`callbacks/evaluation.py`)."""
        self.phase_listeners: list[Callable[[str], None]] = []
        """Called with a phase's name as `rollout` enters it ("rollout", "reward", "exchange"): a seam for the
        benchmark's per-phase memory (`bench/step.py`); the phases' times are the step's `timings`."""

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            train, held_out = self._task
            reward = self.reward
            self.train_set = PromptDataset(exclude_unscorable(train, reward, what=f"{train.name} (train)"), name=train.name)
            self.eval_set = PromptDataset(exclude_unscorable(held_out, reward, what=f"{held_out.name} (held out)"),
                                          name=held_out.name)
            if self.data.filter_overlong_prompts:
                self._drop_overlong()
        if self._world > 1:
            self.placement.connect()  # split: the groups' process groups, before anything uses them
        if not self.engines:
            backend = self.rollout_cfg.backend
            split = self.placement.is_split
            for name, agent in self.agents.items():
                options = engine_options(agent, backend, batch_size=self.rollout_cfg.generation_batch_size,
                                         seed=self.seed, export_to=self.engine_dir / name,
                                         in_process=self.rollout_cfg.vllm_in_process, sleep=self.rollout_cfg.sleep,
                                         weight_sync=self.rollout_cfg.weight_sync,
                                         weight_sync_mb=self.rollout_cfg.weight_sync_mb,
                                         hf_cache=self.rollout_cfg.hf_cache, hf_compile=self.rollout_cfg.hf_compile,
                                         gpu_memory_utilization=(self.engine_shares or {}).get(name),
                                         writes=self.placement.rank_in(name) == 0 if split else None)
                if "model_dir" in options and self._world > 1:
                    options["model_dir"] = _own_copy(options["model_dir"], self._rank,
                                                     self.placement.process_group(name))
                self.engines[name] = make_engine(backend, agent.model, **options)

    def _drop_overlong(self) -> None:
        """Drop the prompts too long for any agent from both splits, as the authors' recipe does, and say so."""
        self.overlong = {}
        for split, attr in (("train", "train_set"), ("held_out", "eval_set")):
            dataset = getattr(self, attr)
            what = f"{dataset.name} ({split.replace('_', ' ')})"
            if self.placement.is_split:  # every agent's lengths, from its group: all groups keep the same prompts
                kept, count = self._keep_fitting_everywhere(list(dataset), what)
            else:
                kept, count = drop_overlong_prompts(dataset, self.agents, what=what)
            setattr(self, attr, PromptDataset(kept, name=dataset.name))
            self.overlong[split] = count
            if self._rank == 0:
                per_agent = ", ".join(f"{name} {count[name]}" for name in self.names)
                print(f"data: {split.replace('_', ' ')}: dropped {count['dropped']} of {count['total']} prompts longer "
                      f"than an agent's max_prompt_len (too long for {per_agent})", flush=True)

    def _keep_fitting_everywhere(self, examples: list[Example], what: str):
        """`drop_overlong_prompts` under `split`: this rank measures its agents' prompt lengths, every rank
        gathers all of them (a world collective of small lists), and every rank keeps the same prompts."""
        import torch.distributed as dist

        lengths = prompt_lengths(self.agents, [example.prompt for example in examples])
        mine = {name: (lengths[name], agent.max_prompt_len) for name, agent in self.agents.items()}
        shares: list = [None] * self._world
        dist.all_gather_object(shares, mine)
        merged = {name: pair for share in shares for name, pair in share.items()}
        return keep_fitting(examples, {name: merged[name][0] for name in self.names},
                            {name: merged[name][1] for name in self.names}, what=what)

    def teardown(self, stage: str | None = None) -> None:
        self.reward_pool.close()  # no reward worker outlives the run
        close_engines(self.engines.values())  # nor an engine process (a later setup builds new ones)
        self.engines = {}

    def train_dataloader(self) -> ResumableLoader:
        index, parts = self._share
        sampler = StepBatchSampler(len(self.train_set), self.data.prompts_per_step, self.steps, seed=self.seed,
                                   rank=index, world_size=parts)
        self._loader = ResumableLoader(self.train_set, sampler)
        return self._loader

    @property
    def _rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    @property
    def _world(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    @property
    def _share(self) -> tuple[int, int]:
        """(index, parts) of the step's prompts this rank generates for: its rank of the world, or under `split`
        its place in its agent's group (each group answers every prompt)."""
        return self.placement.prompt_share if self.placement.is_split else (self._rank, self._world)

    # -- one step ---------------------------------------------------------------------------------

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Lightning's first hook of a training step that holds its batch: prompts in, the step whole out."""
        if isinstance(batch, PromptBatch):
            return self.rollout(batch.examples, step=batch.step)
        return batch

    def sampling(self, agent: Agent, *, n: int, seed: int, step: int) -> SamplingSettings:
        """How `agent` samples its training responses at `step`: its own settings (`SamplingSettings.for_agent`),
        with the engine's log-probs where they are needed (every step) or cheap and the mismatch is measured."""
        settings = SamplingSettings.for_agent(agent.cfg, n=n, seed=seed)
        cheap = getattr(self.engines.get(agent.name), "free_logprobs", False)
        measured = self.mismatch_every > 0 and step % self.mismatch_every == 0
        return replace(settings, return_logprobs=self.engine_logprobs or (cheap and measured))

    def generate(self, examples: Sequence[Example], *, step: int, n: int) -> dict[str, list]:
        """Every agent answers every prompt n times with its own sampling: agent name -> flat Generations
        (prompt-major), seeded by (run seed, step, agent, rank); this rank's agents only."""
        out = {}
        for name, agent in self.agents.items():
            j = self.names.index(name)
            prompt_ids = agent.encode_prompts([ex.prompt for ex in examples])
            settings = self.sampling(agent, n=n, seed=step_seed(self.seed, step, 1000 * j + 7 * self._share[0]),
                                     step=step)
            try:
                with self._weights_for(name):
                    out[name] = self.engines[name].generate(prompt_ids, settings)
                rest = getattr(self.engines[name], "rest", None)  # a vLLM engine sleeps until its sync (rollout.sleep)
                if rest is not None:
                    rest()
            except Exception as err:  # noqa: BLE001 - an allocation failure is said in one line; others raise
                if not is_out_of_memory(err):
                    raise
                raise generation_failed(name, step, err, self.rollout_cfg.generation_batch_size,
                                        agent.max_response_len, str(self.engine_dir.parent),
                                        backend=self.rollout_cfg.backend) from err
        return out

    def _weights_for(self, name: str):
        """The agent's training weights on the device while its engine generates, if the engine generates with
        them (transformers; a vLLM engine holds its own copy)."""
        if getattr(self.engines.get(name), "holds_own_weights", False):
            return contextlib.nullcontext()
        return self.residency.resident(name)

    def rollout(self, examples: Sequence[Example], *, step: int) -> StepBatch:
        """The step whole: G responses per prompt from every agent's current weights, decoded and scored
        once on the rank that generated them, gathered so every rank holds the global batch, then the view of
        each learner on this rank of the responses it trains on."""
        examples, group, local = list(examples), self.group_size, list(self.agents)
        n = len(self.names)
        self._phase("rollout")
        start = started = time.perf_counter()
        compile_started = compile_seconds()
        generations = self.generate(examples, step=step, n=group)
        rollout_s = time.perf_counter() - start

        self._phase("reward")
        start = time.perf_counter()
        per_source = {name: make_rollouts(self.agents[name], examples, generations[name]) for name in local}
        rollouts: list[Rollout] = [rollout for p in range(len(examples)) for name in local  # prompt-major,
                                   for rollout in per_source[name][p * group : (p + 1) * group]]  # source, sample
        owners = [examples[idx // (len(local) * group)] for idx in range(len(rollouts))]
        scores = self.reward_pool.score([r.response for r in rollouts], [ex.gold for ex in owners],
                                        [ex.extras for ex in owners])
        for rollout, reward, parts in zip(rollouts, scores, self.reward_pool.parts):
            rollout.reward = reward
            if self.data.rewards:  # a sum of terms: each term's value, logged per agent
                rollout.reward_parts = dict(zip(self.reward.names, parts or (0.0,) * len(self.reward.names)))
        reward_s = time.perf_counter() - start
        examples, rollouts, reward_stats = self.gather(examples, rollouts)
        self._stop_if_a_reward_always_fails(step, reward_stats)
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32).view(len(examples), n, group)

        self._phase("exchange")
        start = time.perf_counter()
        views = self._views(examples, rollouts)
        exchange_s = time.perf_counter() - start
        return StepBatch(examples, rollouts, rewards, views, reward_stats,
                         {"rollout": rollout_s, "reward": reward_s, "exchange": exchange_s}, step=step, started=started,
                         compile_started=compile_started)

    def _stop_if_a_reward_always_fails(self, step: int, stats: dict[str, int]) -> None:
        """A reward (a term, or the whole call: time-outs and crashes) that failed on every response of the step,
        over all ranks (`stats`: the gathered counts, so every rank decides alike), ends the run in one line:
        nothing could be learned from its zeros."""
        items = stats.get("step/items", 0)
        failing = [key.split("/", 2)[2] for key, count in stats.items() if key.startswith("step/failed/") and count == items]
        if items and stats.get("step/failed", 0) == items:
            failing = [self.reward.__name__]
        if failing:
            causes = self.reward_pool.term_failures.get(failing[0]) or list(self.reward_pool.failure_causes.values())
            first = causes[0] if causes else "see the log of rank 0"
            raise RewardFailed(f"the reward {failing[0]!r} failed on all {items} responses of training step {step + 1} "
                               f"(first: {first}). Fix the function (or data.reward_timeout_s), then start the run "
                               "again; each failure is logged with its item")

    def _phase(self, phase: str) -> None:
        for listener in self.phase_listeners:
            listener(phase)

    def _views(self, examples: list[Example], rollouts: list[Rollout]) -> dict[str, AgentView]:
        """Each learner's token view (`exchange.view_for`): every response when rollouts are shared, else
        its own; `row_idx` keeps each row's place in the flat (prompt, source, sample) order."""
        prompt_ids = [example.prompt_id for example in examples]
        views = {}
        for name in self.agents:
            rows = [i for i, r in enumerate(rollouts) if self.share_rollouts or r.source == name]
            views[name] = view_for(self.agents[name], [rollouts[i] for i in rows], sources=self.names,
                                   prompt_ids=prompt_ids, rows=rows)
        return views

    def gather(self, examples: list[Example], rollouts: list[Rollout]):
        """Every rank's prompts and scored rollouts, in rank order (= the global batch's prompt order,
        `StepBatchSampler`), and the reward pool's counters summed over ranks: each rank then holds
        the whole step, so the step plan is global (`hacrl_lightning.plan`). Under `split` a rank holds one
        agent's rollouts of its group's share of the prompts: each agent's come from its group, in the group's
        rank order, and are interleaved into the (prompt, source, sample) order. A public seam: tests wrap it
        to change a step's scored rollouts before the views are built."""
        pool = self.reward_pool
        stats = {**pool.stats, "step/items": len(rollouts), "step/failed": len(pool.failures),
                 **{f"step/failed/{name}": len(causes) for name, causes in pool.term_failures.items()}}
        if self._world == 1:
            return examples, rollouts, stats
        import torch.distributed as dist

        shares: list = [None] * self._world
        dist.all_gather_object(shares, (examples, rollouts, stats))
        keys = dict.fromkeys(key for share in shares for key in share[2])  # a term may fail on one rank only
        stats = {key: sum(share[2].get(key, 0) for share in shares) for key in keys}
        if not self.placement.is_split:
            examples = [example for share in shares for example in share[0]]
            rollouts = [rollout for share in shares for rollout in share[1]]
            return examples, rollouts, stats
        groups = self.placement.groups
        first = self.names[0]
        examples = [example for rank in groups[first] for example in shares[rank][0]]
        for name in self.names[1:]:
            theirs = [example.prompt_id for rank in groups[name] for example in shares[rank][0]]
            if theirs != [example.prompt_id for example in examples]:
                raise RuntimeError(f"split placement: the groups of {first!r} and {name!r} answered different prompts")
        per_source = {name: [r for rank in groups[name] for r in shares[rank][1]] for name in self.names}
        group = len(per_source[first]) // max(1, len(examples))
        rollouts = [rollout for p in range(len(examples)) for name in self.names
                    for rollout in per_source[name][p * group : (p + 1) * group]]
        return examples, rollouts, stats

    # -- held-out evaluation ------------------------------------------------------------------------

    def _evaluate_one(self, name: str, examples: list[Example], *, samples: int, step: int) -> dict[str, float]:
        from hacrl_lightning.algorithms.metrics import avg_at_k, pass_at_k
        from hacrl_lightning.callbacks.evaluation import held_out_figures

        agent, engine, score = self.agents[name], self.engines[name], self.reward_pool.score
        j = self.names.index(name)
        rank = self._share[0]  # this rank's place among those answering for this agent
        texts: list[list[str]] = []
        greedy = answer_rewards(agent, engine, examples, samples=1, temperature=0.0, score=score, answers_out=texts,
                                seed=step_seed(self.seed, step, 5 + 1000 * j + 7 * rank))          # [P, 1]
        terms = getattr(self.reward, "terms", None)  # acc is the verifier's (first term's), never a weighted sum
        greedy, figures = held_out_figures(greedy, self.reward_pool.parts, terms)
        self.greedy_answers[name] = {"answers": [answer_key(row[0]) for row in texts],  # the group's figures'
                                     "correct": [float(v) for v in greedy[:, 0]]}       # (collective.py)
        row = {"acc": float(greedy.mean()) if len(examples) else 0.0, **figures}
        if samples > 1:
            hits = answer_rewards(agent, engine, examples, samples=samples, temperature=None, score=score,
                                  seed=step_seed(self.seed, step, 9 + 1000 * j + 7 * rank))
            hits = held_out_figures(hits, self.reward_pool.parts, terms)[0]
            row[f"avg@{samples}"] = float(avg_at_k(hits))
            row[f"pass@{samples}"] = float(pass_at_k(hits, samples))
        return row

    def evaluate(self, *, samples: int = 1, limit: int | None = None, step: int = 0) -> dict[str, dict[str, float]]:
        """Per agent on the held-out set (`scoring.answer_rewards`): greedy accuracy, and avg@k /
        pass@k over k answers sampled at the agent's temperature (k > 1). Each agent's greedy answers (their
        `collective.answer_key`) and verifier scores stay in `greedy_answers` for the group's figures."""
        examples = list(self.eval_set)[:limit]
        results: dict[str, dict[str, float]] = {}
        self.greedy_answers = {}
        for name in self.agents:
            with self._weights_for(name):
                results[name] = self._evaluate_one(name, examples, samples=samples, step=step)
        if self.placement.is_split:  # every agent's scores, from its group's first rank
            import torch.distributed as dist

            shares: list = [None] * self._world
            dist.all_gather_object(shares, {name: (row, self.greedy_answers[name]) for name, row in results.items()
                                            if self.placement.rank_in(name) == 0})
            merged = {name: pair for share in shares for name, pair in share.items()}
            results = {name: merged[name][0] for name in self.names}
            self.greedy_answers = {name: merged[name][1] for name in self.names}
        return results
