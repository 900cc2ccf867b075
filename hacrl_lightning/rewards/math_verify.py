"""Math reward: the last `\\boxed{...}` of a response, checked against the gold answer with math-verify.

`math_verify_reward(response, gold)` is 1.0 when the response's last boxed answer is mathematically
equal to the gold answer (`\\frac{1}{2}`, `0.5` and `1/2` agree; so do `5` and `5\\text{ cm}`),
else 0.0. Gold and answer are parsed alike, gold first: wrapped in `\\boxed{}` (a boxed gold keeps
its last box) and, only if that yields no mathematics, as a plain expression (`10\\%` -> 10).
A gold answer that does not parse to mathematics is *unscorable*: `gold_parses(gold)` says so,
the reward is 0.0, and callers exclude those items (they never count as correct). A response
without a complete `\\boxed{}`, or whose box holds no mathematics, scores 0.0.

Before math-verify sees a text (gold or answer), `guard_problem` refuses what would make sympy
run for seconds to hours: more than MAX_ANSWER_CHARS characters, brackets nested deeper than
MAX_NESTING, a power whose value would have more than MAX_POWER_DIGITS digits (`9^{9^{9^9}}`,
`2^2^2^2^2`, `123456789^{987654321}`, `((10^{100})^{100})^{100}`, estimated from the literals, no
arithmetic done), and a factorial of more than MAX_FACTORIAL (`1000000!`). A refused answer scores
0.0 in milliseconds; a refused gold is unscorable. The limits are far above any real MATH or GSM8K
answer (a few dozen characters, nesting 2-4, exponents in the hundreds).

math-verify's own timeouts use `signal.alarm`, which fails off the main thread; they are disabled
here. Deliberately not here: a hard time limit and crash isolation, which `RewardPool` (pool.py)
provides by running this function in worker processes that it kills when an item overruns; the
guards are heuristics that make the known hostile shapes cheap (a symbolic `(x+1)^{99999}` passes
them, and sympy hangs expanding it), the pool is the guarantee.
"""

from __future__ import annotations

import functools
import logging
import re

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy import Basic, MatrixBase

from hacrl_lightning.rewards.exact_match import extract_boxed

LATEX = (LatexExtractionConfig(boxed_match_priority=0),)
LATEX_OR_EXPR = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())

MAX_ANSWER_CHARS = 1_000
"""Longest text parsed. MATH answers are under ~100 characters; math-verify takes ~0.6 s on 1,000
characters of `1+1+...` and 10 s on 100,000."""
MAX_NESTING = 8
"""Deepest bracket nesting ((, [, { together) parsed. Real answers nest 2-4 (`\\left(\\frac{\\sqrt{3}}{2},
...\\right)` is 3); math-verify's time doubles about every two levels of braces (1 s at 8, 20 s at 16)."""
MAX_POWER_DIGITS = 100_000
"""Most decimal digits a power may have, estimated as exponent x digits of the base (`123456789^{10000}`,
80,000 digits, takes 0.3 s; `9^{9^9}`, 370 million digits, does not finish). Real answers: `2^{100}`."""
MAX_FACTORIAL = 10_000
"""Largest n whose `n!` is parsed (10000! takes 0.04 s; 1000000! 4.5 s). Real answers: `10!`, `\\frac{100!}{98!}`."""
INFINITY = float("inf")
_INTEGER = re.compile(r"\d+")
_CLOSERS = {")": "(", "]": "[", "}": "{"}


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def guard_problem(text: str) -> str | None:
    """Why `text` must not reach math-verify (too long, too deep, a huge power or factorial), or None.

    Linear in len(text) up to MAX_ANSWER_CHARS; only integer literals are read, nothing is evaluated.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return f"{len(text)} characters (more than MAX_ANSWER_CHARS={MAX_ANSWER_CHARS})"
    opened: list[int] = []
    match: dict[int, int] = {}  # both ends of every pair of one kind (`(x)`, `{x}`), each -> the other
    for i, char in enumerate(text):
        if char in "([{":
            opened.append(i)
            if len(opened) > MAX_NESTING:
                return f"brackets nested more than MAX_NESTING={MAX_NESTING} deep"
        elif char in _CLOSERS and opened:  # any closer ends the innermost bracket: intervals `[0,1)` nest too
            j = opened.pop()
            if text[j] == _CLOSERS[char]:
                match[i], match[j] = j, i
    return _Magnitudes(text, match).problem()


class _Magnitudes:
    """Digit estimates of the powers and factorials of a text whose bracket pairs (`match`) nest.

    Nesting pairs mean a power's base group never holds a power of its own exponent: no cycles."""

    def __init__(self, text: str, match: dict[int, int]):
        self.text, self.match = text, match
        self.carets = [i for i, char in enumerate(text) if char == "^"]
        self._memo: dict[int, float] = {}

    def problem(self) -> str | None:
        for i in reversed(self.carets):  # right to left: an exponent's powers are known before its power's
            if self.digits(i) > MAX_POWER_DIGITS:
                return f"a power of more than MAX_POWER_DIGITS={MAX_POWER_DIGITS} digits at character {i}"
        for i, char in enumerate(self.text):
            if char == "!" and (i == 0 or self.text[i - 1] != "\\"):  # `\!` is LaTeX spacing, not a factorial
                start, end = self._operand_before(i - 1 if self.text[i - 1:i] == "!" else i)  # n!! as n!
                if self._value(start, end) > MAX_FACTORIAL:
                    return f"a factorial of more than MAX_FACTORIAL={MAX_FACTORIAL} at character {i}"
        return None

    def digits(self, caret: int) -> float:
        """Digits of the power at `caret`: digits of its base x the largest value its exponent may have."""
        if caret not in self._memo:
            base = self._operand_before(caret)
            base_digits = max(1, self._literal_digits(*base), *(self.digits(j) for j in self._carets_in(*base)))
            start, end = self._operand_after(caret + 1)
            exponent = self._value(start, end)
            chained = self._skip_spaces(end + (self.text[start - 1:start] == "{"))
            if self.text[chained:chained + 1] == "^":  # `2^2^2`: read as 2^(2^2)
                exponent = max(exponent, 10.0 ** min(self.digits(chained), 300))
            self._memo[caret] = base_digits * exponent
        return self._memo[caret]

    def _value(self, start: int, end: int) -> float:
        """An upper bound of the value of text[start:end] (infinite with a factorial in it)."""
        if "!" in self.text[start:end]:
            return INFINITY
        inner = max((self.digits(j) for j in self._carets_in(start, end)), default=0)
        literals = [int(m) for m in _INTEGER.findall(self.text, start, end)] or [1]
        return max(float(max(literals)) if max(literals) < 10 ** 300 else INFINITY, 10.0 ** min(inner, 300))

    def _literal_digits(self, start: int, end: int) -> int:
        return max((len(m) for m in _INTEGER.findall(self.text, start, end)), default=0)

    def _carets_in(self, start: int, end: int) -> list[int]:
        return [j for j in self.carets if start <= j < end]

    def _skip_spaces(self, i: int) -> int:
        while i < len(self.text) and self.text[i] == " ":
            i += 1
        return i

    def _operand_after(self, i: int) -> tuple[int, int]:
        """(start, end) of what follows position i: a {group}'s inside, a digit run, a \\command or one character."""
        i = self._skip_spaces(i)
        if i < len(self.text) and self.text[i] == "{" and i in self.match:
            return i + 1, self.match[i]
        end = i + 1
        kind = str.isdigit if self.text[i:i + 1].isdigit() else str.isalpha if self.text[i:i + 1] == "\\" else None
        while kind is not None and end < len(self.text) and kind(self.text[end]):
            end += 1
        return i, min(end, len(self.text))

    def _operand_before(self, i: int) -> tuple[int, int]:
        """(start, end) of what precedes position i: a bracketed group's inside, a digit run or one character."""
        end = i
        while end > 0 and self.text[end - 1] == " ":
            end -= 1
        if end > 0 and self.text[end - 1] in _CLOSERS and end - 1 in self.match:
            return self.match[end - 1] + 1, end - 1
        start = end - 1 if end > 0 else 0
        while start > 0 and self.text[start - 1].isdigit() and self.text[end - 1].isdigit():
            start -= 1
        return start, end


def parse_answer(answer: str) -> tuple:
    """A bare answer (no `\\boxed`) parsed by math-verify, or () if it is not mathematics or is refused
    by `guard_problem`.

    Wrapped in `\\boxed{}` and parsed as LaTeX; only if that yields no mathematics parsed as a plain
    expression (`10\\%` -> 10, which math-verify's LaTeX grammar does not read).
    """
    if guard_problem(answer) is not None:
        return ()
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
