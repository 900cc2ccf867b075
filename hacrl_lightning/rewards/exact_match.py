"""Exact-match reward: the last `\\boxed{...}` of a response, compared as a string with the gold answer.

The verifiable reward of the synthetic task (and a cheap fallback for any task whose answers are
canonical strings). Deliberately not here: symbolic equivalence (`2/4` vs `1/2`; that is
math-verify's job) and any process pool or timeout (exact match is linear in the text).
"""

from __future__ import annotations

BOXED = "\\boxed"


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (nested braces kept), or None.

    `\\boxed {x}` (spaces before the brace) counts; an unclosed last box does not, and then the
    last complete one is used. Linear in len(text): every brace is matched in one pass, so hostile
    input (thousands of unclosed `\\boxed{`) costs no more than reading it.
    """
    closing = _matching_braces(text)
    start = text.rfind(BOXED)
    while start != -1:
        pos = start + len(BOXED)
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos in closing:
            return text[pos + 1 : closing[pos]]
        start = text.rfind(BOXED, 0, start)
    return None


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each `{` that is closed -> position of its `}` (one left-to-right pass with a stack)."""
    closing, stack = {}, []
    for pos, char in enumerate(text):
        if char == "{":
            stack.append(pos)
        elif char == "}" and stack:
            closing[stack.pop()] = pos
    return closing


def normalize(answer: str) -> str:
    """Whitespace removed: `\\boxed{ 4 2 }` answers `42`."""
    return "".join(answer.split())


def exact_match_reward(response: str, gold: str) -> float:
    """1.0 when the last boxed answer of `response` equals `gold` (whitespace ignored), else 0.0."""
    answer = extract_boxed(response)
    return float(answer is not None and normalize(answer) == normalize(gold))
