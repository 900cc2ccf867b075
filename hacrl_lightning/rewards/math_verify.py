"""Math reward: the last `\\boxed{...}` of a response, checked against the gold answer with math-verify.

`math_verify_reward(response, gold)` is 1.0 when the response's last boxed answer is mathematically
equal to the gold answer (`\\frac{1}{2}`, `0.5` and `1/2` agree; so do `5` and `5\\text{ cm}`),
else 0.0. Gold and answer are parsed alike, gold first: wrapped in `\\boxed{}` (a boxed gold keeps
its last box) and, only if that yields no mathematics, as a plain expression (`10\\%` -> 10).
A gold answer that does not parse to mathematics is *unscorable*: `gold_parses(gold)` says so,
the reward is 0.0, and callers exclude those items (they never count as correct). A response
without a complete `\\boxed{}`, or whose box holds no mathematics, scores 0.0.

math-verify's own timeouts use `signal.alarm`, which fails off the main thread; they are disabled
here. Deliberately not here: timeouts and crash isolation, which `RewardPool` (pool.py) provides by
running this function in worker processes that it kills when an item overruns.
"""

from __future__ import annotations

import functools
import logging

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy import Basic, MatrixBase

from hacrl_lightning.rewards.exact_match import extract_boxed

LATEX = (LatexExtractionConfig(boxed_match_priority=0),)
LATEX_OR_EXPR = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def parse_answer(answer: str) -> tuple:
    """A bare answer (no `\\boxed`) parsed by math-verify, or () if it is not mathematics.

    Wrapped in `\\boxed{}` and parsed as LaTeX; only if that yields no mathematics parsed as a plain
    expression (`10\\%` -> 10, which math-verify's LaTeX grammar does not read).
    """
    for text, config in ((f"\\boxed{{{answer}}}", LATEX), (answer, LATEX_OR_EXPR)):
        parsed = parse(text, extraction_config=config, fallback_mode="no_fallback", parsing_timeout=None)
        if any(isinstance(item, (Basic, MatrixBase)) for item in parsed):
            return tuple(parsed)
    return ()


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """The gold answer parsed (its last box if it has one), or () if it is unscorable.

    Cached: a prompt's gold is scored G*n times per step.
    """
    boxed = extract_boxed(gold)
    return parse_answer(gold if boxed is None else boxed)


def gold_parses(gold: str) -> bool:
    """True when `gold` parses to mathematics; items whose gold does not must be excluded, not scored."""
    return bool(parse_gold(gold))


def math_verify_reward(response: str, gold: str) -> float:
    """1.0 when the last boxed answer of `response` equals `gold` per math-verify (gold first), else 0.0."""
    gold_parsed = parse_gold(gold)
    answer = extract_boxed(response)
    if not gold_parsed or answer is None:
        return 0.0
    answer_parsed = parse_answer(answer)
    if not answer_parsed:
        return 0.0
    return float(verify(list(gold_parsed), list(answer_parsed), timeout_seconds=None))
