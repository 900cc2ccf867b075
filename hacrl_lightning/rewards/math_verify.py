"""Math reward: the boxed answer of a response, checked against the gold answer with math-verify.

`math_verify_reward(response, gold)` is 1.0 when the response's boxed answer is mathematically
equal to the gold answer (`\\frac{1}{2}`, `0.5` and `1/2` agree; so do `5` and `5\\text{ cm}`),
else 0.0. The boxed answer is read as math-verify reads it: the last complete `\\boxed{}` together
with the boxes just before it that math-verify chains to it (`\\boxed{1}, \\boxed{2}` is the set
{1, 2}), joined by math-verify's own `extract_boxed_content`. Gold and answer are parsed alike, gold
first (a gold with boxes is read as a response is; a bare gold as if boxed): math-verify's LaTeX
reader on the whole box, and, only if that yields no mathematics, on the whole box again without a
sentence-final period or a trailing percent sign (`42.` -> 42, `10\\%` -> 10, `2^{10}.` -> 1024).
Never a leading piece of a box: `\\boxed{2^{10}.}` is 1024, not 2 (math-verify's expression reader,
which takes a leading number, is not used). A gold answer that does not parse to mathematics is
*unscorable*: `gold_parses(gold)` says so, the reward is 0.0, and callers exclude those items (they
never count as correct). A response without a complete `\\boxed{}`, or whose box holds no
mathematics, scores 0.0. docs/rewards.md lists where this differs from plain math-verify and why.

Before math-verify sees a text (gold or answer), `guard_problem` refuses what would make sympy
run for seconds to hours: more than MAX_ANSWER_CHARS characters, grouping brackets nested deeper
than MAX_NESTING or any brackets deeper than MAX_ARGUMENT_NESTING, a power whose value would have
more than MAX_POWER_DIGITS digits (`9^{9^{9^9}}`, `123456789^{987654321}`,
`((10^{100})^{100})^{100}`, estimated from the literals, small inner exponents and factorials
evaluated exactly), a double superscript (`2^2^2^2^2`), and a factorial of more than MAX_FACTORIAL
or of a factorial (`1000000!`, `(3!)!`). A refused answer scores 0.0 in milliseconds; a refused gold is
unscorable. The limits sit past any real MATH or GSM8K answer (an 8x8 matrix of `\\dfrac`
entries, a depth-9 continued fraction, `2^{2^{6}}+1`, `2^{3!}` all pass).

math-verify's own timeouts use `signal.alarm`, which fails off the main thread; they are disabled
here. Deliberately not here: a hard time limit and crash isolation, which `RewardPool` (pool.py)
provides by running this function in worker processes that it kills when an item overruns; the
guards are heuristics that make the known hostile shapes cheap (a symbolic `(x+1)^{99999}` passes
them, and sympy hangs expanding it), the pool is the guarantee.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import re

from latex2sympy2_extended.math_normalization import extract_boxed_content
from math_verify import LatexExtractionConfig, parse, verify
from sympy import Basic, MatrixBase

from hacrl_lightning.rewards.exact_match import _matching_braces

BOX_ONLY = (LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False),)
"""math-verify's LaTeX reader on a box as a whole: without anchors it reads no `\\frac{1}{2}` or
`$..$` found inside a box it cannot parse (`\\boxed{\\frac{1}{2}\\pi.}` would be read as 1/2)."""
ANCHORED = (LatexExtractionConfig(),)
"""For a bare gold in math delimiters only, after the box readings: `$\\frac{1}{2}$` (golds copied from solutions)."""
_ANCHORS = ("$", "\\[", "\\(")

MAX_ANSWER_CHARS = 2_000
"""Longest text parsed. MATH answers are under ~100 characters, an 8x8 matrix of `\\dfrac` entries
1,000-1,100; math-verify takes ~0.6 s on 1,000 characters of `1+1+...` and 10 s on 100,000."""
MAX_NESTING = 8
"""Deepest nesting of grouping brackets: `(`, `[` and braces that open no command argument (`{{1}}`,
`\\{`). Real answers nest 2-4; math-verify reads bare braces as nested sets, its time growing steeply
with their depth (20 took over 40 s)."""
MAX_ARGUMENT_NESTING = 24
"""Deepest nesting of brackets of every kind, command arguments included (`\\frac{1}{1+\\frac{1}{..}}`,
`\\sqrt{2+\\sqrt{..}}`, `^{..}`). A depth-9 continued fraction or nested root nests 9-10; these cost
little per level, but math-verify reads garbage past ~50 levels (150 nested `\\frac` read as 1/2)."""
MAX_POWER_DIGITS = 100_000
"""Most decimal digits a power may have, estimated as exponent x log10 of the base (at least 1 for a
base that is not a number: `x^{100000}` is the limit), the exponent's value from its largest literal,
inner power or factorial (`123456789^{10000}`, 80,000 digits, takes 0.3 s; `9^{9^9}`, 370 million
digits, does not finish). Real answers: `2^{100}`, `2^{2^{6}}+1` (20 digits)."""
MAX_FACTORIAL = 10_000
"""Largest n whose `n!` is parsed (10000! takes 0.04 s; 1000000! 4.5 s). Real answers: `10!`, `\\frac{100!}{98!}`."""
MAX_BOXED_SPAN = 8_000
"""Longest stretch of chained boxes read (boxes each within BOXED_CHAIN_GAP characters of the next);
a longer one is box spam and scores 0.0. It bounds extract_boxed_content, whose scans are quadratic."""
BOXED_CHAIN_GAP = 70
"""math-verify chains a box to the next only across fewer characters than this (extract_boxed_content:
fewer than 10, or fewer than 70 with a separator); boxes farther apart are never joined."""
INFINITY = float("inf")
_BOX = re.compile(r"\\boxed *\{")  # as extract_boxed: spaces, then the brace
_INTEGER = re.compile(r"\d+")
_CLOSERS = {")": "(", "]": "[", "}": "{"}
_TRAILING_PERIOD = re.compile(r"\s*\.\s*$")
_TRAILING_PERCENT = re.compile(r"\s*\\?%\s*$")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def guard_problem(text: str) -> str | None:
    """Why `text` must not reach math-verify (too long, too deep, a huge power or factorial), or None.

    Linear in len(text) up to MAX_ANSWER_CHARS; literals are read and only small values computed.
    """
    if len(text) > MAX_ANSWER_CHARS:
        return f"{len(text)} characters (more than MAX_ANSWER_CHARS={MAX_ANSWER_CHARS})"
    opened: list[tuple[int, bool]] = []  # position, and whether it groups (True) or opens a command argument
    grouping = 0
    match: dict[int, int] = {}  # both ends of every pair of one kind (`(x)`, `{x}`), each -> the other
    for i, char in enumerate(text):
        if char in "([{":
            groups = char != "{" or not _opens_argument(text, i)
            opened.append((i, groups))
            grouping += groups
            if grouping > MAX_NESTING:
                return f"grouping brackets nested more than MAX_NESTING={MAX_NESTING} deep"
            if len(opened) > MAX_ARGUMENT_NESTING:
                return f"brackets nested more than MAX_ARGUMENT_NESTING={MAX_ARGUMENT_NESTING} deep"
        elif char in _CLOSERS and opened:  # any closer ends the innermost bracket: intervals `[0,1)` nest too
            j, groups = opened.pop()
            grouping -= groups
            if text[j] == _CLOSERS[char]:
                match[i], match[j] = j, i
    return _Magnitudes(text, match).problem()


def _opens_argument(text: str, i: int) -> bool:
    """True when the brace at i holds an argument: after `\\frac`, `}` (`\\frac{1}{2}`), `]` (`\\sqrt[3]{`), `^`, `_`."""
    j = i - 1
    while j >= 0 and text[j] == " ":
        j -= 1
    if j >= 0 and text[j] in "}]^_":
        return True
    k = j
    while k >= 0 and text[k].isalpha():
        k -= 1
    return 0 <= k < j and text[k] == "\\"


class _Magnitudes:
    """Size estimates (log10 of an upper bound) of the powers and factorials of a text whose bracket pairs
    (`match`) nest.

    Nesting pairs mean a power's base group never holds a power of its own exponent: no cycles."""

    def __init__(self, text: str, match: dict[int, int]):
        self.text, self.match = text, match
        self.carets = [i for i, char in enumerate(text) if char == "^"]
        self.bangs = [i for i, char in enumerate(text) if char == "!" and (i == 0 or text[i - 1] != "\\")]  # `\!` is spacing
        self._digits: dict[int, float] = {}
        self._logs: dict[tuple[int, int], float] = {}

    def problem(self) -> str | None:
        for i in reversed(self.carets):  # right to left: an exponent's powers are known before its power's
            start, end = self._operand_after(i + 1)
            after = self._skip_spaces(end + (self.text[start - 1:start] == "{"))
            if self.text[after:after + 1] == "^":
                return (f"a double superscript `a^b^c` at character {i}: LaTeX rejects it, and read as a tower "
                        f"no bound keeps it under MAX_POWER_DIGITS={MAX_POWER_DIGITS}")
            if self.digits(i) > MAX_POWER_DIGITS:
                return f"a power of more than MAX_POWER_DIGITS={MAX_POWER_DIGITS} digits at character {i}"
        for i in self.bangs:
            start, end = self._factorial_operand(i)
            if _within(self.bangs, start, end):  # `(3!)!` is 720, but one level more is not computable
                return f"a factorial of a factorial at character {i} (nested, they pass MAX_FACTORIAL={MAX_FACTORIAL} within a level or two)"
            if self.log_value(start, end) > math.log10(MAX_FACTORIAL):
                return f"a factorial of more than MAX_FACTORIAL={MAX_FACTORIAL} at character {i}"
        return None

    def digits(self, caret: int) -> float:
        """Digits of the power at `caret`: log10 of its base (at least 1 unless a number) x its exponent's bound."""
        if caret not in self._digits:
            start, end = self._operand_before(caret)
            base = self.text[start:end]
            weight = _log10(base) if base.isdigit() else max(1.0, self.log_value(start, end))
            exponent = self.log_value(*self._operand_after(caret + 1))
            self._digits[caret] = 0.0 if weight == 0 else weight * 10.0 ** min(exponent, 300.0)
        return self._digits[caret]

    def log_value(self, start: int, end: int) -> float:
        """log10 of an upper bound of |value| of text[start:end]: its largest literal, power or factorial."""
        if (start, end) not in self._logs:
            self._logs[start, end] = 0.0  # a factorial's operand may reach back past `start`: no cycles through it
            bounds = [_log10(m) for m in _INTEGER.findall(self.text, start, end)]
            bounds += [self.digits(j) for j in _within(self.carets, start, end)]
            bounds += [self._log_factorial(j) for j in _within(self.bangs, start, end)]
            self._logs[start, end] = max(bounds, default=0.0)
        return self._logs[start, end]

    def _log_factorial(self, bang: int) -> float:
        """log10 of n! for the n before `bang` (n!! bounded by n!), from Stirling's bound past small n."""
        n_log = self.log_value(*self._factorial_operand(bang))
        if n_log > 15:
            return INFINITY
        return math.lgamma(10.0 ** n_log + 1) / math.log(10)

    def _factorial_operand(self, bang: int) -> tuple[int, int]:
        return self._operand_before(bang - 1 if self.text[bang - 1:bang] == "!" else bang)  # n!! as n!

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


def _within(positions: list[int], start: int, end: int) -> list[int]:
    """The sorted `positions` in [start, end)."""
    return positions[bisect.bisect_left(positions, start):bisect.bisect_left(positions, end)]


def _log10(digits: str) -> float:
    """log10 of a run of decimal digits (0 for 0 and 1), exact enough for any length."""
    digits = digits.lstrip("0") or "0"
    return math.log10(max(1, int(digits[:17]))) + max(0, len(digits) - 17)


def boxed_answer(text: str) -> str | None:
    """The answer math-verify reads from the boxes of `text`, or None without a complete `\\boxed{}`.

    The last complete box and the boxes before it that math-verify chains to it, joined by its own
    `extract_boxed_content` (`\\boxed{1}, \\boxed{2}` -> `1,2`, a set; `\\boxed{4} ... much later ... \\boxed{5}`
    -> `5`). An unclosed last box is skipped for the previous one. Boxes chained over more than
    MAX_BOXED_SPAN characters read as the empty answer (no mathematics). Linear in len(text) up to that span.
    """
    closing = _matching_braces(text)
    boxes = [(m.start(), closing[m.end() - 1]) for m in _BOX.finditer(text) if m.end() - 1 in closing]
    if not boxes:
        return None
    start, end = boxes[-1]
    content = text.index("{", start) + 1
    if end - content > MAX_ANSWER_CHARS:  # whatever joins it, guard_problem refuses it: skip the quadratic join
        return text[content:end]
    for before_start, before_end in reversed(boxes[:-1]):  # every box math-verify might chain (it may stop sooner)
        if before_end >= start or start - before_end > BOXED_CHAIN_GAP:
            break
        start = before_start
        if end - start > MAX_BOXED_SPAN:
            return ""
    return extract_boxed_content(text[start:end + 1], mode="last")


def parse_answer(answer: str) -> tuple:
    """A bare answer (no `\\boxed`) parsed by math-verify's LaTeX reader, or () if it is not mathematics or
    is refused by `guard_problem`.

    Read whole, as `\\boxed{answer}`; only if that yields no mathematics, read whole again without a
    sentence-final period and a trailing percent sign (`42.` -> 42, `10\\%` -> 10, `2^{10}.` -> 1024,
    which math-verify's LaTeX grammar does not read).
    """
    if guard_problem(answer) is not None:
        return ()
    for text in dict.fromkeys((answer, _without_trailing_marks(answer))):
        parsed = parse(f"\\boxed{{{text}}}", extraction_config=BOX_ONLY, fallback_mode="no_fallback", parsing_timeout=None)
        if _is_mathematics(parsed):
            return tuple(parsed)
    return ()


def _without_trailing_marks(answer: str) -> str:
    """`answer` without one sentence-final period, then one percent sign (`10\\%.` -> `10`)."""
    return _TRAILING_PERCENT.sub("", _TRAILING_PERIOD.sub("", answer, count=1), count=1)


def _is_mathematics(parsed: list) -> bool:
    return any(isinstance(item, (Basic, MatrixBase)) for item in parsed)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> tuple:
    """The gold answer parsed (its boxes read as a response's are, if it has any), or () if it is unscorable.

    A bare gold in math delimiters that no box reading parses is read as math-verify reads LaTeX in text
    (`$\\frac{1}{2}$`, as copied from a solution); what it extracts but cannot parse (`$10\\%$` -> `10\\%`) is read as an answer.
    Cached: a prompt's gold is scored G*n times per step.
    """
    boxed = boxed_answer(gold)
    parsed = parse_answer(gold if boxed is None else boxed)
    if parsed or boxed is not None or not gold.lstrip().startswith(_ANCHORS) or guard_problem(gold) is not None:
        return parsed
    anchored = parse(gold, extraction_config=ANCHORED, fallback_mode="first_match", parsing_timeout=None)
    if _is_mathematics(anchored):
        return tuple(item for item in anchored if isinstance(item, (Basic, MatrixBase)))
    return parse_answer(anchored[0]) if anchored and anchored[0] != gold else ()


def gold_parses(gold: str) -> bool:
    """True when `gold` parses to mathematics; items whose gold does not must be excluded, not scored."""
    return bool(parse_gold(gold))


def math_verify_reward(response: str, gold: str) -> float:
    """1.0 when the boxed answer of `response` equals `gold` per math-verify (gold first), else 0.0."""
    gold_parsed = parse_gold(gold)
    answer = boxed_answer(response)
    if not gold_parsed or answer is None:
        return 0.0
    answer_parsed = parse_answer(answer)
    if not answer_parsed:
        return 0.0
    return float(verify(list(gold_parsed), list(answer_parsed), timeout_seconds=None))
