"""`bench.py exchange`: how partners' responses cross between two agents' tokenizers (docs/spec.md §8).

    python scripts/bench.py exchange [--agents tiny_qwen3,tiny_llama32] [--synthetic 500] [--stress 200]
                                     [--json exchange.json]

Texts (each sent once as a finished response, `stop`, and once cut, `length`):
- `fixtures`: every problem, solution and answer text in `tests/fixtures/math/*.jsonl` (MATH-style
  LaTeX; a verl prompt's message contents);
- `synthetic`: answers to the synthetic task's held-out problems in several styles a model writes
  (bare `\\boxed{}`, one-line working, steps, unicode `×`/`−`, a Chinese sentence, an emoji);
- `stress`: seeded random joins of LaTeX, unicode, CJK, emoji, whitespace runs, special-token
  spellings of both sides and non-NFC text, to show what gets marked and why.

For each source -> learner direction a text is encoded by the source as a model would emit it
(special-token spellings as ordinary tokens), made a `Rollout` by `make_rollouts`, and viewed by the
learner with `view_for`, at the learner's own `max_response_len` and unlimited. A row is `exact`
(the learner's response tokens decode to the source's text, EOS aside), or marked
`unrepresentable` (why: the learner's special-token spelling, or Unicode normalisation) and/or
`response_truncated`. Also reported: mean response tokens on each side and exchange rows/s.
Deliberately not here: asserting anything (tests/test_real_tokenizers.py does).
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import time
from pathlib import Path

from hacrl_lightning.bench.report import print_table

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "math"
TEXT_COLUMNS = ("problem", "question", "solution", "answer", "final_answer")
STRESS_PIECES = [
    "\\frac{1}{2}", "$x^2 + 1 = 0$", "\\boxed{42}", "\\sqrt{50}", "a \\le b", "π", "≤", "×", "²", "°", "√2",
    "中文", "数学答案是", "。", "😀", "👍🏽", "👨\u200d👩\u200d👧", " ", "  ", "    ", "\n", "\n\n", "\t",
    "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "</think>", "<|eot_id|>", "<|begin_of_text|>",
    "<|start_header_id|>", "e\u0301", "\u212b", "word", " the answer", "12345",
]


def add_arguments(parser) -> None:
    parser.add_argument("--agents", default="tiny_qwen3,tiny_llama32", help="two agents (both directions are measured)")
    parser.add_argument("--synthetic", type=int, default=500, help="held-out synthetic problems (x 6 answer styles)")
    parser.add_argument("--stress", type=int, default=200, help="random stress texts")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")


def fixture_texts() -> list[str]:
    """Every text of a known column (and verl message contents) in the math fixtures, once each."""
    texts = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # the malformed-file fixtures
            values = [row.get(c) for c in TEXT_COLUMNS] + [m.get("content") for m in row.get("prompt") or []
                                                           if isinstance(m, dict)]
            for value in values:
                texts += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v]
    return list(dict.fromkeys(texts))


def synthetic_answers(n: int) -> list[str]:
    """Six answer styles for each of the first `n` held-out synthetic problems."""
    from hacrl_lightning.config import DataConfig
    from hacrl_lightning.data.synthetic import synthetic_examples

    answers = []
    for ex in synthetic_examples(DataConfig(), "eval", n):
        match = re.search(r"What is (.+?)\?", ex.prompt)
        expr, g = (match.group(1) if match else "it"), ex.gold
        answers += [
            f"\\boxed{{{g}}}",
            f"{expr} = {g}, so the answer is \\boxed{{{g}}}.",
            f"Step 1: compute {expr}.\nStep 2: {expr} = {g}.\n\nFinal answer: $\\boxed{{{g}}}$",
            f"{expr.replace('-', '−').replace('*', '×')} = {g}  ⇒  \\boxed{{{g}}}",
            f"计算 {expr} = {g}。答案是 \\boxed{{{g}}}。",
            f"**Answer:** $\\boxed{{{g}}}$ ✅",
        ]
    return answers


def stress_texts(n: int) -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice(STRESS_PIECES) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def why_unrepresentable(learner, text: str) -> str:
    """The cause of an unrepresentable row: `normalisation`, `special spelling` (no longer expected: a
    spelled special token stays text, `Agent.encode_response`), or `other`."""
    normalizer = learner.tokenizer.backend_tokenizer.normalizer
    if normalizer is not None and normalizer.normalize_str(text) != text:
        return "normalisation"
    specials = [t.content for t in learner.tokenizer.added_tokens_decoder.values() if t.special]
    if any(t in text for t in specials):
        return "special spelling"
    return "other"


def measure(source, learner, texts: list[str]) -> list[dict]:
    """Rows exact / marked (and why) when `source`'s responses `texts` reach `learner`."""
    from dataclasses import replace

    from hacrl_lightning.agents import Agent
    from hacrl_lightning.exchange import make_rollouts, view_for
    from hacrl_lightning.data.records import Example
    from hacrl_lightning.rollout.engine import Generation

    example = Example("bench", "What is 37 + 5? Put the answer in \\boxed{}.", "42")
    encoded = source.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    gens = []
    for ids in encoded:
        ids = [t for t in ids if t not in source.eos_token_ids]
        gens += [Generation(ids + [source.eos_token_id], "stop", []), Generation(ids, "length", [])]
    rollouts = make_rollouts(source, [example], gens)
    rows = []
    for limit in (learner.max_response_len, 10**9):
        seen = Agent(learner.name, learner.model, learner.tokenizer, replace(learner.cfg, max_response_len=limit))
        start = time.perf_counter()
        view = view_for(seen, rollouts, sources=[source.name, learner.name])
        seconds = time.perf_counter() - start
        unrepresentable = view.unrepresentable.tolist()
        truncated = view.response_truncated.tolist()
        causes = [why_unrepresentable(learner, r.response) for r, u in zip(rollouts, unrepresentable) if u]
        rows.append({
            "direction": f"{source.name} -> {learner.name}",
            "max_response_len": limit if limit < 10**9 else "unlimited",
            "rows": len(rollouts),
            "exact": sum(not u and not t for u, t in zip(unrepresentable, truncated)),
            "unrepresentable": sum(unrepresentable),
            "truncated": sum(truncated),
            "why": {cause: causes.count(cause) for cause in sorted(set(causes))},
            "source_tokens_mean": sum(len(ids) for ids in encoded) / len(encoded),
            "learner_tokens_mean": sum(len(ids) for ids in seen.encode_response([r.response for r in rollouts[::2]]))
            / len(encoded),
            "source_text_changed": sum(r.response != t for r, t in zip(rollouts[::2], texts)),
            "rows_per_s": len(rollouts) / seconds,
        })
    return rows


def run(args) -> dict:
    from hacrl_lightning.cli import compose_config

    from hacrl_lightning.agents import Agent

    names = args.agents.split(",")
    if len(names) != 2:
        raise SystemExit(f"--agents takes two agents, got {names}")
    cfg, _ = compose_config([f"agents=[{args.agents}]"])
    agents = [Agent.load(key, agent_cfg, zoo_cache=cfg.zoo_cache) for key, agent_cfg in cfg.agents.items()]
    sets = {"fixtures": fixture_texts(), "synthetic": synthetic_answers(args.synthetic),
            "stress": stress_texts(args.stress)}
    rows = []
    for set_name, texts in sets.items():
        for source, learner in (agents, agents[::-1]):
            rows += [{"texts": set_name, **row} for row in measure(source, learner, texts)]
    import torch

    return {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                       f"load {os.getloadavg()[0]:.1f}, torch {torch.__version__}",
            "sizes": {name: len(texts) for name, texts in sets.items()}, "exchange": rows}


COLUMNS = ["texts", "direction", "max_response_len", "rows", "exact", "unrepresentable", "truncated", "why",
           "source_text_changed", "source_tokens_mean", "learner_tokens_mean", "rows_per_s"]


def table_rows(result: dict) -> list[dict]:
    """The result's rows with `why` flattened to text, for `report.print_table(rows, COLUMNS)`."""
    return [{**row, "why": ", ".join(f"{k} {v}" for k, v in row["why"].items()) or "-"} for row in result["exchange"]]


def print_report(result: dict) -> None:
    print(f"machine: {result['machine']} | texts: {result['sizes']} (each sent as `stop` and as `length`)")
    print_table(table_rows(result), COLUMNS)
