"""transformers `generate` backend: the default engine, on CPU or GPU, sharing the training module.

Prompts are left-padded and generated in chunks of at most `batch_size` sequences (bounded memory);
the `n` samples of a prompt come back grouped, prompts in order. Sampling is exactly the settings
given: the model's own `generation_config` is set aside for the call (so no hidden top_k=50,
repetition penalty or min_p from a hub file), and the sampled log-probs are read from the processed
scores, i.e. `log_softmax(logits / temperature)` as the trainer computes them. Because the engine
holds the training module itself, `sync_weights` has nothing to copy.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from transformers import GenerationConfig

from hacrl_lightning.rollout.engine import Generation, SamplingSettings


def _is_sharded(model: torch.nn.Module) -> bool:
    """True when parameters are DTensors (FSDP2 `fully_shard`): generate then needs synced_gpus."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


@contextlib.contextmanager
def _plain_generation(model: torch.nn.Module, seed: int | None) -> Iterator[None]:
    """Eval mode, the model's generation defaults set aside, and a seeded RNG that is restored after."""
    saved_config = getattr(model, "generation_config", None)
    was_training = model.training
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        model.generation_config = GenerationConfig()
        model.eval()
        try:
            yield
        finally:
            model.generation_config = saved_config
            model.train(was_training)


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
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


class HFEngine:
    """Generates with the agent's own (training) model via `model.generate`."""

    free_logprobs = False
    """Log-probs cost a [batch, vocab] score tensor per generated token here: reported only when asked."""

    def close(self) -> None:
        """Nothing to release: the engine is the trainer's own model."""

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_token_id: int,
                 batch_size: int = 64, synced_gpus: bool | None = None):
        if not eos_token_ids:
            raise ValueError("HFEngine needs the agent's EOS token id(s) to know where a response stops")
        self.model = model
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.batch_size = int(batch_size)
        self.synced_gpus = synced_gpus

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is not self.model:
            raise ValueError("HFEngine shares the training module; it cannot take another module's weights")

    def _config(self, sampling: SamplingSettings, n: int, stop_ids: list[int]) -> GenerationConfig:
        settings = dict(
            max_new_tokens=sampling.max_new_tokens, num_return_sequences=n, eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id, return_dict_in_generate=True, output_scores=sampling.return_logprobs,
        )
        if sampling.min_new_tokens:
            settings["min_new_tokens"] = sampling.min_new_tokens
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
        config = self._config(sampling, n, stop_ids)
        synced = _is_sharded(self.model) if self.synced_gpus is None else self.synced_gpus
        device = next(self.model.parameters()).device
        prompts_per_chunk = max(1, self.batch_size // n)
        stop_set = set(stop_ids)
        results: list[Generation] = []
        with _plain_generation(self.model, sampling.seed):
            for start in range(0, len(prompt_ids), prompts_per_chunk):
                chunk = prompt_ids[start : start + prompts_per_chunk]
                input_ids, attention_mask = _left_pad(chunk, self.pad_token_id, device)
                out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                          generation_config=config, synced_gpus=synced)
                new_tokens = out.sequences[:, input_ids.shape[1]:]                       # [c*n, L]
                if sampling.return_logprobs:
                    logprobs = self.model.compute_transition_scores(
                        out.sequences, out.scores, normalize_logits=True).float().tolist()  # [c*n, L]
                else:
                    logprobs = [[] for _ in range(new_tokens.shape[0])]
                new_tokens = new_tokens.tolist()
                results += [split_response(tokens, lps, stop_set, sampling.max_new_tokens)
                            for tokens, lps in zip(new_tokens, logprobs)]
        return results
