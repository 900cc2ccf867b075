"""Building a zoo preset: its tokenizer and model from the recipe, seeded and on a fixed thread count, the
warm-start's supervised steps on the synthetic task, its held-out greedy accuracy, the export. Deliberately not
here: the recipes (`presets.py`) and where builds are kept (`store.py`)."""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from typing import Any, Iterator, Sequence

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.agents.tokenizers import build_tokenizer
from hacrl_lightning.data.synthetic import format_answer, synthetic_examples
from hacrl_lightning.rewards.exact_match import exact_match_reward
from hacrl_lightning.zoo.presets import ZooSpec

stats: Counter = Counter()
"""Process-wide counters: `builds` (builds run), `shipped` (shipped builds copied into a cache) and `hits`
(cache entries reused), builds per preset too."""


def corpus(spec: ZooSpec) -> list[str]:
    """The fixed text a BPE tokenizer is trained on: train-split prompts and answers, turn markers."""
    examples = synthetic_examples(spec.task, "train", 3000)
    markers = ["User:", "Assistant:", "System:", "Q:", "A:", "[INST]", "[/INST]", "user", "assistant", "system"]
    return [ex.prompt for ex in examples] + [format_answer(ex.gold) for ex in examples] + markers


def build_model(spec: ZooSpec, tokenizer) -> torch.nn.Module:
    """A randomly initialised model of `spec.model_type`, seeded, sized for `tokenizer`; its
    generation config ends a response at any of the tokenizer spec's `end_tokens`."""
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = AutoConfig.for_model(spec.model_type, vocab_size=len(tokenizer), **special, **spec.model_config)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if spec.warm_start.steps == 0:
        # built on every user's machine (never shipped), so its only random content must be portable; a
        # warm-started preset keeps its architecture's own initialisation: its training is not portable
        # anyway, and its build ships
        portable_init(model, seed=spec.seed, std=getattr(config, "initializer_range", 0.02))
    ends = tokenizer.convert_tokens_to_ids(list(spec.tokenizer.end_tokens))
    model.generation_config = GenerationConfig(**{**special, "eos_token_id": ends if len(ends) > 1 else ends[0]})
    return model


def portable_init(model: torch.nn.Module, *, seed: int, std: float) -> None:
    """Redraw every randomly initialised parameter from U(-sqrt(3) std, sqrt(3) std) (the variance of the
    architecture's N(0, std^2)), the same bits on every CPU: integer random bits from a seeded generator,
    then exactly rounded scalar arithmetic. torch's `normal_` is not portable: its vectorised Box-Muller
    (an AVX2 kernel and a generic one) gave tiny_qwen3 other weights under another `ATEN_CPU_CAPABILITY`
    (2026-11-25). Constant tensors (norm weights, zero biases) keep their values."""
    generator = torch.Generator().manual_seed(seed)
    scale = 3.0 ** 0.5 * std
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):  # tied weights appear once
            flat = param.detach().flatten()
            if bool((flat == flat[0]).all()):
                continue
            bits = torch.randint(0, 1 << 24, param.shape, generator=generator, dtype=torch.int64)
            param.copy_((bits.to(torch.float32) / float(1 << 23) - 1.0) * scale)  # each step exact or IEEE-rounded


def _rows(agent: Agent, examples: Sequence) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) per example, in the agent's tokens."""
    prompts = agent.encode_prompts([ex.prompt for ex in examples])
    answers = agent.encode_response([format_answer(ex.gold) for ex in examples])
    return [(p, a + [agent.eos_token_id]) for p, a in zip(prompts, answers)]


def _batch(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded input ids, attention mask and loss mask (True on response tokens)."""
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (prompt, response) in enumerate(rows):
        n, m = len(prompt), len(response)
        input_ids[i, : n + m] = torch.tensor(prompt + response)
        attention_mask[i, : n + m] = 1
        loss_mask[i, n : n + m] = True
    return input_ids, attention_mask, loss_mask


def greedy_responses(agent: Agent, prompts: Sequence[str], *, max_new_tokens: int | None = None,
                     batch_size: int = 128) -> list[str]:
    """Greedy responses (decoded, EOS dropped) of `agent` to question texts, through the rollout
    engine the trainer uses: the zoo's accuracy probe."""
    from hacrl_lightning.rollout.hf import HFEngine
    from hacrl_lightning.rollout.engine import SamplingSettings

    engine = HFEngine(agent.model, eos_token_ids=agent.eos_token_ids, pad_token_id=agent.pad_token_id,
                      batch_size=batch_size)
    settings = SamplingSettings.for_agent(agent.cfg, n=1, seed=None, temperature=0.0, max_new_tokens=max_new_tokens)
    return [agent.decode_response(g.token_ids) for g in engine.generate(agent.encode_prompts(prompts), settings)]


def greedy_accuracy(agent: Agent, examples: Sequence) -> float:
    """Mean exact-match reward of greedy responses on `examples` (records with `.prompt`, `.gold`)."""
    responses = greedy_responses(agent, [ex.prompt for ex in examples])
    return sum(exact_match_reward(r, ex.gold) for r, ex in zip(responses, examples)) / max(1, len(examples))


def warm_start(agent: Agent, spec: ZooSpec, *, log=None) -> dict[str, Any]:
    """`spec.warm_start.steps` supervised steps on `\\boxed{gold}` answers; the probe's greedy accuracy
    every `eval_every` steps is recorded (`history`), it decides nothing."""
    ws = spec.warm_start
    if ws.steps == 0:
        return {"steps": 0, "probe_accuracy": None, "history": []}
    pool = synthetic_examples(spec.task, "train", ws.pool_size + ws.probe_size)
    probe, train = pool[: ws.probe_size], pool[ws.probe_size :]
    rows = _rows(agent, train)
    rng = random.Random(spec.seed)
    optimizer = torch.optim.AdamW(agent.parameters(), lr=ws.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / ws.warmup_steps))
    history: list[tuple[int, float]] = []
    accuracy = None
    for step in range(1, ws.steps + 1):
        agent.train()
        input_ids, attention_mask, loss_mask = _batch(rng.sample(rows, ws.batch_size), agent.pad_token_id)
        logprobs = agent.token_logprobs(input_ids, attention_mask)                        # [B, T]
        loss = -(logprobs * loss_mask).sum() / loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % ws.eval_every == 0 or step == ws.steps:
            accuracy = greedy_accuracy(agent, probe)
            history.append((step, accuracy))
            if log and (step % (4 * ws.eval_every) == 0 or step == ws.steps):
                log(f"[zoo] {spec.name}: step {step} loss {loss.item():.3f} probe accuracy {accuracy:.3f}")
    agent.zero_grad(set_to_none=True)
    agent.eval()
    return {"steps": ws.steps, "probe_accuracy": accuracy, "history": history}


HELDOUT_SIZE = 256
"""Held-out problems the manifest's accuracy is measured on (first 256 of the eval split)."""


def build(spec: ZooSpec, out_dir: str | os.PathLike, *, log=None,
          cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Build, warm-start and export `spec` into `out_dir`; return the facts for the manifest.
    `cache_dir`: the zoo cache, where a `registry` tokenizer's fetched files are kept."""
    start = time.perf_counter()
    with _deterministic(spec.seed):
        tokenizer = build_tokenizer(spec.tokenizer, corpus(spec), spec.chat_template, cache_dir=cache_dir)
        agent = Agent(spec.name, build_model(spec, tokenizer), tokenizer, spec.agent_config())
        training = warm_start(agent, spec, log=log)
        heldout = greedy_accuracy(agent, synthetic_examples(spec.task, "eval", HELDOUT_SIZE)) \
            if training["steps"] else None
    agent.export(out_dir, writes=True)  # whichever rank holds the build lock writes (transformers: rank 0 only)
    facts = {
        "parameters": sum(p.numel() for p in agent.parameters()),
        "vocab_size": len(tokenizer),
        "architecture": type(agent.model).__name__,
        "heldout_accuracy": heldout,
        "heldout_size": HELDOUT_SIZE,
        "build_seconds": round(time.perf_counter() - start, 2),
        "built_on": built_on(),
        **training,
    }
    stats["builds"] += 1
    stats[f"builds/{spec.name}"] += 1
    return facts


def built_on() -> dict[str, str]:
    """What a build's last bits depend on: torch, transformers, the CPU kernels torch picked."""
    import platform

    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine()}


BUILD_THREADS = 2
"""Intra-op threads of every build, whatever the machine's core count: how a CPU kernel splits a
reduction between threads changes its rounding, so tiny_c built on 1 thread had other weights than on 2
(2026-11-25). A fixed count makes the weights independent of the machine's core count; 2 rather than 1
because a build on one thread takes ~1.45x as long on a 2-core machine (oversubscribing a 1-core
machine costs it little)."""


@contextlib.contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seeded torch RNG, deterministic kernels and `BUILD_THREADS` intra-op threads (each restored
    afterwards) for a reproducible build."""
    previous, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_num_threads(BUILD_THREADS)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(previous)
