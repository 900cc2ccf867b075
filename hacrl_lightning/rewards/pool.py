"""RewardPool: score a batch of (response, gold) pairs in worker processes with a hard per-item timeout.

A reward function run on model output can hang (sympy expanding `(x+1)^{99999}`, which math_verify's
input guards let through) or take its process down (a segfault in a C extension). The pool runs
every item as its own task on `pebble.ProcessPool`, which starts an item's clock when a worker
picks it up, kills the worker when the item overruns, and replaces dead or killed workers. Such an
item scores 0.0, is counted in `stats` (`timeouts`, `crashes`; anything the reward raises counts as
`errors`, `SystemExit` and `KeyboardInterrupt` included) and is logged with its index and cause; every other
item of the batch is scored normally, so results equal a serial run wherever nothing failed.

User code is isolated by default (`workers=None`: one worker when the reward runs the user's code, in-process
for the registered rewards); `workers=0` scores in-process (no timeout, no isolation: for cheap rewards such as
exact match), on copies of each row's fields. A worker starts clean (`_start_worker`): the default signal
dispositions (so a SIGTERM ends it and whatever it forks), its own process group (a terminal's Ctrl-C is the
trainer's to handle, not the workers'), and death with its parent on Linux; its warm-up call (the reward's
first, on a sample item) is cut off after the item timeout. Workers never outlive the pool: `close()` and the
interpreter's exit stop them without waiting on running items (SIGTERM to each worker's group, then SIGKILL),
and a pool whose workers keep ending before they take an item, or take none for far longer than any item may
run, fails the call in one line (`RewardWorkersFailed`) saying what happened, never a hang.
A `Reward` of several terms (custom.py) returns each term's value and its failed terms: the pool keeps them per
item for the batch (`parts`, `term_failures`), counts and logs each failed term by name, and passes each item its
example's extra fields (a field a term needs that no row of the batch has stops the run: `RewardError`).
Deliberately not here: the reward math (`math_verify.py`, `exact_match.py`) and which items to
exclude for an unscorable gold (the data side, via `gold_parses`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import copy
import errno
import logging
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import weakref
from concurrent.futures.process import BrokenProcessPool
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Sequence

from pebble import ProcessExpired, ProcessPool

from hacrl_lightning.errors import RunFailed
from hacrl_lightning.rewards.custom import RewardError, _Signals, raised_by_code, signals_seen, watch_signals

RewardFn = Callable[[str, str], float]

log = logging.getLogger(__name__)

CODE_WORKERS = 1
"""Workers for a reward that runs the user's code when `workers` is left unset (None)."""
STALL_SLACK_S = 30.0
"""Beyond a warm-up and an item's timeout, how long the pool may finish no item at all before it is stuck."""
WARM_UP_DRIFT = 2
"""Warm-ups begun and never finished, beyond one per worker, that mean the workers keep ending in it."""
FILES_PER_WORKER = 8
"""File descriptors a worker costs its parent and the forkserver (pipes, locks), for the `ulimit -n` check."""
STOP_GRACE_S = 1.0
"""How long stopped workers get to end on SIGTERM before SIGKILL."""


class RewardWorkersFailed(RunFailed):
    """The reward workers could not score at all (they end before taking an item, or cannot start): the message
    says what happened and the fix; scripts print it in one line."""


class RewardRaised(Exception):
    """A reward raised something other than an `Exception` in a worker (`SystemExit`, `KeyboardInterrupt`):
    carried back as an item's failure, its repr the argument."""


def uses_code(reward_fn: Any) -> bool:
    """Whether `reward_fn` runs the user's code (a `Reward` with a `module:function` or file term)."""
    terms = getattr(reward_fn, "terms", None)
    return bool(terms) and any(":" in spec for _, spec, _ in terms)


class RewardPool:
    """`pool.score(responses, golds) -> list[float]`; a context manager, `close()` ends the workers.

    Workers start on the first `score` call. `stats` counts items scored, timeouts, crashes and
    errors since the pool was built (cumulative, for logging). `workers=None`: `CODE_WORKERS` for a reward
    that runs the user's code, else 0 (in-process).
    """

    def __init__(self, reward_fn: RewardFn, *, workers: Optional[int], timeout_s: float):
        if workers is None:
            workers = CODE_WORKERS if uses_code(reward_fn) else 0
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
        self._warm_ups: Any = None
        """Shared with the workers: [warm-ups begun, warm-ups finished] (`_start_worker`)."""
        self._exit_codes: list[int] = []
        """Non-zero exit codes of workers that ended while no item ran on them (in their warm-up)."""
        self._fields_checked = False

    @property
    def name(self) -> str:
        return getattr(self.reward_fn, "__name__", "reward")

    def score(self, responses: Sequence[str], golds: Sequence[str],
              extras: Optional[Sequence[Mapping[str, Any]]] = None) -> list[float]:
        """One reward per (response, gold); a failed item scores 0.0 and is counted and logged. `extras`: each
        item's example's extra fields, for a `Reward` whose terms ask for them."""
        if len(responses) != len(golds) or (extras is not None and len(extras) != len(golds)):
            raise ValueError(f"score() got {len(responses)} responses but {len(golds)} gold answers"
                             + ("" if extras is None else f" and {len(extras)} extras") + "; pass one per response")
        if responses and not self._fields_checked and hasattr(self.reward_fn, "missing_fields"):
            self._check_fields(extras or [{}] * len(responses))
        self.stats["items"] += len(responses)
        self.failures, self.failure_causes, self.term_failures = {}, {}, {}
        self.parts = [None] * len(responses)
        args = [(r, g) if not hasattr(self.reward_fn, "terms") else (r, g, extras[i] if extras else {})
                for i, (r, g) in enumerate(zip(responses, golds))]
        if self.workers == 0 or not responses:
            with watch_signals():
                return [self._in_process(i, item) for i, item in enumerate(args)]
        pool = self._running_pool()
        try:
            futures = [pool.schedule(_call, args=(self.reward_fn, *item), timeout=self.timeout_s) for item in args]
        except RuntimeError as error:  # the pool broke while starting (no worker could be made)
            raise self._broken(error) from None
        self._wait(futures)
        return [self._result(i, future) for i, future in enumerate(futures)]

    def _check_fields(self, extras: Sequence[Mapping[str, Any]]) -> None:
        """The first batch: a field a code term needs that no row has fails every item; stop in one line."""
        missing = self.reward_fn.missing_fields(extras)
        self._fields_checked = True
        if missing:
            term, spec, field = missing[0]
            have = sorted(set().union(*(set(row) for row in extras)))
            raise RewardError(f"the reward term {term!r} ({spec}) needs the field {field!r} of each data row, and no "
                              f"row has it (the rows' fields: {have}); fix: add a {field!r} column to the data "
                              f"files, or give the function's parameter {field!r} a default")

    def _in_process(self, index: int, item: tuple) -> float:
        before = signals_seen()
        try:  # copies: a reward that changes its arguments must not change the data of later items and steps
            return self._take(index, self.reward_fn(*copy.deepcopy(item)))
        except BaseException as error:  # a broken item must not end the run; it scores 0 and is counted
            if not raised_by_code(error, before):
                raise  # a real Ctrl-C or SIGTERM while it ran
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

    def _wait(self, futures: list) -> None:
        """Until every item is done; a pool that finishes no item for longer than a warm-up and an item may take
        (plus `STALL_SLACK_S`), or whose workers keep ending in their warm-up, fails in one line."""
        pending, stall_s = set(futures), 2 * self.timeout_s + STALL_SLACK_S
        quiet_since = time.monotonic()
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=0.2,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            if done:
                quiet_since = time.monotonic()
                continue
            begun, finished = self._warm_up_counts()
            if begun - finished > self.workers + WARM_UP_DRIFT:
                self.close()
                raise RewardWorkersFailed(self._warm_up_cause(begun - finished))
            if time.monotonic() - quiet_since > stall_s:
                self.close()
                raise RewardWorkersFailed(
                    f"the reward {self.name!r}: no worker finished an item in {stall_s:g} s, though an item may take "
                    f"{self.timeout_s:g} s (data.reward_timeout_s) and a worker's warm-up as long; "
                    + ("a worker's warm-up call (the reward's first, on a sample item) never returned and could not "
                       "be interrupted" if begun > finished else "the workers took no item")
                    + "; fix: run the function on a few rows by hand and see where it hangs")

    def _warm_up_counts(self) -> tuple[int, int]:
        return (int(self._warm_ups[0]), int(self._warm_ups[1])) if self._warm_ups is not None else (0, 0)

    def _warm_up_cause(self, unfinished: int) -> str:
        codes = sorted(set(self._exit_codes))
        how = f"exit code {', '.join(map(str, codes))}" if codes else "exit code 0: os._exit or a clean exit"
        return (f"the reward {self.name!r} ended {unfinished} worker processes in their warm-up call (the reward's "
                f"first call in a worker, on the sample item response '\\boxed{{1}}', gold '1'; {how}); the "
                "workers could score nothing; fix: the function must return a number there, not end its process")

    def _broken(self, error: BaseException) -> RewardWorkersFailed:
        """The message for a pool that broke: what really failed (a warm-up that ended its workers, too few
        file descriptors, workers that could not start), and only then the fix it needs."""
        self.close()
        begun, finished = self._warm_up_counts()
        if begun > finished:
            return RewardWorkersFailed(self._warm_up_cause(begun - finished))
        cause = error
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if (isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE)) or _open_files() + \
                FILES_PER_WORKER * (self.workers + 1) > soft:  # the error may be a worker's, seen only as its end
            return RewardWorkersFailed(
                f"the reward workers could not start: this process may open at most {soft} files (ulimit -n {soft}) "
                f"and {self.workers} workers need more; fix: raise the limit (ulimit -n 4096) before the command, "
                "or set data.reward_workers=0 to score in-process (no timeout, no isolation)")
        codes = sorted(set(self._exit_codes))
        if not begun:  # the workers ended before their first line of the reward's code: the start itself failed
            return RewardWorkersFailed(
                f"the reward workers ended before they could start ({error or type(error).__name__}"
                + (f"; exit code {', '.join(map(str, codes))}" if codes else "") + "): each worker re-imports the "
                "main script, so a script that builds a RewardPool needs the `if __name__ == '__main__':` guard; "
                "otherwise see the log above for the worker's error, or set data.reward_workers=0 to score "
                "in-process")
        return RewardWorkersFailed(f"the reward workers of {self.name!r} all ended ({error}"
                                   + (f"; exit code {', '.join(map(str, codes))}" if codes else "")
                                   + "); see the log above for why, fix the function and start again")

    def _result(self, index: int, future: concurrent.futures.Future) -> float:
        try:
            return self._take(index, future.result())
        except concurrent.futures.TimeoutError:
            return self._failed(index, "timeouts", f"timed out after {self.timeout_s:g} s; its worker was killed "
                                "and replaced")
        except BrokenProcessPool as error:  # every worker ended with no item running: see `_broken`
            raise self._broken(error) from None
        except ProcessExpired as error:
            return self._failed(index, "crashes", f"crashed its worker (exit code {error.exitcode}); "
                                "the worker was replaced")
        except RewardRaised as error:
            return self._failed(index, "errors", f"raised {error.args[0]}")
        except Exception as error:
            return self._failed(index, "errors", f"raised {error!r}")

    def _failed(self, index: int, kind: str, cause: str) -> float:
        self.stats[kind] += 1
        self.failures[index] = kind
        self.failure_causes[index] = cause
        log.warning("%s: item %d of the batch %s; it scores 0.0", self.name, index, cause)
        return 0.0

    def _running_pool(self) -> ProcessPool:
        if self._pool is None or not self._pool.active:
            self.close()  # a broken pool's workers go first
            # forkserver, not fork: the trainer process holds torch's thread pools (and maybe CUDA),
            # which a forked child inherits in a broken state. Each worker forks from a clean server
            # and then re-runs the main script's top level (multiprocessing's rule); the server has
            # imported the reward's module and everything the main script imports, so a worker (also
            # the replacement of a killed one) starts in milliseconds, not seconds of torch imports.
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([self.reward_fn.__module__, *_main_script_imports()])
            # a fresh worker scores one trivial item before taking tasks: first-call set-up (math-verify
            # builds its LaTeX grammar, ~0.2 s idle, seconds on a busy CPU) must not eat an item's timeout;
            # that warm-up is itself cut off after the item timeout
            self._warm_ups = context.Array("l", 2)
            self._exit_codes = []
            try:
                self._pool = ProcessPool(max_workers=self.workers, context=context, initializer=_start_worker,
                                         initargs=(self.reward_fn, self.timeout_s, self._warm_ups))
            except OSError as error:
                raise self._broken(error) from None
            self._watch_expirations(self._pool)
            _LIVE.add(self)
        return self._pool

    def _watch_expirations(self, pool: ProcessPool) -> None:
        """Keep the exit codes of workers that end with no item running (pebble only says "all workers expired")."""
        manager = getattr(getattr(pool, "_pool_manager", None), "worker_manager", None)
        inspect = getattr(manager, "inspect_workers", None)
        if inspect is None:
            return
        codes = self._exit_codes

        def inspect_workers() -> tuple:
            expired = inspect()
            codes.extend(code for _, code in expired if code is not None)
            return expired

        manager.inspect_workers = inspect_workers

    def close(self) -> None:
        """Stop the workers now (idempotent), without waiting on the items they run: SIGTERM to each worker's
        process group (it and whatever it forked), SIGKILL after `STOP_GRACE_S`; a later `score` starts new ones."""
        pool, self._pool = self._pool, None
        _LIVE.discard(self)
        if pool is None:
            return
        workers = _worker_pids(pool)
        pool.stop()
        _end_groups(workers)
        joining = threading.Thread(target=pool.join, daemon=True, name="reward-pool-join")
        joining.start()
        joining.join(10.0)  # pebble's threads are daemons: one stuck on a dead pipe cannot hold the exit

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIVE: "weakref.WeakSet[RewardPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    """At the interpreter's exit, before multiprocessing joins its children (registered after pebble's and
    multiprocessing's handlers, so it runs first): no worker still running an item keeps the process alive."""
    for pool in list(_LIVE):
        pool.close()


def _worker_pids(pool: ProcessPool) -> list[int]:
    manager = getattr(getattr(pool, "_pool_manager", None), "worker_manager", None)
    return [pid for pid in list(getattr(manager, "workers", {}) or {}) if isinstance(pid, int)]


def _end_groups(pids: list[int]) -> None:
    """SIGTERM to each worker's process group (the worker alone where it has not made its own yet), then SIGKILL
    to those still there after `STOP_GRACE_S`."""
    def send(pid: int, signum: int) -> bool:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    live = [pid for pid in pids if send(pid, signal.SIGTERM)]
    deadline = time.monotonic() + STOP_GRACE_S
    while live and time.monotonic() < deadline:
        time.sleep(0.02)
        live = [pid for pid in live if _alive(pid)]
    for pid in live:
        send(pid, signal.SIGKILL)


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by pebble) is gone for this purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


class _WarmUpOverran(BaseException):
    """Raised into a worker's warm-up call when it runs past the item timeout (SIGALRM)."""


def _start_worker(reward_fn: RewardFn, timeout_s: float, warm_ups: Any) -> None:
    """A worker's start: default signal dispositions (pebble ignores SIGINT; a reward's fork inherits them),
    its own process group, death with its parent, then the warm-up call, cut off after `timeout_s`."""
    _Signals.in_worker = True
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the trainer's group only; close() ends this group
    except OSError:
        pass
    _die_with_parent()
    with warm_ups.get_lock():
        warm_ups[0] += 1
    signal.signal(signal.SIGALRM, _overran)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        reward_fn("\\boxed{1}", "1", {}) if hasattr(reward_fn, "terms") else reward_fn("\\boxed{1}", "1")
    except BaseException:  # noqa: BLE001 - a reward that fails here fails on its items too, where it is counted
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    with warm_ups.get_lock():
        warm_ups[1] += 1


def _overran(signum, frame) -> None:
    raise _WarmUpOverran()


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent (the forkserver, which ends with the trainer) ends."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took
        os._exit(1)


def _call(reward_fn: RewardFn, *args: Any) -> Any:
    """An item in a worker: whatever the reward raises is its failure, `SystemExit` and `KeyboardInterrupt` too
    (carried back as `RewardRaised`; pebble would raise them in the trainer)."""
    try:
        return reward_fn(*args)
    except Exception:
        raise
    except BaseException as error:
        raise RewardRaised(repr(error)) from None


def _main_script_imports() -> list[str]:
    """Modules the main script has imported (its module globals and the homes of its imported names)."""
    main = sys.modules.get("__main__")
    homes = {value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
             for value in vars(main).values()} if main is not None else set()
    return sorted(name for name in homes if isinstance(name, str) and name not in ("__main__", "builtins"))
