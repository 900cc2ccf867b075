"""HACRLModule: N agents, one optimizer each, manual optimization, one HACPO step per prompt batch.

`training_step` runs the step in the order of docs/training.md ("The step, phase by phase"; docs/spec.md §7
its math), its comments numbered as that list. Lightning hands it the step whole, a `StepBatch`: made by the
DataModule (1-4: the prompts, rollouts from every agent's current weights, one reward per response, each
learner's token view) and completed by the callbacks before the step (5: omega from the capability callback,
each mini-batch's cross-ratio lower bound from the clip-schedule callback); the module reads those values and
calls no callback. Then: each source's old log-probs (the rest of 5: one forward pass over its own responses,
shared by every learner), the advantages (6), each learner's mini-batches ordered own-first, mini-batch m with
the lower bound `cross_lower[m]` (7), and the step's metrics (8); the weight sync (9) is a callback's, after
the step. Under data parallelism every rank holds the whole step and builds the same global
plan of mini-batches (`plan.py`), trains on its slice of each, and normalises the loss over the
global mini-batch, so an update is the one a single device would make on the whole batch
(docs/training.md). Single-agent algorithms (grpo, gspo, gspo_x2) run the same loop with views that
hold only the learner's own responses, so one run compares like with like. A non-finite loss or
gradient skips that learner's update, leaving its weights and optimizer state as they were; any other
exception in an update ends the run naming the agent and the setting (`UpdateFailed`); the step's
metrics count degenerate rollouts (docs/reliability.md). The passes each rank runs (rows, zero-weight
stand-ins, the pass count) are the plan's (`plan.py`); the update's stateless parts (a source's scores of
its own rows, a micro-batch's loss inputs) are `update.py`, the step's scalars `step_metrics.py`, the
gradient-share diagnostic `grad_share.py`.

Metrics reach the loggers one way: `report()`, used by the module and by the callbacks, and written
once per step. Deliberately not here: sampling, rewards and retokenization (the DataModule and
`exchange.py`), the math (`algorithms/`), the capability window's state and the clip schedule
(their callbacks own them and hand the step's values forward), and checkpoint/eval/sync policy (callbacks).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping

import lightning.pytorch as pl
import torch
from torch import nn

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.exchange import AgentView
from hacrl_lightning.agents.lora import adapter_disabled, is_lora, trainable_parameters
from hacrl_lightning.algorithms import compute_advantages, hacpo_loss, step_accuracy
from hacrl_lightning.config import AlgorithmConfig, parse_cross_samples
from hacrl_lightning.cross_ratios import CrossRatioLog
from hacrl_lightning.errors import RunFailed
from hacrl_lightning.failures import checkpoints_note, is_out_of_memory
from hacrl_lightning.grad_share import measure_grad_share
from hacrl_lightning.loss_stats import LossStats
from hacrl_lightning.offload import Residency
from hacrl_lightning.placement import Placement
from hacrl_lightning.plan import MicroBatch, StepPlan, learner_order
from hacrl_lightning.step import StepBatch, step_seed
from hacrl_lightning.step_metrics import clip_metrics, mismatch_metrics, rollout_metrics, view_metrics
from hacrl_lightning.update import (LearnerTables, adamw, host_values, loss_inputs, padding_metrics, score_own_rows,
                                   source_span, to_device, total_grad_norm)


class NonFiniteError(RunFailed):
    """An agent kept producing non-finite losses or gradients for more steps in a row than
    `trainer.max_nonfinite_skips` allows; its weights and optimizer state are those of its last good update."""


class UpdateFailed(RunFailed):
    """An agent's update raised (an optimizer overflow, out of memory, ...): the run ends naming the agent,
    the step, the error and the setting most likely behind it."""


def update_failed(name: str, step: int, err: Exception, agent_cfg, micro_batch_size: int, run_dir: str, *,
                  phase: str = "update") -> UpdateFailed:
    """The `UpdateFailed` for `err`, raised inside learner `name`'s `phase` (its update, or the forward that scores
    its responses' old log-probs) in training step `step` (0-based)."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    if is_out_of_memory(err):
        hint = (f"lower trainer.micro_batch_size (now {micro_batch_size}) or agents.{name}.max_response_len "
                f"(now {agent_cfg.max_response_len})")
    elif agent_cfg.lr >= 1:
        hint = (f"agents.{name}.lr={agent_cfg.lr:g} is far above a usable learning rate (the shipped agents use "
                "1e-6 to 1e-4): lower it")
    else:
        hint = (f"check the settings of its update: agents.{name}.lr={agent_cfg.lr:g}, "
                f"agents.{name}.weight_decay={agent_cfg.weight_decay:g}, agents.{name}.grad_clip={agent_cfg.grad_clip:g}, "
                f"agents.{name}.dtype={agent_cfg.dtype}")
    return UpdateFailed(f"agent {name!r}: its {phase} in training step {step + 1} failed ({type(err).__name__}: "
                        f"{first}). Fix: {hint}, then start the run again (overwrite=true, or another run_dir: a resume "
                        f"keeps the settings). {checkpoints_note(run_dir)}")




@dataclass(frozen=True)
class UpdateSettings:
    """What the update loop reads besides the algorithm (`training.update_settings` builds it)."""

    mini_batch_size: int
    """Responses per mini-batch (mini_batch_prompts / rollout_multiplier prompts of G·multiplier responses)."""
    micro_batch_size: int
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    micro_batch_tokens: int
    """`trainer.micro_batch_tokens`: at most this many padded tokens per pass besides the row count (0: off)."""
    max_nonfinite_skips: int
    precision: str
    """`trainer.precision`: how agents and KL references are sharded under FSDP (bf16-mixed or 32-true)."""
    seed: int
    """The run seed: each learner's mini-batch order is drawn from (seed, step, learner)."""
    diagnostics_every: int
    """`trainer.diagnostics_every`: measure the gradient share of cross responses on the every-th step (0: never)."""


def count_faults(streaks: dict[str, int], counters: dict[str, dict], name: str, step: int, skipped: list[int], *,
                 limit: int, warn: bool) -> None:
    """Record this step's skipped updates of `name` (its streak of faulty steps in a row, its counter), warning
    where `warn` (one rank of its group)."""
    if not skipped:
        streaks[name] = 0
        return
    counters[name]["skipped_updates"] += len(skipped)
    streak = streaks[name] = streaks[name] + 1
    if warn:
        warnings.warn(f"agent {name!r}: non-finite loss or gradient at step {step} (mini-batches {skipped}); "
                      f"those updates were skipped, its weights and optimizer state are unchanged "
                      f"({streak} faulty step(s) in a row; trainer.max_nonfinite_skips={limit})", UserWarning)


def stop_if_faulty(streaks: dict[str, int], step: int, *, limit: int) -> None:
    """End the run when an agent skipped updates in more steps in a row than `trainer.max_nonfinite_skips`
    (every rank decides alike: the streaks are every agent's, gathered from the groups under `split`)."""
    for name, streak in streaks.items():
        if streak > limit:
            raise NonFiniteError(
                f"agent {name!r}: non-finite loss or gradient in {streak} steps in a row (last: step {step}), more "
                f"than trainer.max_nonfinite_skips={limit}. Fix: lower agents.{name}.lr, check the data and "
                f"agents.{name}.dtype (float16 overflows), then resume from the last checkpoint (resume=<run dir>)")


def _detach_mean(values: list[torch.Tensor]) -> float:
    return float(torch.stack([v.float() for v in values]).mean()) if values else float("nan")


class HACRLModule(pl.LightningModule):
    """agents: the agents this rank holds, in config order (= optimizer order); algorithm: the resolved preset;
    update: sizes and limits of the update loop; placement: which agents live where (default: every agent
    here, `trainer.placement=shared`); residency: where each agent's training state is between its phases
    (`trainer.offload_idle`; default: where Lightning put it)."""

    def __init__(self, agents: dict[str, Agent], *, algorithm: AlgorithmConfig, update: UpdateSettings,
                 placement: Placement | None = None, residency: Residency | None = None):
        super().__init__()
        self.residency = residency or Residency(enabled=False)
        self.alg = algorithm
        self.settings = update
        self.placement = placement or Placement.shared(list(agents))
        if list(self.placement.local) != list(agents):
            raise ValueError(f"agents {list(agents)} are not this rank's agents {list(self.placement.local)}")
        self.agents = nn.ModuleDict(agents)
        self.names = list(self.placement.names)
        """Every agent of the run, in config order (indices of rewards, omega and advantages)."""
        self.local = list(agents)
        """The agents this rank holds and trains (all of them unless `trainer.placement=split`)."""
        self.automatic_optimization = False
        self.references = nn.ModuleDict()
        """Each agent's frozen KL reference (`algorithm.kl_coef > 0`), but for LoRA agents (`adapter_references`)."""
        self.adapter_references: set[str] = set()
        """LoRA agents with a KL penalty: their reference is their own model with the adapter off (no copy)."""
        if self.alg.kl_coef > 0:  # β = 0 must not load a reference model (docs/spec.md §6)
            for name, agent in agents.items():
                if is_lora(agent.model):
                    self.adapter_references.add(name)
                    continue
                reference = Agent(name, _frozen_copy(agent.model), agent.tokenizer, agent.cfg)
                self.references[name] = reference
        self.loss_settings = algorithm.loss_settings()
        self.advantage_settings = algorithm.advantage_settings()
        self.cross_cap = parse_cross_samples(self.alg.cross_samples_per_prompt)
        self.loss_stats = LossStats(self.names)
        self.cross_ratios = CrossRatioLog(self.names, every=update.diagnostics_every if algorithm.share_rollouts else 0)
        self.steps_done = 0
        self.counters = {name: {"rollouts_generated": 0, "responses_trained": 0, "optimizer_updates": 0,
                                "skipped_updates": 0} for name in self.names}
        self.fault_streak = {name: 0 for name in self.names}
        """Consecutive steps in which an agent skipped an update for a non-finite loss or gradient."""
        self.last_metrics: dict[str, float] = {}
        """The last training step's own scalars (the callbacks report theirs beside them)."""
        self.diagnostics: dict[str, list[tuple[int, float]]] = {}
        """Every step's diagnostics (`{agent}/diag/*`, `{agent}/omega/*`) as (step, value), for the summary."""
        self._pending: dict[str, float] = {}
        self.phase_listeners: list[Callable[[str], None]] = []
        """Called with a phase's name as the step enters it ("old_logprobs", "update", "logging"): a seam for
        the benchmark's per-phase memory (`bench/step.py`); the phases' times are the `time/*` metrics."""

    # -- metrics: one way in ----------------------------------------------------------------------

    def report(self, metrics: Mapping[str, float], *, step: int | None = None) -> None:
        """The one way scalars reach the loggers. Without `step` they join this training step's single
        write (`on_train_batch_end`, every `log_every` steps); with `step` (evaluation before or between
        steps) they are written at once at that step. One axis: steps done, so the scalars of the k-th
        training step and the evaluation after it are both at k (the evaluation before training at 0)."""
        if step is None:
            self._pending.update(metrics)
            return
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(dict(metrics), step=step)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """One logger write per step, after the callbacks reported theirs (Lightning calls the callbacks'
        hook first). Lightning's `self.log` costs milliseconds per key on CPU (a torchmetrics state per
        key), which at ~30 keys per agent was about a tenth of a tiny-model step (docs/PERFORMANCE.md)."""
        metrics, self._pending = self._pending, {}
        every = self.trainer.log_every_n_steps
        if metrics and every and self.steps_done % every == 0:
            self.report(metrics, step=self.steps_done)

    # -- optimizers -----------------------------------------------------------------------------

    def configure_model(self) -> None:
        mesh = getattr(self, "device_mesh", None)
        if mesh is None:
            return
        from hacrl_lightning.strategies import shard_agent

        precision = self.settings.precision
        self.placement.connect()
        for name, agent in self.agents.items():  # split: over its group's own mesh; shared: over the world
            own = self.placement.mesh(name, self.device.type) if self.placement.is_split else mesh["data_parallel"]
            shard_agent(agent.model, own, precision=precision)
            if name in self.references:  # frozen, sharded alike: same compute as its policy
                shard_agent(self.references[name].model, own, precision=precision)

    def configure_optimizers(self):
        self.residency.device = self.device  # Lightning has moved the agents there (offload_idle moves them back)
        optimizers, schedulers = [], []
        for name in self.local:
            agent = self.agents[name]
            opt = adamw(trainable_parameters(agent), agent.cfg)  # fused on CUDA
            warmup = agent.cfg.lr_warmup_steps
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda u, w=warmup: min(1.0, (u + 1) / w) if w else 1.0)
            optimizers.append(opt)
            schedulers.append({"scheduler": schedule, "interval": "step"})
            reference = self.references[name].model if name in self.references else None
            self.residency.register(name, agent.model, reference=reference, optimizer=opt)
        return optimizers, schedulers

    def _optimizers(self):
        opts, scheds = (one if isinstance(one, list) else [one] for one in (self.optimizers(), self.lr_schedulers()))
        assert len(opts) == len(self.local) == len(scheds), "one optimizer and schedule per agent, in agent order"
        return dict(zip(self.local, opts)), dict(zip(self.local, scheds))

    # -- the step -------------------------------------------------------------------------------

    def on_train_start(self) -> None:
        self.residency.offload_all()  # offload_idle: idle agents' state to the host from here on

    def on_train_end(self) -> None:
        self.residency.restore_all()  # exports and the summary read the weights where training left them

    def on_train_batch_start(self, batch, batch_idx) -> None:
        # RL forward passes run without dropout, so old and new log-probs of a response agree
        self.agents.eval()
        self.references.eval()

    def training_step(self, data: StepBatch, batch_idx):
        step = self.steps_done
        # The phases as docs/training.md numbers them; 1-4 arrive made by the DataModule (`RolloutDataModule.rollout`):
        # 1. Prompts: the step's P prompts (`StepBatchSampler`): data.examples
        # 2. Rollout: every agent's G responses per prompt from its current weights: data.rollouts
        # 3. Reward: one per response, gathered over ranks: data.rewards [P, n, G]
        # 4. Exchange: each learner's token view of the responses it trains on: data.views
        # 5. Fixed inputs: omega over the global batch and each mini-batch's cross lower bound, from the callbacks
        omega, lowers = self._step_values(data)                                            # [n, n], [M]
        for name in self.names:
            self.counters[name]["rollouts_generated"] += len(data.examples) * data.group_size

        # (5, continued) each learner's global plan; each source's old log-probs on its own responses (this rank's)
        plans = {name: self._plan(data.views[name], self.names.index(name), step) for name in self.local}
        self._phase("old_logprobs")
        start = time.perf_counter()
        old_mean, old_tokens, ref_tokens, mismatch = self._old_logprobs(data.views, plans, data.rewards.numel())
        old_s = time.perf_counter() - start

        # 6. Advantages from the joint rewards and the step's omega
        advantages = compute_advantages(data.rewards, omega, **self.advantage_settings)     # [n, P, n, G]
        self._phase("update")
        start = time.perf_counter()
        every = self.settings.diagnostics_every
        # the every-th step, counting from 1; only where learners train on partners' rows (else it measures 0)
        grad_share = every > 0 and (step + 1) % every == 0 and self.alg.share_rollouts
        metrics: dict[str, float] = {}
        # 7. Updates: each learner's mini-batches, own rows first, mini-batch m with the bound lowers[m]
        for name in self.local:
            k = self.names.index(name)
            tables = LearnerTables.of_step(data.views[name], k, advantages=self._advantages(data, advantages, k),
                                           old_mean=old_mean, old_tokens=old_tokens[name], omega=omega,
                                           ref_tokens=ref_tokens.get(name), rewards=data.rewards.flatten())
            metrics.update(self._update_or_fail(k, name, data.views[name], plans[name], tables, lowers, grad_share))
        metrics.update(view_metrics(data.views))
        metrics.update(padding_metrics(plans, data.views, self.settings.micro_batch_size))  # the passes' padding
        metrics = self._from_groups(metrics)  # split: every agent's figures, from its group
        stop_if_faulty(self.fault_streak, step, limit=self.settings.max_nonfinite_skips)
        mini_batches = {name: int(metrics[f"{name}/mini_batches"]) for name in self.names}
        metrics.update(self.loss_stats.compute(mini_batches))  # over all ranks
        self.loss_stats.reset()
        diagnostics_s = sum(metrics.pop(f"time/diagnostics/{name}", 0.0) for name in self.names)
        update_s = time.perf_counter() - start - diagnostics_s

        # 8. Metrics: the step's scalars, kept for the one logger write at the end of the step (`report`)
        self.steps_done += 1
        self._phase("logging")
        metrics.update(rollout_metrics(self.names, data, step_accuracy(data.rewards), omega,
                                       share_rollouts=self.alg.share_rollouts))
        metrics.update(clip_metrics(lowers, mini_batches))
        metrics.update(self.cross_ratios.end_step(self, step))  # diagnostics steps: partners' ratios, histograms
        metrics.update(mismatch)
        metrics.update({"time/rollout": data.timings["rollout"], "time/reward": data.timings["reward"],
                        "time/exchange": data.timings["exchange"], "time/old_logprobs": old_s,
                        "time/update": update_s, **({"time/diagnostics": diagnostics_s} if grad_share else {}),
                        "reward/timeouts": data.reward_stats.get("timeouts", 0),
                        "reward/crashes": data.reward_stats.get("crashes", 0),
                        "reward/term_failures": data.reward_stats.get("term_failures", 0)})
        self._record(step, metrics)
        for name in self.names:
            self.log(f"{name[:8]} train reward", metrics[f"{name}/reward"], prog_bar=True, logger=False,
                     on_step=True, on_epoch=False, batch_size=len(data.examples))
        # 9. Weight sync: `WeightSyncCallback`, at `on_train_batch_end` after this hook, before the logger write

    # -- pieces of the step -----------------------------------------------------------------------

    def _step_values(self, data: StepBatch) -> tuple[torch.Tensor, tuple[float, ...]]:
        """The step's omega and cross lower bounds, which the callbacks handed forward on the batch at
        `on_train_batch_start` (`CapabilityCallback`, `StepwiseClipCallback`)."""
        missing = [f"{key} (from {owner})" for key, owner in (("omega", "CapabilityCallback"),
                                                               ("cross_lower", "StepwiseClipCallback"))
                   if getattr(data, key) is None]
        if missing:
            raise RuntimeError(f"training step {self.steps_done + 1} arrived without {' and '.join(missing)}: give the "
                               "trainer those callbacks (`training.build_system` makes them)")
        return data.omega, data.cross_lower

    def _advantages(self, data: StepBatch, advantages: torch.Tensor, k: int) -> torch.Tensor:
        """Learner k's advantage of every response of the step, flat [P·n·G]; with
        `algorithm.partner_advantage_span=source`, the first learner's partner rows as the paper's code has them
        (`update.source_span`, docs/spec.md §11)."""
        flat = advantages[k].flatten()                                                      # [P·n·G]
        if self.alg.partner_advantage_span != "source" or k != 0:
            return flat
        view = data.views[self.names[k]]
        source_len = torch.tensor([len(data.rollouts[i].token_ids) for i in view.row_idx.tolist()])  # [B]
        flat = flat.clone()
        span = source_span(view.loss_mask, view.is_own, source_len)                        # [B] float64
        flat[view.row_idx] = (flat[view.row_idx] * span).to(flat.dtype)
        return flat

    def _update_or_fail(self, k: int, name: str, view: AgentView, plan: StepPlan, tables: LearnerTables,
                        lowers: tuple[float, ...], grad_share: bool) -> dict[str, float]:
        """`update_learner`, where any fault of the update ends the run naming the agent (`UpdateFailed`)."""
        try:
            with self.residency.resident(name, optimizer=True):
                return self.update_learner(k, name, view, plan, tables, lowers, grad_share=grad_share)
        except RunFailed:
            raise
        except Exception as err:  # noqa: BLE001 - any fault of an update ends the run naming the agent
            raise update_failed(name, self.steps_done, err, self.agents[name].cfg, self.settings.micro_batch_size,
                                self.trainer.default_root_dir) from err

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        """Keep the step's scalars (`last_metrics`, the diagnostics' history for the summary) and report them."""
        self.last_metrics = metrics
        omegas = {f"{name}/omega/{partner}" for name in self.names for partner in self.names}
        for key, value in metrics.items():
            if "/diag/" in key or key in omegas or "/rollout/logp_diff" in key:
                self.diagnostics.setdefault(key, []).append((step, value))
        self.report(metrics)

    def _phase(self, phase: str) -> None:
        for listener in self.phase_listeners:
            listener(phase)

    @property
    def _rank_world(self) -> tuple[int, int]:
        trainer = self._trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _group(self, name: str) -> tuple[int, int]:
        """(this rank's place, ranks) of the data-parallel group that trains `name`: the world under `shared`,
        the agent's own group under `split`."""
        if self.placement.is_split:
            return self.placement.rank_in(name), self.placement.size_of(name)
        return self._rank_world

    def _from_groups(self, metrics: dict[str, float]) -> dict[str, float]:
        """Under `split`: this step's per-agent figures (update metrics, counters, fault streaks) of every agent,
        each from its group's first rank, so every rank logs, checkpoints and summarises them all (a world
        collective of small objects). Under `shared` every rank has them already."""
        if not self.placement.is_split:
            return metrics
        import torch.distributed as dist
        first = [name for name in self.local if self.placement.rank_in(name) == 0]
        mine = {"metrics": {key: value for key, value in metrics.items()
                            if any(key.startswith(f"{name}/") or key == f"time/diagnostics/{name}" for name in first)},
                "counters": {name: self.counters[name] for name in first},
                "streak": {name: self.fault_streak[name] for name in first}}
        shares: list = [None] * self.placement.world
        dist.all_gather_object(shares, mine)
        merged = {}
        for share in shares:
            merged.update(share["metrics"])
            self.counters.update(share["counters"])
            self.fault_streak.update(share["streak"])
        return merged

    def _plan(self, view: AgentView, k: int, step: int) -> StepPlan:
        """Learner k's mini-batches over the global batch (`hacrl_lightning.plan`): own rows first, then partners' in
        agent order, each part shuffled by a generator seeded with (seed, step, k): every rank builds the same."""
        generator = torch.Generator().manual_seed(step_seed(self.settings.seed, step, salt=31 + k))
        order = learner_order(view.is_own, view.source_idx, view.prompt_idx, learner=k, cross_cap=self.cross_cap,
                              generator=generator, partners_first=self.alg.learner_order == "paper_main" and k == 1)
        rank, world = self._group(self.names[k])
        by_length = self.alg.kl_coef == 0 or self.alg.kl_agg_mode != "micro-token-mean"  # that KL is per pass
        return StepPlan.build(order, mini_batch_size=self.settings.mini_batch_size, rank=rank, world=world,
                              lengths=view.attention_mask.sum(-1), by_length=by_length,
                              tokens=self.settings.micro_batch_tokens)

    @torch.no_grad()
    def _old_logprobs(self, views: dict[str, AgentView], plans: dict[str, StepPlan], rows: int):
        """One forward pass per source over its own responses, before any update (docs/spec.md §5
        Decision). Each rank scores the own rows it will train on (its shares of the source's own
        mini-batches). Returns the source's mean old log-prob of every response of the step, in the
        flat (prompt, source, sample) order and the source's tokenization ([P·n·G], summed over ranks:
        each response is scored on exactly one rank), and per learner the per-token old (and
        reference) log-probs of this rank's own rows ([B, T], zero elsewhere), which the token-level
        loss and the KL use. Where the engine reported its log-probs of the sampled tokens, also how far
        they are from the trainer's (`_mismatch_metrics`)."""
        old_mean = torch.zeros(rows)                                                         # [P·n·G]
        old_tokens, ref_tokens = {}, {}
        diffs = torch.zeros(len(self.names), 3, dtype=torch.float64)                       # [n, (sum, count, max)]
        for name in self.local:
            view, k = views[name], self.names.index(name)
            try:
                with self.residency.resident(name, reference=True):
                    scores = score_own_rows(self.agents[name], view,
                                            plans[name].passes_where(view.is_own, self.settings.micro_batch_size),
                                            device=self.device, reference=self._reference_of(name))
            except Exception as err:  # noqa: BLE001 - an allocation failure is said in one line; others raise
                if not is_out_of_memory(err):
                    raise
                raise update_failed(name, self.steps_done, err, self.agents[name].cfg, self.settings.micro_batch_size,
                                    self.trainer.default_root_dir, phase="forward pass scoring its responses (old log-probs)"
                                    ) from err
            old_tokens[name], diffs[k] = scores.tokens, scores.engine_diff
            if scores.reference is not None:
                ref_tokens[name] = scores.reference
            old_mean[view.row_idx[scores.scored]] = scores.mean[scores.scored]
        return self._sum_over_ranks(old_mean), old_tokens, ref_tokens, self._mismatch_metrics(diffs)

    def _reference_of(self, name: str):
        """`token_logprobs` of `name`'s KL reference (its frozen copy; under LoRA its base model, the adapter off),
        or None without a KL term."""
        agent = self.agents[name]
        if name in self.references:
            return self.references[name].token_logprobs
        if name not in self.adapter_references:
            return None

        def base(*args, **kwargs):
            with adapter_disabled(agent.model):
                return agent.token_logprobs(*args, **kwargs)
        return base

    def _mismatch_metrics(self, diffs: torch.Tensor) -> dict[str, float]:
        """`step_metrics.mismatch_metrics` of `diffs` [n, (sum, count, max)], summed (the max: reduced) over ranks."""
        diffs = diffs.clone()                                                              # [n, 3]
        maxima = diffs[:, 2].clone()
        diffs[:, 2] = 0.0
        diffs = self._sum_over_ranks(diffs)
        if self._rank_world[1] > 1:
            import torch.distributed as dist
            maxima = maxima.to(self.device)
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
            maxima = maxima.cpu()
        return mismatch_metrics(self.names, diffs[:, :2], maxima)

    def update_learner(self, k: int, name: str, view: AgentView, plan: StepPlan, tables: LearnerTables,
                       lowers: tuple[float, ...], *, grad_share: bool = False) -> dict[str, float]:
        """All mini-batch updates of learner k (`name`) in this step, over its view and plan with its
        tables (`LearnerTables.of_step`), mini-batch m with the cross lower bound `lowers[m]`; returns its
        metrics that need no reduction over ranks and adds the loss metrics to `self.loss_stats`.
        `grad_share`: first measure the gradient share of cross responses (`grad_share.py`, before the
        update and without changing it). A public seam: tests wrap it to watch one learner's update.

        Each mini-batch is normalised over the *global* mini-batch (its sequences, or its tokens for
        token-mean), and this rank's loss is scaled by the world size because FSDP averages gradients
        over ranks: the update equals the one a single device makes on the whole mini-batch."""
        opts, scheds = self._optimizers()
        agent, opt, sched = self.agents[name], opts[name], scheds[name]
        token_level = self.alg.ratio_level == "token"
        diagnostics = {}
        if grad_share:
            start = time.perf_counter()
            # the optimizer's parameters: under FSDP2 the sharded ones the gradients land on (between a
            # forward and its backward, `agent.parameters()` may hold unsharded stand-ins)
            params = [p for group in opt.param_groups for p in group["params"]]
            backward = partial(self._backward, agent, view, plan, tables, lowers,  # (m, micro_batch, part),
                               own_old_is_new=True)                              # no update yet
            diagnostics = measure_grad_share(name, params, plan, view.is_own, self.settings.micro_batch_size, backward)
            diagnostics[f"time/diagnostics/{name}"] = time.perf_counter() - start
        grad_norms, skipped = [], []
        updated = False  # no update of this learner yet: its own rows' ratio is exactly 1
        for m in range(len(plan)):
            opt.zero_grad(set_to_none=True)
            finite_loss, stats = torch.ones((), dtype=torch.bool, device=self.device), []
            for micro_batch in plan.passes(m, self.settings.micro_batch_size):  # no pass reads a value to the host
                loss, metrics, micro = self._backward(agent, view, plan, tables, lowers, m, micro_batch,
                                                      own_old_is_new=not updated)
                finite_loss &= torch.isfinite(loss.detach())
                if micro_batch.counts:
                    stats.append((metrics, (micro.loss_mask & micro.is_own[:, None]).sum() if token_level else None))
            grad_norm = total_grad_norm(agent.parameters(), agent.cfg.grad_clip)
            finite, stats = host_values(self._finite_on_every_rank(finite_loss & torch.isfinite(grad_norm), name), stats)
            for metrics, own_tokens in stats:  # one copy to the host per mini-batch
                self.loss_stats.update(name, metrics, own_weight=own_tokens)
            if not finite:
                opt.zero_grad(set_to_none=True)  # skip: weights, optimizer state and LR schedule stay as they were
                skipped.append(m)
                continue
            grad_norms.append(grad_norm)
            opt.step()
            sched.step()
            updated = True
            self.counters[name]["optimizer_updates"] += 1
        self.counters[name]["responses_trained"] += len(plan.rows)
        count_faults(self.fault_streak, self.counters, name, self.steps_done, skipped,
                     limit=self.settings.max_nonfinite_skips, warn=self._group(name)[0] == 0)
        return {**diagnostics, f"{name}/grad_norm": _detach_mean(grad_norms), f"{name}/updates": float(len(grad_norms)),
                f"{name}/skipped_updates": float(len(skipped)), f"{name}/mini_batches": float(len(plan)),
                f"{name}/degenerate/zero_adv_frac":
                    float((tables.advantages[plan.rows] == 0).float().mean()) if len(plan) else 0.0}

    def _backward(self, agent: Agent, view: AgentView, plan: StepPlan, tables: LearnerTables, lowers: tuple[float, ...],
                  m: int, micro_batch: MicroBatch, part: str | None = None, *, own_old_is_new: bool = False):
        """One pass of the update (or of `part` of it, "self" or "cross"): the forward of `micro_batch`'s rows
        of mini-batch m, `hacpo_loss` normalised over the global mini-batch, and the backward of the loss
        scaled by the world size times the pass's weight. Returns the loss, its metrics and the micro view."""
        micro, first = to_device(view, micro_batch.rows, self.device)
        logp = agent.token_logprobs(micro.input_ids, micro.attention_mask, temperature=agent.cfg.temperature,
                                    first_target=first)                                                         # [b, T]
        inputs = loss_inputs(view, micro, micro_batch.rows, plan.mini_batches[m], logp, tables, cross_lower=lowers[m],
                             loss_scale_factor=float(agent.cfg.max_response_len),
                             engine_logp=self.alg.rollout_is_cap > 0, part=part, micro_batches=micro_batch.passes,
                             own_old_is_new=own_old_is_new)
        loss, metrics = hacpo_loss(**self.loss_settings, **inputs)
        self.cross_ratios.add(agent.name, self.steps_done, micro_batch, view, inputs, part)  # diagnostics steps only
        self.manual_backward(loss * (micro_batch.weight * float(plan.world)))  # FSDP averages over the plan's ranks
        return loss, metrics, micro

    def _finite_on_every_rank(self, finite: torch.Tensor, name: str) -> torch.Tensor:
        """1 (on the device) when no rank of `name`'s group saw a non-finite loss or gradient (its ranks then skip or
        step together)."""
        finite = finite.float()
        if self._group(name)[1] > 1:
            import torch.distributed as dist

            dist.all_reduce(finite, op=dist.ReduceOp.MIN, group=self.placement.process_group(name))
        return finite

    def _sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `values` over data-parallel ranks (a copy on this rank's device and back)."""
        if self._rank_world[1] == 1:
            return values
        import torch.distributed as dist
        total = values.to(self.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.to(values.device)

    # -- checkpoint extras ------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["hacrl"] = {"steps_done": self.steps_done, "counters": self.counters, "agents": self.names,
                               "fault_streak": self.fault_streak, "diagnostics": self.diagnostics}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["hacrl"]
        if state["agents"] != self.names:
            raise ValueError(f"checkpoint agents {state['agents']} != this run's {self.names}; resume with the same agents")
        self.steps_done = state["steps_done"]
        self.counters = state["counters"]
        self.fault_streak = state.get("fault_streak", {name: 0 for name in self.names})
        self.diagnostics = {key: [tuple(pair) for pair in pairs] for key, pairs in state.get("diagnostics", {}).items()}


def _frozen_copy(model: nn.Module) -> nn.Module:
    import copy

    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    reference.eval()
    return reference
