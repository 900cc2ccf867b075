"""Rewards of your own: a registered name, `module:function` or `path/to/file.py:function`, alone or as a
weighted sum (`data.reward`, `data.rewards`; docs/data.md, "A task of your own").

`Reward` is what scores a response: one or more terms (name, spec, weight), each a function
`fn(response, gold, ...)` that may also ask for the example's extra fields (its data file's other columns)
by parameter name, all of them as `extras`, or with `**fields`. It returns `Scored`: the weighted total,
each term's value, and each term that failed (raised, or returned a value that is not a finite number in
`RANGE`), which scores 0 and is named. It pickles as its specs and loads the functions in each process, so
the reward pool's workers run it with the same timeouts and crash isolation as math-verify. Deliberately
not here: the pool (pool.py), the registered rewards (exact_match.py, math_verify.py), and the rule that a
reward running code is named on the command line (`cli.code_reward_problems`).

A reward's code may raise anything, `SystemExit`, `KeyboardInterrupt` and `GeneratorExit` included: that is its
failure (a term that scores 0 and is named; a file that cannot be loaded), never the end of the run. Only a
signal that really arrived while it ran (a Ctrl-C, a SIGTERM) goes on as the user's: `watch_signals` counts
them, `raised_by_code` tells the two apart.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

from hacrl_lightning.errors import suggest
from hacrl_lightning.rewards.registry import get_reward

RANGE = (-1.0, 1.0)
"""Every term's value must be a finite number in this range (the registered rewards give 0 or 1)."""


class RewardError(ValueError):
    """A reward spec that cannot be loaded: the message names the spec, what was looked for, where, and the fix."""


class Scored(NamedTuple):
    """One response's reward: the weighted total, each term's value (0 where it failed) and the failed terms
    as (name, cause)."""

    total: float
    parts: tuple[float, ...]
    failures: tuple[tuple[str, str], ...]


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals a run handles (callbacks/interrupt.py): one of them arriving while a reward runs is the user's."""


class _Signals:
    seen = 0
    """Signals that arrived while `watch_signals` was on."""
    watching = 0
    in_worker = False
    """True in a reward worker process: no signal reaches its Python code (pool.py), so whatever it raises is
    the reward's."""


def signals_seen() -> int:
    """A count to take before running a reward's code and hand to `raised_by_code` after it."""
    return _Signals.seen


@contextmanager
def watch_signals() -> Iterator[None]:
    """While rewards run in this process: count every SIGINT/SIGTERM/SIGHUP that arrives (each handler set
    is still called, first), so that a `KeyboardInterrupt` a reward raises itself is told from a real Ctrl-C.
    Main thread only (elsewhere no signal handler runs and nothing is needed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wrapped = {}
    for signum in SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler):
            def counting(number, frame, handler=handler):
                _Signals.seen += 1
                return handler(number, frame)

            wrapped[signum] = (handler, counting)
            signal.signal(signum, counting)
    _Signals.watching += 1
    try:
        yield
    finally:
        _Signals.watching -= 1
        for signum, (handler, counting) in wrapped.items():
            if signal.getsignal(signum) is counting:  # a handler set meanwhile stays
                signal.signal(signum, handler)


def raised_by_code(error: BaseException, seen_before: int) -> bool:
    """Whether `error`, raised while a reward's code ran, is the code's own failure (True) or a signal's, to
    be raised on (False): an `Exception` always is the code's; any other (`SystemExit`, `KeyboardInterrupt`,
    `GeneratorExit`, a run's own interrupt) is the code's in a worker and, in this process, when no signal
    arrived meanwhile (under `watch_signals`; unwatched, only `SystemExit` and `GeneratorExit`, which no
    signal raises)."""
    if isinstance(error, Exception) or _Signals.in_worker:
        return True
    if _Signals.watching:
        return _Signals.seen == seen_before
    return isinstance(error, (SystemExit, GeneratorExit))


def is_code(spec: str) -> bool:
    """True for `module:function` and `path.py:function` (code of the user's), False for a registered name."""
    return ":" in str(spec)


def load_function(spec: str, *, key: str = "data.reward") -> Callable[..., Any]:
    """The function a code spec names; RewardError says what was looked for where when it is not there."""
    target, _, name = str(spec).rpartition(":")
    if not target or not name:
        raise RewardError(f"{key}={spec!r}: write module:function or path/to/file.py:function")
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise RewardError(f"{key}={spec!r}: no file {path} (a relative path is taken from {Path.cwd()}); "
                              "fix: give the path of the .py file that defines the function")
        module = _module_from_file(path, key, spec)
        where = str(path)
    else:
        before = signals_seen()
        with watch_signals():  # the signal count is read inside: a real Ctrl-C is told from the module's own
            try:
                module = importlib.import_module(target)
            except ImportError as err:
                raise RewardError(f"{key}={spec!r}: no module {target!r} can be imported ({err}); fix: install it, "
                                  "or give the file instead: path/to/file.py:function") from None
            except BaseException as err:
                if not raised_by_code(err, before):
                    raise
                raise RewardError(_import_failed(key, spec, f"module {target}", err)) from None
        if module.__name__ == "__main__":
            raise RewardError(f"{key}={spec!r}: a function of the script that is running cannot be imported by the "
                              "reward workers; fix: put it in a file and give path/to/file.py:function")
        where = f"module {target}"
    fn = getattr(module, name, None)
    if not callable(fn):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise RewardError(f"{key}={spec!r}: {where} has no function {name!r}; {suggest(name, names)}")
    return fn


def _module_from_file(path: Path, key: str, spec: str):
    """The module of a .py file, loaded once per process under a name of its own (not a package's)."""
    module_name = "hacrl_user_reward_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    before = signals_seen()
    with watch_signals():
        try:
            loader_spec.loader.exec_module(module)
        except BaseException as err:
            del sys.modules[module_name]
            if not raised_by_code(err, before):  # a real Ctrl-C while it imported
                raise
            raise RewardError(_import_failed(key, spec, str(path), err)) from None
    return module


def _import_failed(key: str, spec: str, where: str, err: BaseException) -> str:
    if isinstance(err, Exception):
        return f"{key}={spec!r}: importing {where} raised {type(err).__name__}: {err}; fix the file"
    return (f"{key}={spec!r}: importing {where} raised {err!r} (the file's own code, not a Ctrl-C or an exit "
            "of this run); a reward file defines functions and must not stop the process when imported; fix the "
            "file")


def _caller(fn: Callable[..., Any]) -> Callable[[str, str, Mapping[str, Any]], Any]:
    """`fn` called as (response, gold) plus what its signature asks of the example's extra fields: `extras`
    (all of them), a field by name, or `**fields`."""
    try:
        every = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        every = []
    params, first_two = every[2:], {p.name for p in every[:2]}
    if not params:
        return lambda response, gold, extras: fn(response, gold)

    def call(response: str, gold: str, extras: Mapping[str, Any]) -> Any:
        kwargs: dict[str, Any] = {}
        for param in params:
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                kwargs.update({k: v for k, v in extras.items() if k not in kwargs and k not in first_two})
            elif param.name == "extras":
                kwargs["extras"] = dict(extras)
            elif param.name in extras:
                kwargs[param.name] = extras[param.name]
            elif param.default is inspect.Parameter.empty and param.kind is not inspect.Parameter.VAR_POSITIONAL:
                raise KeyError(f"the example has no field {param.name!r} (its fields: {sorted(extras)})")
        return fn(response, gold, **kwargs)

    return call


class Reward:
    """terms: (name, spec, weight) each; a spec is a registered reward's name or code (`is_code`)."""

    def __init__(self, terms: Sequence[tuple[str, str, float]]):
        if not terms:
            raise ValueError("a reward needs at least one term")
        self.terms = tuple((str(n), str(s), float(w)) for n, s, w in terms)
        self.registered_functions = {spec: get_reward(spec) for _, spec, _ in self.terms if not is_code(spec)}
        """The registered terms' functions, taken here: they pickle by reference (their module), so a reward
        registered by the user's own script reaches the workers; code terms load from their spec there."""
        self._fns: Optional[list[Callable[[str, str, Mapping[str, Any]], Any]]] = None

    @classmethod
    def of(cls, reward: str, rewards: Sequence[Any] = ()) -> "Reward":
        """The reward of `data.reward` / `data.rewards` (a list of {reward, weight}; when given, it is the reward)."""
        if not rewards:
            return cls([(term_name(reward), reward, 1.0)])
        names = [term_name(_get(term, "reward")) for term in rewards]
        unique = [name if names.count(name) == 1 else f"{name}_{i}" for i, name in enumerate(names)]
        return cls([(name, _get(term, "reward"), _get(term, "weight", 1.0)) for name, term in zip(unique, rewards)])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.terms)

    @property
    def registered(self) -> tuple[str, ...]:
        """The registered rewards among the terms (their gold checks apply to the data)."""
        return tuple(spec for _, spec, _ in self.terms if not is_code(spec))

    @property
    def __name__(self) -> str:  # what the pool's log lines call it
        return "+".join(self.names)

    def functions(self) -> list[Callable[[str, str, Mapping[str, Any]], Any]]:
        if self._fns is None:
            self._fns = [_caller(load_function(spec) if is_code(spec) else self.registered_functions[spec])
                         for _, spec, _ in self.terms]
        return self._fns

    def __call__(self, response: str, gold: str, extras: Optional[Mapping[str, Any]] = None) -> Scored:
        parts, failures = [], []
        for (name, _, _), fn in zip(self.terms, self.functions()):
            before = signals_seen()
            try:
                value = float(fn(response, gold, extras or {}))
            except BaseException as err:  # noqa: BLE001 - a term that fails scores 0 and is named
                if not raised_by_code(err, before):
                    raise
                failures.append((name, f"raised {type(err).__name__}: {err}" if isinstance(err, Exception)
                                 else f"raised {err!r}"))
                value = 0.0
            else:
                if not (math.isfinite(value) and RANGE[0] <= value <= RANGE[1]):
                    failures.append((name, f"returned {value!r}, not a finite number in [{RANGE[0]:g}, {RANGE[1]:g}]"))
                    value = 0.0
            parts.append(value)
        total = sum(weight * part for (_, _, weight), part in zip(self.terms, parts))
        return Scored(total, tuple(parts), tuple(failures))

    def missing_fields(self, extras: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
        """(term, spec, field) of each field a code term asks for by name, without a default, that none of
        `extras` (a batch's rows) has: every item of it would fail, so the run stops on the first batch."""
        have = set().union(*(set(row) for row in extras)) if extras else set()
        missing = []
        for name, spec, _ in self.terms:
            if not is_code(spec):
                continue
            for field in _required_fields(load_function(spec)):
                if field not in have:
                    missing.append((name, spec, field))
        return missing

    def __getstate__(self) -> dict[str, Any]:
        return {"terms": self.terms, "registered_functions": self.registered_functions, "_fns": None}  # code loads again

    def __repr__(self) -> str:
        return f"Reward({list(self.terms)})"


def _required_fields(fn: Callable[..., Any]) -> list[str]:
    """The example fields `fn` asks for by name with no default (`_caller`'s rule: after response and gold)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[2:]
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.name != "extras" and p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def term_name(spec: str) -> str:
    """A term's name in logs and metrics: the registered name, or the code's function name."""
    return str(spec).rpartition(":")[2] if is_code(spec) else str(spec)


def _get(term: Any, key: str, default: Any = None) -> Any:
    return term.get(key, default) if isinstance(term, Mapping) else getattr(term, key, default)
