"""Responses shared between agents: tokenizer-neutral `Rollout` records and each learner's token view.

Every agent answers every prompt (docs/spec.md §1); every learner trains on all of those answers. A
`Rollout` keeps a response as its source produced it: the text (decoded once by the source) and the
source's token ids. `view_for(learner, rollouts)` turns a list of rollouts into padded tensors in
the learner's token space, exactly as docs/spec.md §8 says:

- the prompt in the learner's chat template (generation prompt added), left-truncated;
- the learner's own responses in their original token ids;
- a partner's response re-encoded from its text with `add_special_tokens=False` and
  `split_special_tokens=True` (`Agent.encode_response`: a partner's text that spells one of the
  learner's special tokens, e.g. `<|im_end|>`, stays text and never becomes the learner's end token
  mid-response), plus the learner's EOS when the source finished (`stop`), never when it was cut
  (`length`);
- responses right-truncated to the learner's `max_response_len`; every truncation is marked, and so
  is a partner's text that the learner's tokenizer cannot give back exactly (`unrepresentable`: text
  that a Unicode-normalising tokenizer changes, as Qwen's NFC does); such a row is still trained on;
- `loss_mask` (True = a response token that is trained on) covers exactly the response tokens,
  an appended EOS included; rows are right-padded.

Deliberately not here: generation (engines), rewards, advantages and losses. Token ids never
cross agents: a view's ids belong to `view.agent` only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Protocol, Sequence

import torch

from hacrl_lightning.agents.agent import Agent
from hacrl_lightning.rollout.engine import FINISH_REASONS, FinishReason


@dataclass
class Rollout:
    """One response of one source agent to one prompt, tokenizer-neutral.

    `token_ids` are in the *source's* token space and include the terminal EOS when
    `finish_reason == "stop"`; `response` is their text (special tokens skipped, EOS removed).
    """

    prompt_id: str
    prompt: str
    source: str
    response: str
    token_ids: list[int]
    finish_reason: FinishReason
    reward: Optional[float] = None
    """Filled by the reward step."""
    reward_parts: Optional[dict] = None
    """Each term's value when the reward is a sum of several (`data.rewards`), by term name; else None."""
    engine_logprobs: Optional[list[float]] = None
    """The source engine's log-prob of each of `token_ids` as it sampled them (NaN where it reported none),
    or None when the engine was not asked for them; the trainer compares them with its own
    (`{agent}/rollout/logp_diff_*`) and may correct for the difference (`algorithm.rollout_is_cap`)."""

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Rollout.finish_reason={self.finish_reason!r}: allowed {list(FINISH_REASONS)}")

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"


class _GenerationLike(Protocol):
    token_ids: list[int]
    finish_reason: str


class _ExampleLike(Protocol):
    prompt_id: str
    prompt: str


def make_rollouts(source: Agent, examples: Sequence[_ExampleLike],
                  generations: Sequence[_GenerationLike]) -> list[Rollout]:
    """Rollouts of `source` from engine output grouped per prompt (`generations[p * n + i]`).

    Tokens after the first EOS are dropped; the text is decoded once, in one batched call, without
    the terminal EOS and without special tokens.
    """
    if not examples or len(generations) % len(examples):
        raise ValueError(f"{len(generations)} generations for {len(examples)} prompts: expected n per prompt, grouped")
    n = len(generations) // len(examples)
    eos = set(source.eos_token_ids)
    kept, bodies = [], []
    for generation in generations:
        ids = list(generation.token_ids)
        stop = next((t for t, token in enumerate(ids) if token in eos), None)
        if stop is not None:
            ids = ids[: stop + 1]
        kept.append(ids)
        bodies.append(ids[:-1] if ids and ids[-1] in eos else ids)
    texts = source.tokenizer.batch_decode(bodies, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    rollouts = []
    for k, (ids, text, generation) in enumerate(zip(kept, texts, generations)):
        example = examples[k // n]
        reported = getattr(generation, "logprobs", None)
        logprobs = list(reported[: len(ids)]) if reported else None
        rollouts.append(Rollout(example.prompt_id, example.prompt, source.name, text, ids, generation.finish_reason,
                                engine_logprobs=logprobs))
    return rollouts


@dataclass
class AgentView:
    """Rollouts as padded tensors in one agent's token space (`agent`); row b is `rollouts[b]`.

    Shapes: B rows, T tokens (prompt, then response, then right padding). `row_idx` is each row's
    place in the step's flat (prompt, source, sample) order, so every per-response table of the step
    ([P, n, G] rewards, advantages, old log-prob means) is read with `table.flatten()[view.row_idx]`.
    """

    agent: str
    """Whose vocabulary every id tensor here is in."""
    input_ids: torch.Tensor         # [B, T] long, padded with the agent's pad id
    attention_mask: torch.Tensor    # [B, T] long, 1 on prompt and response tokens
    loss_mask: torch.Tensor         # [B, T] bool, True on response tokens (incl. an appended EOS)
    is_own: torch.Tensor            # [B] bool, the response was generated by `agent`
    source_idx: torch.Tensor        # [B] long, index of the source in the `sources` given to view_for
    prompt_idx: torch.Tensor        # [B] long, index of the prompt (order of `prompt_ids` or of first appearance)
    row_idx: torch.Tensor           # [B] long, the row's index in the step's flat order (`rows` of view_for)
    prompt_truncated: torch.Tensor  # [B] bool, the prompt lost tokens on the left
    response_truncated: torch.Tensor  # [B] bool, the response lost tokens on the right (an EOS counts)
    unrepresentable: torch.Tensor   # [B] bool, a partner's text that the learner's tokenizer does not give back
    engine_logp: torch.Tensor       # [B, T] float, the engine's log-prob of each own response token as sampled
    #                                 (`Rollout.engine_logprobs`); NaN elsewhere and where none was reported

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, fn) -> "AgentView":
        return AgentView(self.agent, **{f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "agent"})

    def to(self, device: torch.device | str) -> "AgentView":
        return self._map(lambda t: t.to(device))

    def select(self, rows: torch.Tensor | Sequence[int], *, trim: bool = True) -> "AgentView":
        """The view of some rows (a mini- or micro-batch); `trim` drops columns that are padding in all of them."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        view = self._map(lambda t: t[rows])
        if trim and len(view):
            width = int(view.attention_mask.sum(-1).max())
            view = view._map(lambda t: t[:, :width] if t.dim() == 2 else t)
        return view


def view_for(learner: Agent, rollouts: Sequence[Rollout], *, sources: Sequence[str],
             prompt_ids: Sequence[str] | None = None, rows: Sequence[int] | None = None) -> AgentView:
    """The learner's token view of `rollouts` (docs/spec.md §8), one row per rollout, in order.

    A partner's response is re-encoded from `Rollout.response` (the text its source decoded in
    `make_rollouts`); the learner's own responses keep `Rollout.token_ids`. `sources`: agent
    names, in the order that `source_idx` indexes. `prompt_ids`: the order `prompt_idx` indexes
    (default: order of first appearance). `rows`: each rollout's index in the step's flat order
    (`row_idx`; default 0, 1, ...). Each distinct prompt is encoded once and all partner
    responses in one batched tokenizer call. Every row's prompt, a partner's as the learner's own, is the
    learner's chat template of the prompt text, left-truncated to `learner.max_prompt_len`: the prompts a
    run keeps fit it (`data/filters.py`), so the recipe's larger limit for partners' rows (1,536 tokens)
    would cut nothing less (docs/spec.md §11).
    """
    if rows is not None and len(rows) != len(rollouts):
        raise ValueError(f"view_for({learner.name!r}): {len(rows)} row indices for {len(rollouts)} rollouts")
    flat = list(range(len(rollouts))) if rows is None else list(rows)
    source_of = {name: j for j, name in enumerate(sources)}
    unknown = sorted({r.source for r in rollouts} - set(source_of))
    if unknown:
        raise ValueError(f"view_for({learner.name!r}): rollouts from {unknown} but sources={list(sources)}")
    prompt_of = {pid: p for p, pid in enumerate(prompt_ids)} if prompt_ids is not None else {}
    for r in rollouts:
        if r.prompt_id not in prompt_of:
            if prompt_ids is not None:
                raise ValueError(f"view_for({learner.name!r}): prompt {r.prompt_id!r} is not in prompt_ids")
            prompt_of[r.prompt_id] = len(prompt_of)

    texts = list(dict.fromkeys(r.prompt for r in rollouts))
    prompt_tokens = dict(zip(texts, learner.encode_prompts(texts, truncate=False)))
    partners = [i for i, r in enumerate(rollouts) if r.source != learner.name]
    encoded = dict(zip(partners, learner.encode_response([rollouts[i].response for i in partners])))
    decoded = learner.tokenizer.batch_decode([encoded[i] for i in partners], skip_special_tokens=True,
                                             clean_up_tokenization_spaces=False) if partners else []
    unrepresentable = {i for i, text in zip(partners, decoded) if text != rollouts[i].response}

    rows = []
    for i, r in enumerate(rollouts):
        full_prompt = prompt_tokens[r.prompt]
        prompt = full_prompt[-learner.max_prompt_len:]
        if i in encoded:
            response = encoded[i] + ([learner.eos_token_id] if r.finished else [])
        else:
            response = list(r.token_ids)
        kept = response[: learner.max_response_len]
        rows.append((prompt, kept, len(full_prompt) > len(prompt), len(response) > len(kept)))
    return _pad(learner, rollouts, rows, source_of, prompt_of, unrepresentable, flat)


def _pad(learner: Agent, rollouts: Sequence[Rollout], rows, source_of, prompt_of, unrepresentable,
         flat: Sequence[int]) -> AgentView:
    """Right-pad the (prompt, response) rows into an `AgentView`."""
    width = max((len(p) + len(r) for p, r, *_ in rows), default=0)
    ids, attention, loss = [], [], []
    for prompt, response, *_ in rows:
        n, m = len(prompt), len(response)
        pad = width - n - m
        ids.append(prompt + response + [learner.pad_token_id] * pad)
        attention.append([1] * (n + m) + [0] * pad)
        loss.append([False] * n + [True] * m + [False] * pad)

    def column(values, dtype):
        return torch.tensor(list(values), dtype=dtype)

    engine_logp = torch.full((len(rows), width), float("nan"))                              # [B, T]
    for b, (r, (prompt, response, *_)) in enumerate(zip(rollouts, rows)):
        if r.source == learner.name and r.engine_logprobs:
            reported = r.engine_logprobs[: len(response)]
            engine_logp[b, len(prompt) : len(prompt) + len(reported)] = torch.tensor(reported, dtype=torch.float32)

    return AgentView(
        agent=learner.name,
        input_ids=column(ids, torch.long).reshape(len(rows), width),
        attention_mask=column(attention, torch.long).reshape(len(rows), width),
        loss_mask=column(loss, torch.bool).reshape(len(rows), width),
        is_own=column((r.source == learner.name for r in rollouts), torch.bool),
        source_idx=column((source_of[r.source] for r in rollouts), torch.long),
        prompt_idx=column((prompt_of[r.prompt_id] for r in rollouts), torch.long),
        row_idx=column(flat, torch.long),
        prompt_truncated=column((row[2] for row in rows), torch.bool),
        response_truncated=column((row[3] for row in rows), torch.bool),
        unrepresentable=column((i in unrepresentable for i in range(len(rows))), torch.bool),
        engine_logp=engine_logp,
    )
