"""One HACPO step for N agents in plain PyTorch + transformers, top to bottom: read this first.

`hacpo_step` is the step of docs/training.md in one function, its comments numbered as that page numbers the phases.
Every agent answers every prompt G times with its own sampling; one reward scores each response; each learner sees
every response in its own tokenization; each source scores its own responses once (old log-probs), the capability
window gives omega; then advantages, and one AdamW update per mini-batch, own rows first. `HACRLModule.training_step`
does the same through Lightning; tests/test_reference.py checks that one step here makes the framework's update, and
the bare loop of `bench.py step` runs this step. The math is the repo's pure functions (`hacrl_lightning.algorithms`),
the rollout records and token views come from `exchange.py`, and the engines are the framework's (`rollout/`).

Deliberately not here: Lightning, data parallelism and FSDP, micro-batching (one forward pass per mini-batch), devices
other than the CPU (tensors stay where `view_for` makes them), the KL reference (kl_coef > 0), token-level ratios
(grpo), own-only views (gspo), a cap on partners' responses per prompt, the rollout importance-sampling correction, LR
warm-up, skipping non-finite updates, reward time-outs, checkpoints and logging. `check_supported` refuses a config
that needs one of them.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import torch

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.exchange import AgentView, Rollout, make_rollouts, view_for
from hacrl_lightning.agents.lora import trainable_parameters
from hacrl_lightning.algorithms import (CapabilityWindow, compute_advantages, cross_clip_lower, hacpo_loss,
                                        sequence_mean_logp, step_accuracy)
from hacrl_lightning.data.records import Example
from hacrl_lightning.rewards import get_reward
from hacrl_lightning.rollout import RolloutEngine, SamplingSettings, engine_options, make_engine
from hacrl_lightning.step import step_seed

__all__ = ["Step", "check_supported", "exchange", "generate", "hacpo_step", "hf_engines", "make_optimizers",
           "old_logprobs", "score", "update_learner"]


class Step(NamedTuple):
    """What one step made: the rollouts in the flat (prompt, source, sample) order, their rewards
    [P, n, G], each learner's token view, and the step's metrics (under the framework's keys)."""

    rollouts: list[Rollout]
    rewards: torch.Tensor
    views: dict[str, AgentView]
    metrics: dict[str, float]


def check_supported(cfg) -> None:
    """Refuse a run config (`TrainConfig`) that needs something this file leaves out, naming each setting."""
    alg = cfg.algorithm
    plain = {"share_rollouts": True, "ratio_level": "sequence", "kl_coef": 0.0, "rollout_is_cap": 0.0,
             "rollout_multiplier": 1, "cross_samples_per_prompt": "all", "learner_order": "own_first",
             "partner_advantage_span": "learner", "kl_agg_mode": "policy"}
    needs = [f"algorithm.{key}={getattr(alg, key)}" for key, value in plain.items() if getattr(alg, key) != value]
    needs += [f"agents.{name}.lr_warmup_steps={agent.lr_warmup_steps}"
              for name, agent in cfg.agents.items() if agent.lr_warmup_steps]
    needs += ["data.rewards (a sum of rewards)"] if cfg.data.rewards else []
    needs += [f"data.reward={cfg.data.reward} (code of your own)"] if ":" in cfg.data.reward else []
    if needs:
        raise ValueError(f"reference.py has no {', '.join(needs)} (its docstring lists what it leaves out); "
                         "train such a run with the framework (scripts/train.py)")


def make_optimizers(agents: dict[str, Agent]) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per agent over what it trains (a LoRA agent's adapters), with its own lr, betas and weight decay."""
    return {name: torch.optim.AdamW(trainable_parameters(a), lr=a.cfg.lr, betas=tuple(a.cfg.betas),
                                    weight_decay=a.cfg.weight_decay) for name, a in agents.items()}


def hf_engines(agents: dict[str, Agent], batch_size: int = 64) -> dict[str, RolloutEngine]:
    """transformers `generate` on each agent's own model, `batch_size` sequences at a time (`rollout/hf.py`)."""
    return {name: make_engine("hf", agent.model, **engine_options(agent, "hf", batch_size=batch_size))
            for name, agent in agents.items()}


def generate(agents: dict[str, Agent], engines: dict[str, RolloutEngine], examples: Sequence[Example], *,
             G: int, seed: int, step: int) -> dict[str, list]:
    """Phase 2: every agent answers every prompt, in its own chat template, G times with its own sampling
    (temperature, top-p, top-k, max_response_len), seeded by (run seed, step, agent) as the DataModule
    seeds rank 0. Returns agent -> [P·G] `Generation`s (ids in the agent's vocabulary), prompt-major."""
    out = {}
    for j, (name, agent) in enumerate(agents.items()):
        prompt_ids = agent.encode_prompts([ex.prompt for ex in examples])                 # P lists of ids
        sampling = SamplingSettings.for_agent(agent.cfg, n=G, seed=step_seed(seed, step, 1000 * j))
        out[name] = engines[name].generate(prompt_ids, sampling)
    return out


def score(agents: dict[str, Agent], examples: Sequence[Example], generations: dict[str, list], *,
          reward: str) -> tuple[list[Rollout], torch.Tensor]:
    """Phase 3: each response decoded once by its source (`make_rollouts`: cut after the first EOS) and
    scored once against the gold answer. Returns the rollouts, flat (prompt, source, sample), and their
    rewards [P, n, G]."""
    reward_fn, names = get_reward(reward), list(agents)
    per_source = {name: make_rollouts(agents[name], examples, generations[name]) for name in names}
    G = len(generations[names[0]]) // len(examples)
    rollouts = []
    for p, example in enumerate(examples):
        for name in names:
            for rollout in per_source[name][p * G : (p + 1) * G]:
                rollout.reward = float(reward_fn(rollout.response, example.gold))
                rollouts.append(rollout)
    return rollouts, torch.tensor([r.reward for r in rollouts]).view(len(examples), len(names), G)


def exchange(agents: dict[str, Agent], rollouts: list[Rollout], examples: Sequence[Example]) -> dict[str, AgentView]:
    """Phase 4 (docs/spec.md §8, `view_for`): each learner's view of every response, the prompt in the
    learner's chat template, its own responses in their sampled ids, a partner's decoded text re-encoded by
    the learner (+ the learner's EOS when the source finished). `row_idx` is each row's flat place."""
    prompt_ids, flat = [ex.prompt_id for ex in examples], list(range(len(rollouts)))
    return {name: view_for(agent, rollouts, sources=list(agents), prompt_ids=prompt_ids, rows=flat)
            for name, agent in agents.items()}


@torch.no_grad()
def old_logprobs(agents: dict[str, Agent], views: dict[str, AgentView]) -> torch.Tensor:
    """Phase 5's old log-probs (docs/spec.md §5 Decision): each source scores its own responses once, before any
    update: the mean log-prob over the response's tokens in the source's tokenization, which every learner's
    ratio (Eq. 11) divides by. Returns [P·n·G] in the flat order."""
    old_mean = torch.zeros(len(next(iter(views.values()))))                               # [P·n·G]
    for name, agent in agents.items():
        own = views[name].select(torch.nonzero(views[name].is_own).flatten())                # [P·G rows, T]
        logp = agent.token_logprobs(own.input_ids, own.attention_mask, temperature=agent.cfg.temperature)
        old_mean[own.row_idx] = sequence_mean_logp(logp, own.loss_mask)                      # [P·G]
    return old_mean


def update_learner(k: int, agent: Agent, optimizer: torch.optim.Optimizer, view: AgentView, *, cfg, step: int,
                   advantages: torch.Tensor, old_mean: torch.Tensor, omega: torch.Tensor,
                   rewards: torch.Tensor) -> dict[str, float]:
    """Phase 7 for learner k: every update of this step. advantages, old_mean, rewards: [P·n·G] flat;
    omega [n, n]. Returns k's loss (mean over mini-batches), grad norm, update count and mean cross bound."""
    # rows own-first, then each partner's in agent order (docs/spec.md §6 Decision), each part shuffled by a
    # generator seeded with (seed, step, k): the draws of `plan.learner_order`, so the order is the framework's
    g = torch.Generator().manual_seed(step_seed(cfg.seed, step, salt=31 + k))
    own, cross = torch.nonzero(view.is_own).flatten(), torch.nonzero(~view.is_own).flatten()
    own, cross = own[torch.randperm(len(own), generator=g)], cross[torch.randperm(len(cross), generator=g)]
    order = torch.cat([own, cross[torch.argsort(view.source_idx[cross], stable=True)]])    # [n·P·G]
    alg, size = cfg.algorithm, cfg.trainer.mini_batch_prompts * cfg.responses_per_prompt
    losses, norms, bounds = [], [], []
    for m, rows in enumerate(order.split(size)):                                          # m = 0, 1, ... this step
        batch = view.select(rows)                                                         # [B, T], padding trimmed
        logp = agent.token_logprobs(batch.input_ids, batch.attention_mask, temperature=agent.cfg.temperature)
        lower = cross_clip_lower(m, alg.delta, alg.delta_step)                            # Eq. 14, rises with m
        old = torch.where(batch.is_own & (m == 0), sequence_mean_logp(logp.detach(), batch.loss_mask),  # [B]: m = 0,
                          old_mean[batch.row_idx])   # no update yet, own rows' old log-probs are these (docs/spec.md §5)
        loss, _ = hacpo_loss(                                                             # Eqs. 47-52, docs/spec.md §6
            logp_new=logp, loss_mask=batch.loss_mask, is_own=batch.is_own, cross_lower=lower,
            advantages=advantages[batch.row_idx], old_logp_mean=old,                       # [B], [B]
            omega_factor=omega[batch.source_idx, k], rewards=rewards[batch.row_idx],       # omega[j, k]: [B]
            total_seqs=float(len(rows)), total_tokens=batch.loss_mask.sum().clamp(min=1),  # the whole mini-batch
            loss_scale_factor=float(agent.cfg.max_response_len), **alg.loss_settings())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()                                                                   # then this agent's clip
        norms.append(float(torch.nn.utils.clip_grad_norm_(agent.parameters(), agent.cfg.grad_clip or math.inf)))
        optimizer.step()                                                                  # one AdamW step per m
        losses.append(float(loss.detach()))
        bounds += [lower] * int((~batch.is_own).sum())
    name = agent.name
    return {f"{name}/loss/total": sum(losses) / len(losses), f"{name}/grad_norm": sum(norms) / len(norms),
            f"{name}/updates": float(len(losses)),
            **({f"{name}/clip/cross_lower": sum(bounds) / len(bounds)} if bounds else {})}


def hacpo_step(agents: dict[str, Agent], optimizers: dict[str, torch.optim.Optimizer],
               engines: dict[str, RolloutEngine], examples: Sequence[Example], window: CapabilityWindow, *, cfg,
               step: int, phase: Callable[[str], None] = lambda name: None) -> Step:
    """Algorithm 1 (docs/spec.md §7) once, on the P prompts `examples` at training step `step` (0-based).
    cfg: the run's `TrainConfig` (`check_supported`); window: the capability window, kept across steps;
    phase(name): called as each phase starts ("rollout", "reward", "exchange", "old_logprobs", "update").
    The comments number the phases as docs/training.md does; phase 5's parts run in the opposite order to the
    framework's (neither reads the other), each bound inside `update_learner`; 9 is the caller's."""
    check_supported(cfg)
    names = list(agents)
    for agent in agents.values():
        agent.eval()                                         # no dropout: old and new log-probs agree
    # 1. Prompts: `examples`, the caller's P (`bench.py step` draws them with `StepBatchSampler`)
    phase("rollout")                                         # 2. Rollout: G responses per prompt per agent
    generations = generate(agents, engines, examples, G=cfg.responses_per_prompt, seed=cfg.seed, step=step)
    phase("reward")                                          # 3. Reward: one per response
    rollouts, rewards = score(agents, examples, generations, reward=cfg.data.reward)        # [P, n, G]
    phase("exchange")                                        # 4. Exchange: each learner's tokenization of all
    views = exchange(agents, rollouts, examples)
    phase("old_logprobs")                                    # 5. Fixed inputs: each source's old log-probs,
    old_mean = old_logprobs(agents, views)                                                # [P·n·G]
    phase("update")                                          #    capability (Eq. 9) and omega (Eq. 8)
    acc = step_accuracy(rewards)                                                          # [n]
    window.update(acc)
    omega = window.omega()                                                                # [n, n]
    advantages = compute_advantages(rewards, omega, **cfg.algorithm.advantage_settings())  # 6. Advantages [n,P,n,G]
    metrics = {}
    for k, name in enumerate(names):                         # 7. Updates: each learner's, own rows first
        metrics.update(update_learner(k, agents[name], optimizers[name], views[name], cfg=cfg, step=step,
                                      advantages=advantages[k].flatten(), old_mean=old_mean, omega=omega,
                                      rewards=rewards.flatten()))
    for j, name in enumerate(names):                         # 8. Metrics: the framework's keys
        metrics[f"{name}/reward"], metrics[f"{name}/acc"] = float(rewards[:, j].mean()), float(acc[j])
        metrics.update({f"{name}/omega/{partner}": float(omega[i, j]) for i, partner in enumerate(names) if i != j})
    return Step(rollouts, rewards, views, metrics)           # 9. Weight sync: the caller's, where engines need it
