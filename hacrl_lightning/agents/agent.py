"""One agent: a causal LM, its own tokenizer and chat template, and the log-probs the losses need.

`Agent.load(name, cfg)` takes an `AgentConfig` whose `model` is a hub id, a local directory, or
`zoo:<preset>` (an offline tiny agent, built on first use by `hacrl_lightning.zoo`). Every form ends in the same
`from_pretrained(<dir>)` path, so the tiny agents exercise the code that loads real models. At load
time the agent refuses, before the weights load, a tokenizer with ids beyond the model's embedding
(another model's tokenizer), then a tokenizer that does not round-trip the task's texts (docs/spec.md §8);
a hub model that is neither cached nor reachable fails in seconds with the fix (a local directory).
`export` writes a directory that transformers v4 loads too (`tokenizers.save_tokenizer`).

An `Agent` is an `nn.Module` whose only submodule is the HF model, so a LightningModule can keep
agents in an `nn.ModuleDict`; the tokenizer is a plain attribute. Deliberately not here: sampling
(`hacrl_lightning.rollout` engines speak token ids), cross-agent retokenization (`exchange.py`),
optimizers and losses (the trainer and `algorithms/`).
"""

from __future__ import annotations

from contextlib import contextmanager

import inspect
import json
import os
import shutil
from pathlib import Path
from functools import lru_cache
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from hacrl_lightning.agents.lora import ADAPTER_DIR, is_lora, save_adapter, served_state_dict
from hacrl_lightning.agents.sources import AgentLoadError, fetch, resolve_source
from hacrl_lightning.agents.tokenizers import DEFAULT_CHECK_TEXTS, check_lossless, decode_text, embedding_mismatch, \
    encode_text, save_tokenizer, special_strings
from hacrl_lightning.config import AgentConfig

__all__ = ["AGENT_FILE", "Agent", "AgentLoadError", "LOGPROB_TOKENS", "encode_chat_prompts", "gather_logprobs",
           "head_logprobs", "render_chat_prompts", "token_logprobs"]

AGENT_FILE = "hacrl_agent.json"
"""Written by `export`: the agent's name and the settings a deployment needs beside the HF files."""
LOGPROB_TOKENS = 1024
"""Positions (of all rows of a pass together) whose logits `head_logprobs` makes at a time: with Qwen3's 151,936-token
vocabulary one chunk's fp32 logits are 0.62 GB, where a micro-batch of 16 rows of 1,024 tokens would hold 10 GB."""
COMPILE_BUCKET = 64
"""Under torch.compile a pass's rows are padded to a multiple of this many columns (`token_logprobs`), so the
compiled blocks see few distinct lengths and recompile a bounded number of times."""


# ---------------------------------------------------------------------------------------------------
# the agent


class Agent(nn.Module):
    """A causal LM with its tokenizer, chat template and length limits.

    Token ids that enter or leave an agent are always in *this* agent's vocabulary.
    """

    def __init__(self, name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: AgentConfig):
        super().__init__()
        self.name = name
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.compile_backend: str | None = None
        """torch.compile's backend for the log-prob passes (`compiling.compile_agent`), None: eager."""
        self._setup_tokens()

    # -- loading -------------------------------------------------------------------------------------

    @classmethod
    def load(cls, name: str, cfg: AgentConfig, *, zoo_cache: str | os.PathLike | None = None,
             check_texts: Sequence[str] = DEFAULT_CHECK_TEXTS, dtype: torch.dtype | None = None) -> "Agent":
        """Load agent `name` as `cfg` describes (hub id, local dir or `zoo:<preset>`).

        `dtype`: the dtype the weights are held in (default `cfg.dtype`, for inference); training
        passes float32, its master weights, and computes in `cfg.dtype` under mixed precision.

        `check_texts`: texts the tokenizer must round-trip (default: `DEFAULT_CHECK_TEXTS`, a sample of the
        synthetic task's prompts and answers; pass `()` to skip). Raises `AgentLoadError` (also for a tokenizer
        with ids beyond the model's embedding, before the weights load) or `LossyTokenizerError`, both
        naming the agent and the fix.
        """
        key = f"agents.{name}"
        model_source = resolve_source(name, cfg.model, key=f"{key}.model", zoo_cache=zoo_cache)
        tokenizer_source = model_source if cfg.tokenizer is None else \
            resolve_source(name, cfg.tokenizer, key=f"{key}.tokenizer", zoo_cache=zoo_cache)
        adapter_dir = _adapter_dir(model_source)
        if adapter_dir is not None:  # an exported adapter alone: its base loads, then the adapter merges into it
            from hacrl_lightning.agents.lora import read_adapter_config

            base = read_adapter_config(adapter_dir).get("base_model_name_or_path")  # one line for a malformed folder
            if not isinstance(base, str) or not base:
                raise AgentLoadError(f"agent {name!r}: {key}.model={cfg.model!r} is a LoRA adapter without its base "
                                     "model (adapter_config.json: base_model_name_or_path). Fix: give the merged "
                                     "export (the directory above it), or set base_model_name_or_path")
            model_source = resolve_source(name, base, key=f"{key}.model (the adapter's base)", zoo_cache=zoo_cache)
        common = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
        tokenizer_key = f"{key}.tokenizer" if cfg.tokenizer else f"{key}.model"
        tokenizer = fetch(AutoTokenizer.from_pretrained, tokenizer_source, agent=name, key=tokenizer_key, **common)
        config = fetch(AutoConfig.from_pretrained, model_source, agent=name, key=f"{key}.model", **common)
        mismatch = embedding_mismatch(tokenizer, model_vocab_size(config))
        if mismatch:
            raise AgentLoadError(f"agent {name!r}: {tokenizer_key}={cfg.tokenizer or cfg.model!r} does not fit the "
                                 f"model {cfg.model!r}: {mismatch}. Fix: {mismatch_fix(key, cfg)}")
        model = fetch(AutoModelForCausalLM.from_pretrained, model_source, agent=name, key=f"{key}.model",
                       dtype=dtype or getattr(torch, cfg.dtype), **common)
        if adapter_dir is not None:
            from hacrl_lightning.agents.lora import load_adapter_dir

            model = load_adapter_dir(model, adapter_dir)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if cfg.lora.rank > 0:  # the base frozen, an adapter on each target: only the adapter trains
            from hacrl_lightning.agents.lora import LoraTargetError, apply_lora

            if cfg.gradient_checkpointing:
                model.enable_input_require_grads()  # recomputed blocks need an input that asks for grad
            try:
                model = apply_lora(model, cfg.lora, key=f"{key}.lora")
            except LoraTargetError as err:
                raise AgentLoadError(f"agent {name!r}: {err}") from None
        agent = cls(name, model, tokenizer, cfg)
        check_lossless(agent.tokenizer, list(check_texts), agent=name)
        return agent

    def _setup_tokens(self) -> None:
        """Chat template override, EOS set, pad (defaults to EOS), left padding for generation."""
        tok, key = self.tokenizer, f"agents.{self.name}"
        if self.cfg.chat_template:
            tok.chat_template = self.cfg.chat_template
        if not tok.chat_template:
            raise AgentLoadError(
                f"agent {self.name!r}: the tokenizer of {self.cfg.model!r} has no chat template. "
                f"Fix: give one (a Jinja template over `messages`), e.g. "
                f"{key}.chat_template=\"{{% for m in messages %}}{{{{ m['content'] }}}}\\n{{% endfor %}}\""
            )
        if tok.eos_token_id is None:
            raise AgentLoadError(f"agent {self.name!r}: the tokenizer of {self.cfg.model!r} has no EOS token. "
                                 f"Fix: use a tokenizer with an eos_token ({key}.tokenizer)")
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        generation_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        extra = generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
        # eos_token_id: appended to finished partner responses; eos_token_ids: any of them ends a response
        self.eos_token_id = int(tok.eos_token_id)
        self.eos_token_ids = tuple(dict.fromkeys([self.eos_token_id, *(int(t) for t in extra if t is not None)]))
        self.pad_token_id = int(tok.pad_token_id)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.pad_token_id = self.pad_token_id

    # -- text <-> this agent's token ids -------------------------------------------------------------

    @property
    def max_prompt_len(self) -> int:
        return self.cfg.max_prompt_len

    @property
    def max_response_len(self) -> int:
        return self.cfg.max_response_len

    def render_prompts(self, texts: Sequence[str]) -> list[str]:
        """Each question in this agent's chat template (system prompt, template kwargs, generation prompt)."""
        return render_chat_prompts(self.tokenizer, self.cfg, texts)

    def encode_prompts(self, texts: Sequence[str], *, truncate: bool = True) -> list[list[int]]:
        """Chat-templated prompt ids (`encode_chat_prompts`: the template's control tokens are tokens, the
        question's text is text), left-truncated to `max_prompt_len`."""
        ids = encode_chat_prompts(self.tokenizer, self.cfg, texts)
        return [row[-self.max_prompt_len:] for row in ids] if truncate else ids

    def encode_response(self, texts: Sequence[str]) -> list[list[int]]:
        """Response texts -> ids, no special tokens added (no EOS: the caller decides); a special token
        spelled in the text (a partner writing `<|im_end|>`) stays text, never becomes the token."""
        return encode_text(self.tokenizer, texts, split_special_tokens=True)

    def decode_response(self, ids: Sequence[int]) -> str:
        """Response ids -> text: special tokens (EOS, pad) skipped, no space clean-up."""
        return decode_text(self.tokenizer, ids)

    # -- log-probs ------------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, keep: int = 0) -> torch.Tensor:
        """Logits `[B, T, V]`, or of the last `keep` positions only (`[B, keep, V]`; 0: all); positions count only
        attended tokens, so left and right padding agree."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)                   # [B, T]
        kwargs = {"logits_to_keep": keep} if keep and self._keeps_logits() else {}
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **kwargs).logits
        return logits[:, -keep:] if keep else logits

    def _keeps_logits(self) -> bool:
        """The model's forward takes transformers' `logits_to_keep` (the output layer on the last positions only);
        else the full logits are sliced."""
        base = self.model.get_base_model() if is_lora(self.model) else self.model
        return _takes_logits_to_keep(type(base))

    def _separate_head(self) -> bool:
        """`separate_head` of the model, asked once."""
        if not hasattr(self, "_head_apart"):
            self._head_apart = separate_head(self.model)
        return self._head_apart

    def token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                       temperature: float = 1.0, first_target: int = 1) -> torch.Tensor:
        """`[B, T]`: position t holds log p(x_t | x_<t) under softmax(logits / temperature), in fp32.

        0 where there is nothing to condition on (a row's first real token), on padding, and before column
        `first_target`: with the first response column there (`first_target_column`), the output layer and the
        softmax run on the response positions only, not on the prompts (the same numbers there; on SmolLM2 with
        two worked examples, a 166-token row of which 32 are response, 30 % of a forward and backward).
        The output layer runs `LOGPROB_TOKENS` positions at a time (`token_logprobs`, the module's function), so
        the logits of a micro-batch never exist at once. Gradients flow when grad is enabled.
        """
        if not self._separate_head():  # the model's logits, then the log-softmax (`LOGIT_TRANSFORMS`)
            width = input_ids.shape[1]
            first = max(1, min(first_target, width - 1))
            logits = self(input_ids, attention_mask, keep=width - first + 1 if first > 1 else 0)  # [B, T-first+1, V]
            logprobs = gather_logprobs(logits[:, :-1], input_ids[:, first:], temperature=temperature)  # [B, T-first]
            real = attention_mask[:, first - 1:-1].bool() & attention_mask[:, first:].bool()  # [B, T-first]
            return F.pad(logprobs * real, (first, 0))                                          # [B, T]
        return token_logprobs(self.model, input_ids, attention_mask, temperature=temperature,
                              first_target=first_target, compile_backend=self.compile_backend)

    # -- export ---------------------------------------------------------------------------------------

    def export(self, directory: str | os.PathLike, *, writes: bool | None = None, merged: bool = True) -> Path:
        """Write a standalone Hugging Face dir (weights in the agent's `dtype`, config, generation config,
        tokenizer, chat template) that `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
        load alone, in transformers v5 and v4. The tokenizer's `model_max_length` is the model's context
        (`context_length`); every file in `directory` is made readable by all (0644; transformers writes
        the weights through a private temporary file).

        The files are written into `<directory>.partial` and renamed to `directory` once all are there
        (a previous export in `directory` is replaced whole), so a process killed mid-export leaves only
        the `.partial` name, never a directory that looks complete; a stale `.partial` is removed by the
        next export. A `directory` that holds other files than a model's is refused (nothing is deleted).

        A LoRA agent's weights are written with its adapter merged (`merged=False`: its base's, for an engine that
        applies the adapter itself), and the adapter alone in `<directory>/adapter` (peft's files and the tokenizer).

        Under FSDP2 every rank of the agent's mesh must call it (the full state dict is gathered); the mesh's
        first rank writes. A model whole on several ranks: rank 0 writes, or the ranks told `writes=True`
        (`trainer.placement=split`: the first of the agent's group).
        """
        directory = Path(directory)
        state_dict, writer = _full_state_dict(self.model)
        if writes is not None and state_dict is None:
            writer = writes
        if not writer:
            return directory
        state_dict = state_dict if state_dict is not None else self.model.state_dict()
        lora = is_lora(self.model)
        served = served_state_dict(self.model, state_dict, merged=merged) if lora else state_dict  # adapters merged
        served = _in_dtype(served, getattr(torch, self.cfg.dtype))  # fp32 master weights, written in the agent's dtype
        final, directory = directory, _fresh_partial(directory)
        base = self.model.get_base_model() if lora else self.model
        generation = base.generation_config
        generation.eos_token_id = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_id
        generation.pad_token_id = self.pad_token_id
        base.config.pad_token_id = self.pad_token_id
        with writes_here(base):
            base.save_pretrained(str(directory), state_dict=served)
        if lora:  # the adapter alone beside the merged weights, with the tokenizer: evaluate.py takes either
            save_adapter(self.model, directory / ADAPTER_DIR, state_dict=state_dict, base=self.cfg.model)
            save_tokenizer(self.tokenizer, directory / ADAPTER_DIR, model_max_length=self.context_length)
        config_path = directory / "config.json"  # transformers writes the (fp32) training dtype
        config_json = json.loads(config_path.read_text())
        config_json["dtype"] = self.cfg.dtype
        config_path.write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
        save_tokenizer(self.tokenizer, directory, model_max_length=self.context_length)
        settings = {"name": self.name, "chat_template_kwargs": dict(self.cfg.chat_template_kwargs),
                    "system_prompt": self.cfg.system_prompt, "max_prompt_len": self.max_prompt_len,
                    "max_response_len": self.max_response_len}
        (directory / AGENT_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        if lora:
            (directory / ADAPTER_DIR / AGENT_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        for path in directory.rglob("*"):
            if path.is_file():
                path.chmod(0o644)
        _replace_dir(directory, final)
        return final

    @property
    def context_length(self) -> int:
        """The longest sequence the model takes: its config's `max_position_embeddings` (`n_positions`),
        else the agent's prompt + response limits."""
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return int(limit) if limit else self.max_prompt_len + self.max_response_len

    def extra_repr(self) -> str:
        return f"name={self.name!r}, model={self.cfg.model!r}, vocab={len(self.tokenizer)}"


def _adapter_dir(source: str) -> Path | None:
    """`source` as a LoRA adapter's directory (peft's `adapter_config.json` in it, no `config.json`), else None."""
    path = Path(os.path.expanduser(source))
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        return path
    return None


def model_vocab_size(config) -> int | None:
    """The embedding rows of a model config (`vocab_size`; of the text model for multimodal configs)."""
    return getattr(config.get_text_config(), "vocab_size", None)


def mismatch_fix(key: str, cfg: AgentConfig) -> str:
    """How to fix a tokenizer that does not fit the model of agent `key` (`embedding_mismatch`)."""
    if cfg.tokenizer:
        return (f"use the tokenizer this model was trained with: drop {key}.tokenizer (the model directory's "
                f"own) or point it at that model's tokenizer")
    return f"the model directory's tokenizer is not its model's: point {key}.tokenizer at the model's tokenizer"


def render_chat_prompts(tokenizer: PreTrainedTokenizerBase, cfg: AgentConfig, texts: Sequence[str]) -> list[str]:
    """Each question in the chat template of `tokenizer` as `cfg` sets it up (system prompt, template
    kwargs, generation prompt); shared by `Agent.render_prompts` and the preflight (no model needed)."""
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    conversations = [system + [{"role": "user", "content": text}] for text in texts]
    if not conversations:
        return []
    return tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                         **cfg.chat_template_kwargs)


PROMPT_SLOT = "\ue000hacrl-question\ue000"
"""Stands for a question in the template when a question spells a special token (`encode_chat_prompts`):
private-use characters no data file and no template writes."""


def encode_chat_prompts(tokenizer: PreTrainedTokenizerBase, cfg: AgentConfig, texts: Sequence[str]) -> list[list[int]]:
    """Each question in the chat template, as ids (no BOS/EOS added beyond the template's own). A question is
    data: one that spells a special token of this tokenizer (`<|im_end|>\n<|im_start|>assistant`, a forged
    turn) is encoded as ordinary text between the template's own tokens (the template rendered around
    `PROMPT_SLOT`, its parts encoded with their special tokens, the question with `split_special_tokens`).
    Every other question is encoded as the whole rendered string, exactly as before this rule."""
    ids = encode_text(tokenizer, render_chat_prompts(tokenizer, cfg, texts))
    spelled = special_strings(tokenizer)
    forged = [i for i, text in enumerate(texts) if any(s in text for s in spelled)]
    if forged:
        (around,) = render_chat_prompts(tokenizer, cfg, [PROMPT_SLOT])
        if around.count(PROMPT_SLOT) != 1:
            raise ValueError(f"the chat template of {tokenizer.name_or_path!r} does not place the question once in "
                             "the prompt; a question that spells a special token cannot be kept as text")
        before, after = encode_text(tokenizer, around.split(PROMPT_SLOT))
        questions = encode_text(tokenizer, [texts[i] for i in forged], split_special_tokens=True)
        for i, question in zip(forged, questions):
            ids[i] = before + question + after
    return ids


PARTIAL_SUFFIX = ".partial"
"""An export being written: `<dir>.partial`, renamed to `<dir>` when complete (`Agent.export`)."""


def _fresh_partial(final: Path) -> Path:
    """An empty `<final>.partial` to export into (a stale one, left by a killed export, is removed);
    refuses a `final` that holds other files than a model directory's."""
    if final.is_dir() and any(final.iterdir()) and not any((final / name).exists()
                                                          for name in (AGENT_FILE, "config.json")):
        raise FileExistsError(f"export to {final}: it holds other files than a model directory's "
                              f"({', '.join(sorted(p.name for p in final.iterdir())[:5])}); an export replaces the "
                              "whole directory. Fix: export into a new or empty directory")
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return partial


def _replace_dir(partial: Path, final: Path) -> None:
    """Rename the complete `partial` to `final`, replacing a previous `final` (moved aside, then removed)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(partial, final)
    shutil.rmtree(old, ignore_errors=True)


def _full_state_dict(model: nn.Module) -> tuple[dict | None, bool]:
    """(state dict to save, whether this process writes): None = the model's own, unless sharded."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return None, True
    import torch.distributed as dist

    if not any(isinstance(p, DTensor) for p in model.parameters()):  # whole on every rank: rank 0 writes, as
        # transformers' save_pretrained itself decides under torch.distributed
        return None, not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    ranks = next(p for p in model.parameters() if isinstance(p, DTensor)).device_mesh.mesh.flatten().tolist()
    if ranks == list(range(dist.get_world_size())):  # sharded over the world: torch's gather to rank 0
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state, dist.get_rank() == 0
    # sharded over a group of ranks (`trainer.placement=split`): gathered in the group one tensor at a time, kept
    # on the host. Every rank of the group enters the same gathers in the same order: tied weights are found by
    # the parameter object (`keep_vars`), the same on every rank, not by a local storage, which an empty shard
    # lacks (two empty shards would look tied on one rank only, and the ranks' gathers would part); tied names
    # stay one tensor
    state, whole = {}, {}
    with torch.no_grad():
        for key, value in model.state_dict(keep_vars=True).items():
            if isinstance(value, DTensor):
                if id(value) not in whole:
                    whole[id(value)] = value.full_tensor().detach().cpu()
                state[key] = whole[id(value)]
            else:
                state[key] = value.detach()
    return state, dist.get_rank() == ranks[0]


@contextmanager
def writes_here(model: nn.Module):
    """transformers (v5) writes a model only on global rank 0 once torch.distributed is up; this process was
    chosen to write it (the first rank of the agent's group under `trainer.placement=split`, or whichever rank
    holds a cache entry's build lock), so it writes."""
    if not hasattr(model, "should_save_on_this_rank"):
        yield
        return
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        yield
    finally:
        del model.should_save_on_this_rank


def _in_dtype(state_dict: dict, dtype: torch.dtype) -> dict:
    """Floating tensors cast to `dtype`; tensors that share storage (tied embeddings) stay shared."""
    cast: dict = {}
    out = {}
    for key, value in state_dict.items():
        if value.is_floating_point() and value.dtype != dtype:
            slot = (value.data_ptr(), value.shape, value.stride())
            if slot not in cast:
                cast[slot] = value.to(dtype)
            value = cast[slot]
        out[key] = value
    return out


def first_target_column(target_mask: torch.Tensor) -> int:
    """The first column where any row of `target_mask` (`[B, T]`, True: a token whose log-prob is used) is True:
    `Agent.token_logprobs`'s `first_target` (1 when none is)."""
    columns = torch.nonzero(target_mask.any(0)).flatten()
    return max(1, int(columns[0])) if len(columns) else 1


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                    rows_per_chunk: int = 8) -> torch.Tensor:
    """`[B, T]` log_softmax(logits / temperature)[targets] in fp32, a few rows at a time (bounded memory)."""
    out = []
    for start in range(0, logits.shape[0], rows_per_chunk):
        chunk = logits[start : start + rows_per_chunk].float() / temperature                 # [b, T, V]
        picked = chunk.gather(-1, targets[start : start + rows_per_chunk, :, None]).squeeze(-1)  # [b, T]
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(out) if out else logits.new_zeros(targets.shape, dtype=torch.float32)



LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of architectures whose forward changes the logits after the output layer (Gemma 2's soft cap,
Cohere's and Granite's scales): their log-probs take the full logits (`separate_head`)."""


def separate_head(model: nn.Module) -> bool:
    """The output layer of `model` (a transformers causal LM, or its peft wrapper) can run apart from its forward:
    the forward takes `logits_to_keep`, the decoder inside (`base_model`) returns the hidden states after the
    final norm, and nothing is done to the logits after the output layer (`LOGIT_TRANSFORMS`)."""
    lm = model.get_base_model() if is_lora(model) else model
    text = lm.config.get_text_config()
    return (_takes_logits_to_keep(type(lm)) and lm.get_output_embeddings() is not None
            and getattr(lm, "base_model", lm) is not lm and not any(getattr(text, k, None) for k in LOGIT_TRANSFORMS))


@lru_cache(maxsize=None)
def _takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   temperature: float = 1.0, first_target: int = 1, chunk: int = LOGPROB_TOKENS,
                   compile_backend: str | None = None) -> torch.Tensor:
    """`Agent.token_logprobs` of `model` (a causal LM for which `separate_head` holds), `[B, T]` fp32.

    One call of the model, whose output layer computes the last position only (`logits_to_keep=1`); two forward
    hooks, removed on return, take the decoder's hidden states after the final norm and, still inside the model's
    call (before FSDP2's own post-forward hook, so its backward hooks land on the result), replace the logits by
    `head_logprobs` of them. `compile_backend`: the rows are padded on the right to a multiple of
    `COMPILE_BUCKET` columns (attention mask 0: the real positions see the same tokens) and the chunks'
    log-softmax is compiled with that torch.compile backend; None: eager, no padding."""
    width = input_ids.shape[1]
    first = max(1, min(first_target, width - 1))
    if compile_backend is not None and width % COMPILE_BUCKET:
        extra = COMPILE_BUCKET - width % COMPILE_BUCKET
        input_ids, attention_mask = F.pad(input_ids, (0, extra)), F.pad(attention_mask, (0, extra))
    real = attention_mask[:, first - 1:-1].bool() & attention_mask[:, first:].bool()          # [B, T-first]
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)                       # [B, T]
    lm = model.get_base_model() if is_lora(model) else model
    found: dict = {}

    def keep_hidden(module, args, output):  # the decoder's last hidden states, after its final norm
        found["hidden"] = output[0]                                                          # [B, T, H]

    def head(module, args, output):
        hidden = found.pop("hidden")[:, first - 1:-1]                                        # [B, T-first, H]
        output["logits"] = head_logprobs(lm.get_output_embeddings(), hidden, input_ids[:, first:], real,
                                         temperature=temperature, chunk=chunk, compile_backend=compile_backend)
        return output

    hooks = [lm.base_model.register_forward_hook(keep_hidden), lm.register_forward_hook(head, prepend=True)]
    try:
        logprobs = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False, logits_to_keep=1).logits                          # [B, T-first]
    finally:
        for hook in hooks:
            hook.remove()
    return F.pad(logprobs, (first, 0))[:, :width]                                             # [B, T]


def head_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, real: torch.Tensor, *,
                  temperature: float = 1.0, chunk: int = LOGPROB_TOKENS,
                  compile_backend: str | None = None) -> torch.Tensor:
    """`[B, S]` log_softmax(head(hidden) / temperature)[targets] in fp32 at the positions `real`, 0 elsewhere:
    the output layer and the log-softmax run on the real positions only, `chunk` of them at a time (`chunk_logprobs`).
    With grad each chunk is a checkpoint: its logits are freed after its forward and made again in the backward,
    so one chunk's logits exist at a time (the price: the output layer's forward twice). hidden [B, S, H],
    targets and real [B, S]."""
    picked, picked_targets = hidden[real], targets[real]                                     # [N, H], [N]
    step = _compiled_chunk_logprobs(compile_backend) if compile_backend is not None else chunk_logprobs
    grad = torch.is_grad_enabled() and (picked.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, picked.shape[0], chunk):
        args = (head, picked[start:start + chunk], picked_targets[start:start + chunk], temperature)
        parts.append(checkpoint(step, *args, use_reentrant=False, preserve_rng_state=False) if grad else step(*args))
    values = torch.cat(parts) if parts else picked.sum(-1).float()                           # [N]
    return torch.zeros(real.shape, dtype=torch.float32, device=hidden.device).masked_scatter(real, values)


def chunk_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """`[n]` log_softmax(head(hidden) / temperature)[targets] in fp32 (`gather_logprobs`' arithmetic) for one chunk of
    positions: hidden [n, H], targets [n]."""
    logits = head(hidden).float() / temperature                                              # [n, V]
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@lru_cache(maxsize=None)
def _compiled_chunk_logprobs(backend: str):
    return torch.compile(chunk_logprobs, backend=backend)
