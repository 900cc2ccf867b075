"""The architecture reader: a model's numbers, read from its config.json without loading it.

`architecture_of(name, agent)` finds an agent's config.json offline: a hub preset's architecture ships beside
the presets (`agents/arch/<hub id>.json`, `arch_file`, `ARCH_DIRS`), else the hub model's config.json in the
local Hugging Face cache; a local model directory and a zoo agent are read from their own config.json (a zoo
build is made once into the cache). `Architecture.from_config` turns those numbers into an `Architecture`:
parameter and tensor counts, the linear layers LoRA adapts, the KV cache and the activations one token
takes, per the `FAMILIES` table (what each transformers `model_type` builds beyond its sizes). An agent whose
architecture is not known offline raises `UnknownArchitecture` naming the file to add; `run_architectures`
reads every agent of a run and turns those into problems.

Deliberately not here: loading weights or tokenizers, any download, and planning: what an architecture costs
on a GPU is `memory.py`'s (`plan_memory`); which agents live on which ranks is `placement.py`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hacrl_lightning.config import LORA_TARGETS_ALL, TrainConfig
from hacrl_lightning.errors import Problem

ARCH_DIRS = (Path(__file__).resolve().parent / "configs" / "agents" / "arch",   # a wheel install
             Path(__file__).resolve().parents[1] / "agents" / "arch")           # a checkout
"""Where hub presets' architectures ship: `<dir>/<hub id>.json` (config.json's numbers)."""


@dataclass(frozen=True)
class Family:
    """What a transformers `model_type` builds, beyond config.json's sizes (data, not branches)."""

    gated_mlp: bool = True
    """SwiGLU (gate, up, down) rather than two matrices (fc, proj)."""
    qk_norm: bool = False
    """An RMSNorm over each head's queries and keys (Qwen3)."""
    layer_norm: bool = False
    """LayerNorm (weight and bias) rather than RMSNorm (weight)."""
    learned_positions: bool = False
    """A learned position embedding of max_positions rows (GPT-2)."""
    attention_bias: bool = False
    """Biases of q, k, v and the output projection when config.json does not say (`attention_bias`)."""
    mlp_bias: bool = False
    """Biases of the MLP's matrices when config.json does not say (`mlp_bias`)."""
    fused_qkv: bool = False
    """q, k and v in one matrix (one tensor, one bias)."""
    keys: Mapping[str, str] = field(default_factory=dict)
    """config.json's names for the standard keys (GPT-2's n_embd for hidden_size, ...)."""
    linears: tuple = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """The names of a block's linear layers, in `Architecture.block_linears`' order (attention's q, k, v or fused
    qkv, then its output; the MLP's gate, up, down or in, out): what LoRA's `target_modules` name."""


GPT2_KEYS = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
             "max_position_embeddings": "n_positions", "intermediate_size": "n_inner"}
FAMILIES: Dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    "qwen3": Family(qk_norm=True),
    "gpt2": Family(gated_mlp=False, layer_norm=True, learned_positions=True, attention_bias=True, mlp_bias=True,
                   fused_qkv=True, keys=GPT2_KEYS, linears=("c_attn", "c_proj", "c_fc", "c_proj")),
    "gpt_neox": Family(gated_mlp=False, layer_norm=True, attention_bias=True, mlp_bias=True, fused_qkv=True,
                       linears=("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")),
}
"""The model types whose parameters and activations the plan knows (`test_memory_plan` builds each)."""


class UnknownArchitecture(LookupError):
    """An agent whose architecture is not known offline; the message names the file to add."""


@dataclass(frozen=True)
class Architecture:
    """The numbers of a config.json that memory depends on."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_positions: int
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, source: str = "config.json") -> "Architecture":
        """From a config.json's dict; raises UnknownArchitecture for a model type not in FAMILIES."""
        model_type = config.get("model_type")
        if model_type not in FAMILIES:
            raise UnknownArchitecture(f"{source}: model_type {model_type!r} is not one the memory plan knows "
                                      f"({sorted(FAMILIES)}); add it to hacrl_lightning.architecture.FAMILIES")
        family = FAMILIES[model_type]
        get = lambda key, default=None: config.get(family.keys.get(key, key), default)  # noqa: E731
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(model_type=model_type, layers=int(get("num_hidden_layers")), hidden=hidden,
                   intermediate=int(get("intermediate_size") or 4 * hidden), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads), head_dim=int(get("head_dim") or hidden // heads),
                   vocab=int(get("vocab_size")), tied_embeddings=bool(get("tie_word_embeddings", True)),
                   max_positions=int(get("max_position_embeddings")),
                   attention_bias=bool(get("attention_bias", family.attention_bias)),
                   mlp_bias=bool(get("mlp_bias", family.mlp_bias)))

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    def _norm(self, width: int) -> int:
        return 2 * width if self.family.layer_norm else width

    @property
    def block_parameters(self) -> int:
        """One transformer block: attention (q, k, v, out), its norms, the MLP."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv + h) if self.attention_bias else 0)
        qk_norm = 2 * self.head_dim if self.family.qk_norm else 0
        matrices = 3 if self.family.gated_mlp else 2
        mlp = matrices * h * self.intermediate + (((matrices - 1) * self.intermediate + h) if self.mlp_bias else 0)
        return attention + qk_norm + mlp + 2 * self._norm(h)

    @property
    def root_parameters(self) -> int:
        """Outside the blocks: embeddings, final norm, an untied LM head (FSDP2's root unit)."""
        h = self.hidden
        embeddings = self.vocab * h + (self.max_positions * h if self.family.learned_positions else 0)
        return embeddings + self._norm(h) + (0 if self.tied_embeddings else self.vocab * h)

    @property
    def parameters(self) -> int:
        return self.layers * self.block_parameters + self.root_parameters

    @property
    def parameter_tensors(self) -> int:
        """How many parameter tensors (AdamW keeps one `step` scalar for each)."""
        per_norm = 2 if self.family.layer_norm else 1
        attention = (2 if self.family.fused_qkv else 4) * (2 if self.attention_bias else 1) \
            + (2 if self.family.qk_norm else 0)
        mlp = (3 if self.family.gated_mlp else 2) * (2 if self.mlp_bias else 1)
        block = attention + mlp + 2 * per_norm
        root = 1 + (1 if self.family.learned_positions else 0) + per_norm + (0 if self.tied_embeddings else 1)
        return self.layers * block + root

    def block_linears(self) -> List[tuple[str, int, int]]:
        """(name, in features, out features) of each linear layer of one block (`Family.linears`)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        attention = [(h, q + 2 * kv), (q, h)] if self.family.fused_qkv else [(h, q), (h, kv), (h, kv), (q, h)]
        mlp = [(h, i), (h, i), (i, h)] if self.family.gated_mlp else [(h, i), (i, h)]
        return [(name, fan_in, fan_out) for name, (fan_in, fan_out) in zip(self.family.linears, attention + mlp)]

    def lora_parameters(self, rank: int, targets: List[str]) -> tuple[int, int]:
        """(parameters, tensors) of LoRA adapters of `rank` on the `targets` (names, or `all-linear`) of every
        block: r·(in + out) and two tensors (A, B) per adapted layer."""
        if rank <= 0:
            return 0, 0
        adapted = self.lora_layers(targets)
        return self.layers * sum(rank * (i + o) for _, i, o in adapted), self.layers * 2 * len(adapted)

    def lora_layers(self, targets: List[str]) -> List[tuple[str, int, int]]:
        """The (name, in, out) of each linear layer of a block that LoRA's `targets` (names, or `all-linear`) adapt."""
        return [(n, i, o) for n, i, o in self.block_linears()
                if LORA_TARGETS_ALL in targets or n in {t.rsplit(".", 1)[-1] for t in targets}]

    def lora_width(self, targets: List[str]) -> int:
        """The largest useful LoRA rank on `targets`: the fewest in or out features of an adapted layer (B·A of a
        higher rank adds parameters and memory, never a direction); 0 when nothing is adapted."""
        return min((min(i, o) for _, i, o in self.lora_layers(targets)), default=0)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def saved_per_token_layer(self, c: int) -> int:
        """Bytes one block keeps for backward per token, computing in `c`-byte floats (flash-style attention:
        no T x T matrix). RMSNorm (transformers' fp32 path) keeps its fp32 input and its normalized output;
        SDPA its q, k, v and output; SwiGLU gate, act, up and their product; a plain MLP two."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        norm = 2 * c * h if self.family.layer_norm else (4 + c) * h
        qk_norm = (4 + c) * (q + kv) if self.family.qk_norm else 0
        attention = c * (2 * q + 2 * kv)
        mlp = (4 if self.family.gated_mlp else 2) * c * i
        return 2 * norm + qk_norm + attention + mlp


def arch_file(hub_id: str) -> Path:
    """Where the architecture of a hub model ships (the first of ARCH_DIRS that exists)."""
    folder = next((d for d in ARCH_DIRS if d.is_dir()), ARCH_DIRS[-1])
    return folder / f"{hub_id}.json"


def _hub_cache_config(hub_id: str, revision: Optional[str]) -> Optional[Path]:
    """A hub model's config.json in the local Hugging Face cache, if it is there (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency of transformers
        return None
    found = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    return Path(found) if isinstance(found, str) else None


def architecture_of(name: str, agent, *, zoo_cache: Any = None) -> Architecture:
    """The architecture of agent `name` (an `AgentConfig`), offline: `agents/arch/<hub id>.json` for a hub
    id (else its config.json in the local HF cache), the config.json of a local directory, or of a zoo
    build (shipped, or built once into the cache). Raises UnknownArchitecture naming the file to add."""
    from hacrl_lightning.agents.sources import is_hub_id, looks_like_path

    key = f"agents.{name}.model"
    source = agent.model
    if is_hub_id(source):
        path = arch_file(source)
        path = path if path.is_file() else _hub_cache_config(source, agent.revision)
        if path is None:
            raise UnknownArchitecture(
                f"{key}={source!r}: its architecture is not known offline; add {arch_file(source)} holding the "
                f"numbers of its config.json (model_type, hidden_size, intermediate_size, num_hidden_layers, "
                f"num_attention_heads, num_key_value_heads, head_dim, vocab_size, tie_word_embeddings, "
                f"max_position_embeddings), or point {key} at a local copy of the model")
    else:
        if not looks_like_path(source):
            from hacrl_lightning.agents.sources import resolve_source  # zoo:<preset>: its build's directory

            source = resolve_source(name, source, key=key, zoo_cache=zoo_cache)
        path = Path(source).expanduser() / "config.json"
        if not path.is_file():
            raise UnknownArchitecture(f"{key}={agent.model!r}: {path} does not exist; point {key} at a model "
                                      f"directory holding config.json")
    return Architecture.from_config(json.loads(path.read_text()), source=str(path))


def run_architectures(cfg: TrainConfig) -> tuple[Dict[str, Architecture], List[Problem]]:
    """Every agent's architecture, offline, and a problem for each that is not known (the file to add)."""
    from hacrl_lightning.agents.sources import AgentLoadError

    architectures, problems = {}, []
    for name, agent in cfg.agents.items():
        try:
            architectures[name] = architecture_of(name, agent, zoo_cache=cfg.zoo_cache)
        except UnknownArchitecture as err:
            problems.append(Problem(f"agents.{name}.model", agent.model,
                                    "a model whose architecture is known offline (for the memory plan)", str(err)))
        except AgentLoadError:
            pass  # an unknown zoo preset: the preflight's agent checks name it
    return architectures, problems


__all__ = ["ARCH_DIRS", "Architecture", "FAMILIES", "Family", "UnknownArchitecture", "arch_file", "architecture_of",
           "run_architectures"]
