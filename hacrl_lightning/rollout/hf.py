"""transformers `generate` backend: the default engine, on CPU or GPU, sharing the training module.

Prompts are left-padded and generated in chunks of at most `batch_size` sequences (bounded memory);
the `n` samples of a prompt come back grouped, prompts in order. Sampling is exactly the settings
given: the model's own `generation_config` is set aside for the call (so no hidden top_k=50,
repetition penalty or min_p from a hub file), and the sampled log-probs are read from the processed
scores, i.e. `log_softmax(logits / temperature)` as the trainer computes them. Because the engine
holds the training module itself, `sync_weights` has nothing to copy.

`cache="static"` (`rollout.hf_cache`) generates with transformers' static KV cache, allocated at `max_len` (the
agent's `max_prompt_len + max_response_len`); each chunk's prompts are then padded to a power of two (repeats of
its last prompt, their answers dropped) and its columns to a multiple of `WIDTH_BUCKET` (left padding, masked), so
few shapes reach the decode step. `compile_decode` (`rollout.hf_compile`; `auto`: on CUDA) has transformers compile
that step (`generation_config.compile_config`: CUDA graphs on a GPU); the seconds and graphs torch compiles inside
`generate` add up in `compile_stats`. Greedy answers are the same tokens with either cache. Deliberately not here:
compiling the prefill (one eager forward per chunk) and the blocks compiled in place for training (they run eager).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from transformers import CompileConfig, GenerationConfig

from hacrl_lightning.rollout.engine import Generation, SamplingSettings

CACHES = ("dynamic", "static")
"""`HFEngine(cache=)`: transformers' dynamic KV cache (grows with the sequence) or its static one
(`rollout.hf_cache`)."""
WIDTH_BUCKET = 64
"""Static cache: a chunk's prompts are left-padded to a multiple of this many columns (within the cache)."""


def _is_sharded(model: torch.nn.Module) -> bool:
    """True when parameters are DTensors (FSDP2 `fully_shard`): generate then needs synced_gpus."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


@contextlib.contextmanager
def _uncompiled_blocks(model: torch.nn.Module) -> Iterator[None]:
    """Modules compiled in place (`nn.Module.compile`, as the trainer's compile of its blocks does) call their eager
    forward meanwhile."""
    held = [(m, m._compiled_call_impl) for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    for module, _ in held:
        module._compiled_call_impl = None
    try:
        yield
    finally:
        for module, compiled in held:
            module._compiled_call_impl = compiled


@contextlib.contextmanager
def _plain_generation(model: torch.nn.Module, seed: int | None, *, compiled: bool = False) -> Iterator[None]:
    """Eval mode, the model's generation defaults set aside, a seeded RNG that is restored after, and eager: blocks
    compiled in place for the log-prob passes (trainer.compile) run uncompiled. `compiled`: transformers'
    own compile of the decode step runs (the blocks stay eager inside it)."""
    saved_config = getattr(model, "generation_config", None)
    was_training = model.training
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    eager = _uncompiled_blocks(model) if compiled else torch.compiler.set_stance("force_eager")
    with torch.random.fork_rng(devices=devices, enabled=seed is not None), eager:
        if seed is not None:
            torch.manual_seed(seed)
        model.generation_config = GenerationConfig()
        model.eval()
        try:
            yield
        finally:
            model.generation_config = saved_config
            model.train(was_training)


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device, width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, width] ids and attention mask, each row right-aligned; `width` at least the longest row."""
    width = max(width, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def split_response(tokens: Sequence[int], logprobs: Sequence[float], stop_ids: set[int],
                   max_new_tokens: int) -> Generation:
    """Cut a generated row after its first stop token; without one it ran to the length limit."""
    for t, token in enumerate(tokens):
        if token in stop_ids:
            return Generation(list(tokens[: t + 1]), "stop", list(logprobs[: t + 1]))
    kept = list(tokens[:max_new_tokens])
    return Generation(kept, "length", list(logprobs[: len(kept)]))


def bucket(count: int, most: int) -> int:
    """The static cache's chunk size for `count` prompts: the next power of two, at most `most` (and `count`)."""
    return max(count, min(most, 1 << max(0, count - 1).bit_length()))


def padded_width(width: int, *, max_new_tokens: int, max_len: int) -> int:
    """The static cache's prompt columns: `width` rounded up to a multiple of `WIDTH_BUCKET`, but never past what
    `max_len` leaves after `max_new_tokens` (a longer prompt keeps its own width)."""
    rounded = -(-width // WIDTH_BUCKET) * WIDTH_BUCKET
    return max(width, min(rounded, max_len - max_new_tokens))


def decode_compiled(setting: str | bool, device: torch.device, *, sharded: bool = False) -> bool:
    """`rollout.hf_compile` decided for a model on `device`: `true`, `false`, or `auto` (on CUDA, where the model is
    not sharded: an FSDP2 model's compiled decode step is untried)."""
    value = str(setting).lower()
    return device.type == "cuda" and not sharded if value == "auto" else value == "true"


def compile_counters() -> dict[str, float]:
    """torch's process-wide compile counters (torch._dynamo's): the graphs captured and the seconds in dynamo's
    captures with their forward compiles (no backward here)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    return {"graphs": float(counters["stats"]["unique_graphs"]),
            "seconds": float(sum(compilation_time_metrics.get("_compile.compile_inner", ())))}


class HFEngine:
    """Generates with the agent's own (training) model via `model.generate`."""

    free_logprobs = False
    """Log-probs cost a [batch, vocab] score tensor per generated token here: reported only when asked."""

    def close(self) -> None:
        """Nothing to release: the engine is the trainer's own model."""

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_token_id: int,
                 batch_size: int = 64, synced_gpus: bool | None = None, cache: str = "dynamic",
                 compile_decode: str | bool = "auto", max_len: int = 0, compile_backend: str = "inductor"):
        """`cache`, `compile_decode`: `rollout.hf_cache`, `rollout.hf_compile`; `max_len`: the static cache's length
        (0: each call's longest prompt plus its new tokens); `compile_backend`: torch.compile's (`eager`: dynamo's
        capture alone, for tests)."""
        if not eos_token_ids:
            raise ValueError("HFEngine needs the agent's EOS token id(s) to know where a response stops")
        if cache not in CACHES:
            raise ValueError(f"rollout.hf_cache={cache!r} is unknown: allowed {list(CACHES)}")
        self.model = model
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.batch_size = int(batch_size)
        self.synced_gpus = synced_gpus
        self.cache = cache
        self.compile_decode = compile_decode
        self.max_len = int(max_len)
        self.compile_backend = compile_backend
        self.compile_stats = {"graphs": 0.0, "recompiles": 0.0, "seconds": 0.0}
        """What torch compiled inside this engine's `generate` calls so far: graphs, recompiles (the graphs of the
        calls after the first that compiled: a new shape or guard of the decode step) and seconds, to keep apart
        from the rollout's clock."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            raise ValueError("HFEngine shares the training module; it cannot take another module's weights")

    def _config(self, sampling: SamplingSettings, n: int, stop_ids: list[int], *, compiled: bool,
                max_len: int) -> GenerationConfig:
        settings = dict(
            max_new_tokens=sampling.max_new_tokens, num_return_sequences=n, eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id, return_dict_in_generate=True, output_scores=sampling.return_logprobs,
        )
        if sampling.min_new_tokens:
            settings["min_new_tokens"] = sampling.min_new_tokens
        if self.cache == "static":
            settings.update(cache_implementation="static", max_cache_len=max_len, disable_compile=not compiled)
            if compiled:
                cuda = next(self.model.parameters()).device.type == "cuda"
                compile_config = CompileConfig(backend=self.compile_backend,
                                               mode="reduce-overhead" if cuda else "default")  # CUDA graphs
                compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
                settings["compile_config"] = compile_config
        if sampling.greedy:
            return GenerationConfig(do_sample=False, **settings)
        return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k,
                                top_p=sampling.top_p, **settings)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        """`sampling.n` samples per prompt, grouped: result[p * n + i] is sample i of prompt p."""
        n = sampling.n
        if sampling.greedy and n > 1:
            raise ValueError(f"greedy decoding (temperature 0) gives one answer per prompt; got n={n}")
        stop_ids = list(dict.fromkeys((*self.eos_token_ids, *sampling.stop_token_ids)))
        synced = _is_sharded(self.model) if self.synced_gpus is None else self.synced_gpus
        device = next(self.model.parameters()).device
        static = self.cache == "static"
        compiled = static and decode_compiled(self.compile_decode, device, sharded=synced)
        longest = max((len(p) for p in prompt_ids), default=0)
        max_len = max(self.max_len, longest + sampling.max_new_tokens)
        config = self._config(sampling, n, stop_ids, compiled=compiled, max_len=max_len)
        prompts_per_chunk = max(1, self.batch_size // n)
        stop_set = set(stop_ids)
        results: list[Generation] = []
        before = compile_counters() if compiled else None
        with _plain_generation(self.model, sampling.seed, compiled=compiled):
            for start in range(0, len(prompt_ids), prompts_per_chunk):
                chunk = prompt_ids[start : start + prompts_per_chunk]
                rows, width = chunk, 0
                if static:  # few shapes: a power-of-two batch, whole buckets of columns
                    rows = chunk + [chunk[-1]] * (bucket(len(chunk), prompts_per_chunk) - len(chunk))
                    width = padded_width(max(map(len, chunk)), max_new_tokens=sampling.max_new_tokens,
                                         max_len=max_len)
                input_ids, attention_mask = _left_pad(rows, self.pad_token_id, device, width)
                out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                          generation_config=config, synced_gpus=synced)
                kept = len(chunk) * n                                                       # padding rows dropped
                new_tokens = out.sequences[:kept, input_ids.shape[1]:]                      # [c*n, L]
                if sampling.return_logprobs:
                    logprobs = self.model.compute_transition_scores(
                        out.sequences, out.scores, normalize_logits=True)[:kept].float().tolist()  # [c*n, L]
                else:
                    logprobs = [[] for _ in range(new_tokens.shape[0])]
                new_tokens = new_tokens.tolist()
                results += [split_response(tokens, lps, stop_set, sampling.max_new_tokens)
                            for tokens, lps in zip(new_tokens, logprobs)]
        if before is not None:
            after = compile_counters()
            graphs = after["graphs"] - before["graphs"]
            self.compile_stats["recompiles"] += graphs if self.compile_stats["graphs"] else 0.0
            self.compile_stats["graphs"] += graphs
            self.compile_stats["seconds"] += after["seconds"] - before["seconds"]
        return results
