"""How a configuration problem is said: `Problem` (key, value, what is allowed, how to fix it) and
`ConfigError`, which carries every problem found at once; and how a run that stopped on a fault is said:
`RunFailed` (what failed, the setting to change, how to continue).

`Checks` collects Problems and words the common cases (a positive number, one of a list);
`suggest` adds "did you mean" to a message about an unknown name. Every check in the package
(`config`, `presets`, `preflight`, `cli`) reports through these, so all problems read alike.
Deliberately not here: any check itself, and any import from the package (every module may import this).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable, List

__all__ = ["UNKNOWN_KEY", "Checks", "ConfigError", "Problem", "RunFailed", "suggest"]


@dataclass(frozen=True)
class Problem:
    """One configuration problem: the key, the bad value, what is allowed, and how to fix it."""

    key: str
    value: Any
    allowed: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key}: got {self.value!r}; allowed: {self.allowed}; fix: {self.fix}"


class _UnknownKey:
    def __repr__(self) -> str:
        return "an unknown key"


UNKNOWN_KEY = _UnknownKey()
"""The `value` of a Problem about a key that the schema does not have."""


class ConfigError(ValueError):
    """Raised with every problem found, one per line."""

    def __init__(self, problems: List[Problem]):
        self.problems = list(problems)
        lines = [f"{len(self.problems)} configuration problem(s):"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class RunFailed(RuntimeError):
    """A run stopped on a fault that its message names in full: what failed, the setting or resource to
    change, and how to continue (the checkpoints already written are intact; `summary.json` says
    `failed`). Not a crash: scripts print the message without a traceback and exit with status 1."""


def suggest(name: str, valid: Iterable[str]) -> str:
    """`did you mean 'x'? ` plus the sorted valid names, for messages about unknown names."""
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}known: {valid}"


class Checks:
    """Collects Problems; the helpers word the common cases (a positive number, one of a list)."""

    def __init__(self) -> None:
        self.problems: List[Problem] = []

    def bad(self, key: str, value: Any, allowed: str, fix: str) -> None:
        self.problems.append(Problem(key, value, allowed, fix))

    def positive(self, key: str, value: Any, *, strict: bool = True) -> None:
        if value is None or (value <= 0 if strict else value < 0):
            word = "positive" if strict else "non-negative"
            self.bad(key, value, "> 0" if strict else ">= 0", f"set {key} to a {word} number")

    def choice(self, key: str, value: Any, options) -> None:
        if value not in options:
            self.bad(key, value, f"one of {list(options)}", f"set {key} to one of them")
