"""RewardPool: score a batch of (response, gold) pairs in worker processes with a hard per-item timeout.

A reward function run on model output can hang (sympy expanding `(x+1)^{99999}`, which math_verify's
input guards let through) or take its process down (a segfault in a C extension). The pool runs
every item as its own task on `pebble.ProcessPool`, which starts an item's clock when a worker
picks it up, kills the worker when the item overruns, and replaces dead or killed workers. Such an
item scores 0.0, is counted in `stats` (`timeouts`, `crashes`; a Python exception counts as
`errors`) and is logged with its index and cause; every other item of the batch is scored
normally, so results equal a serial run wherever nothing failed.

`workers=0` scores in-process (no pool, no timeout: for cheap rewards such as exact match). A `Reward` of
several terms (custom.py) returns each term's value and its failed terms: the pool keeps them per item for
the batch (`parts`, `term_failures`), counts and logs each failed term by name, and passes each item its
example's extra fields.
Deliberately not here: the reward math (`math_verify.py`, `exact_match.py`) and which items to
exclude for an unscorable gold (the data side, via `gold_parses`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import sys
from concurrent.futures.process import BrokenProcessPool
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

from pebble import ProcessExpired, ProcessPool

RewardFn = Callable[[str, str], float]

log = logging.getLogger(__name__)


class RewardPool:
    """`pool.score(responses, golds) -> list[float]`; a context manager, `close()` ends the workers.

    Workers start on the first `score` call. `stats` counts items scored, timeouts, crashes and
    errors since the pool was built (cumulative, for logging).
    """

    def __init__(self, reward_fn: RewardFn, *, workers: int, timeout_s: float):
        if workers < 0:
            raise ValueError(f"reward workers={workers} must be >= 0 (0 scores in-process)")
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s={timeout_s} must be > 0 seconds")
        self.reward_fn, self.workers, self.timeout_s = reward_fn, workers, float(timeout_s)
        self.stats = {"items": 0, "timeouts": 0, "crashes": 0, "errors": 0, "term_failures": 0}
        self.failures: dict[int, str] = {}
        """The last batch's failed items: index -> `timeouts`, `crashes` or `errors`."""
        self.failure_causes: dict[int, str] = {}
        """The last batch's failed items: index -> what happened."""
        self.parts: list[Optional[tuple[float, ...]]] = []
        """The last batch's term values per item (a `Reward`'s; None where the whole item failed or the reward is
        a plain function)."""
        self.term_failures: dict[str, list[str]] = {}
        """The last batch's failed terms of a `Reward`: term name -> the cause of each failure."""
        self._pool: ProcessPool | None = None

    def score(self, responses: Sequence[str], golds: Sequence[str],
              extras: Optional[Sequence[Mapping[str, Any]]] = None) -> list[float]:
        """One reward per (response, gold); a failed item scores 0.0 and is counted and logged. `extras`: each
        item's example's extra fields, for a `Reward` whose terms ask for them."""
        if len(responses) != len(golds) or (extras is not None and len(extras) != len(golds)):
            raise ValueError(f"score() got {len(responses)} responses but {len(golds)} gold answers"
                             + ("" if extras is None else f" and {len(extras)} extras") + "; pass one per response")
        self.stats["items"] += len(responses)
        self.failures, self.failure_causes, self.term_failures = {}, {}, {}
        self.parts = [None] * len(responses)
        args = [(r, g) if not hasattr(self.reward_fn, "terms") else (r, g, extras[i] if extras else {})
                for i, (r, g) in enumerate(zip(responses, golds))]
        if self.workers == 0 or not responses:
            return [self._in_process(i, item) for i, item in enumerate(args)]
        pool = self._running_pool()
        futures = [pool.schedule(self.reward_fn, args=item, timeout=self.timeout_s) for item in args]
        return [self._result(i, future) for i, future in enumerate(futures)]

    def _in_process(self, index: int, item: tuple) -> float:
        try:
            return self._take(index, self.reward_fn(*item))
        except Exception as error:  # a broken item must not end the run; it scores 0 and is counted
            return self._failed(index, "errors", f"raised {error!r}")

    def _take(self, index: int, result: Any) -> float:
        """An item's score: a float, or a `Scored` whose parts and failed terms are kept, counted and logged."""
        if not hasattr(result, "parts"):
            return float(result)
        self.parts[index] = tuple(result.parts)
        for name, cause in result.failures:
            self.stats["term_failures"] += 1
            self.term_failures.setdefault(name, []).append(cause)
            log.warning("reward %s: item %d %s; it scores 0.0", name, index, cause)
        return float(result.total)

    def _result(self, index: int, future: concurrent.futures.Future) -> float:
        try:
            return self._take(index, future.result())
        except concurrent.futures.TimeoutError:
            return self._failed(index, "timeouts", f"timed out after {self.timeout_s:g} s; its worker was killed "
                                "and replaced")
        except BrokenProcessPool as error:  # no worker could start: a setup problem, not a bad item
            self.close()
            raise RuntimeError(f"the reward workers could not start ({error}); a script that builds a RewardPool "
                               "needs the `if __name__ == '__main__':` guard (workers re-import the main "
                               "module), or set data.reward_workers=0 to score in-process") from error
        except ProcessExpired as error:
            return self._failed(index, "crashes", f"crashed its worker (exit code {error.exitcode}); "
                                "the worker was replaced")
        except Exception as error:
            return self._failed(index, "errors", f"raised {error!r}")

    def _failed(self, index: int, kind: str, cause: str) -> float:
        self.stats[kind] += 1
        self.failures[index] = kind
        self.failure_causes[index] = cause
        name = getattr(self.reward_fn, "__name__", "reward")
        log.warning("%s: item %d of the batch %s; it scores 0.0", name, index, cause)
        return 0.0

    def _running_pool(self) -> ProcessPool:
        if self._pool is None or not self._pool.active:
            # forkserver, not fork: the trainer process holds torch's thread pools (and maybe CUDA),
            # which a forked child inherits in a broken state. Each worker forks from a clean server
            # and then re-runs the main script's top level (multiprocessing's rule); the server has
            # imported the reward's module and everything the main script imports, so a worker (also
            # the replacement of a killed one) starts in milliseconds, not seconds of torch imports.
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([self.reward_fn.__module__, *_main_script_imports()])
            # a fresh worker scores one trivial item before taking tasks: first-call set-up (math-verify
            # builds its LaTeX grammar, ~0.2 s idle, seconds on a busy CPU) must not eat an item's timeout
            self._pool = ProcessPool(max_workers=self.workers, context=context, initializer=_warm_up,
                                     initargs=(self.reward_fn,))
        return self._pool

    def close(self) -> None:
        """Stop the workers (idempotent); a later `score` starts new ones."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _warm_up(reward_fn: RewardFn) -> None:
    try:
        reward_fn("\\boxed{1}", "1", {}) if hasattr(reward_fn, "terms") else reward_fn("\\boxed{1}", "1")
    except Exception:  # a reward that fails here fails on its items too, where it is counted
        pass


def _main_script_imports() -> list[str]:
    """Modules the main script has imported (its module globals and the homes of its imported names)."""
    main = sys.modules.get("__main__")
    homes = {value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
             for value in vars(main).values()} if main is not None else set()
    return sorted(name for name in homes if isinstance(name, str) and name not in ("__main__", "builtins"))
