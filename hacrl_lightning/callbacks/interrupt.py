"""Ctrl-C (SIGINT), a scheduler's preemption (SIGTERM) and a closed terminal or ssh session (SIGHUP):
finish the step, checkpoint it, stop, say so.

`catch_signals()` wraps a whole run (`training.train`). Before training, a signal stops the run at
once (`RunInterrupted`: nothing is trained yet, so nothing is lost). During training the first
signal only asks `StopOnSignal` to stop: at the end of the current step every rank agrees (one
all-reduce per step, so a signal that reached only rank zero stops them all), the step is
checkpointed (`StepCheckpoint` saves when `trainer.should_stop`), no final evaluation or export runs,
and `train` writes `summary.json` with `"status": "interrupted"`; `scripts/train.py` then exits with
128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell does. A second
signal stops at once (`RunInterrupted` from the handler): the newest checkpoint is then the last periodic one.
A signal that was ignored when the process started stays ignored (a job started in the background keeps
its SIGINT ignored, `nohup` its SIGHUP). On SIGHUP the standard output and error that were a terminal
are pointed at /dev/null: a closed terminal fails every write with EIO, which would otherwise end the
run in the middle of the step it is finishing.

Lightning's own SIGTERM handling is replaced for the fit (it ends the fit with a bare `SystemExit`,
which exits with status 0, and broadcasts from inside the signal handler); it restores ours at teardown.
Deliberately not here: the checkpoint itself (`StepCheckpoint`) and the summary (`training`).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from lightning.pytorch import Callback

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _signals() -> tuple[int, ...]:
    """The signals to handle: one that was ignored when the process started is left alone (SIGINT of a job
    started in the background by a shell script, by Unix convention, as Python does; SIGHUP under `nohup`)."""
    return tuple(s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN)


class RunInterrupted(BaseException):
    """The run was stopped by a signal before it could finish a step (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Requests:
    """The signal received (None: none), shared by the handler and the callback of one run."""

    signum: Optional[int] = None
    training = False
    """A first signal is only recorded (during the steps, and the end-of-fit exports: `signals_deferred`)."""
    finishing = "finishing this step, then saving a checkpoint and stopping"
    """What the run does before it stops, as the first signal's line says."""
    terminal_fds: tuple[int, ...] = ()
    """Of stdout and stderr, those that were a terminal when the run started (a hung-up one no longer says so)."""


_requests = _Requests()


def _handler(signum, frame) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
        _leave_terminal()
    if _requests.signum is not None or not _requests.training:
        _requests.signum = signum
        raise RunInterrupted(signum)
    _requests.signum = signum
    try:
        os.write(2, f"\n{name} received: {_requests.finishing} (send it again to stop at once)\n".encode())
    except OSError:  # stderr is gone (a closed terminal): the summary says it all the same
        pass


def _leave_terminal() -> None:
    """Point the stdout and stderr that were a terminal at /dev/null (its writes fail once it is closed)."""
    if not _requests.terminal_fds:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in _requests.terminal_fds:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    _requests.terminal_fds = ()


@contextmanager
def catch_signals() -> Iterator[_Requests]:
    """Handle SIGINT/SIGTERM/SIGHUP for the duration of a run (main thread only; elsewhere a no-op)."""
    if not _is_main_thread():  # signal handlers can only be set there
        yield _requests
        return
    previous = {signum: signal.getsignal(signum) for signum in _signals()}
    _requests.signum, _requests.training = None, False
    _requests.terminal_fds = tuple(fd for fd in (1, 2) if os.isatty(fd))
    for signum in previous:
        signal.signal(signum, _handler)
    try:
        yield _requests
    finally:
        _requests.training = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def signals_deferred(finishing: str) -> Iterator[_Requests]:
    """A first signal only recorded (`_requests.signum`) for the duration, as during a step, its line saying
    `finishing`: the caller stops at its next point of agreement between the ranks (the end-of-fit exports, which
    are collectives under FSDP2: a rank that left one at once would leave the others waiting). A second signal
    stops at once."""
    before = (_requests.training, _requests.finishing)
    _requests.training, _requests.finishing = True, finishing
    try:
        yield _requests
    finally:
        _requests.training, _requests.finishing = before


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class StopOnSignal(Callback):
    """Ends the fit after the step in which a signal arrived (on every rank); `signum` says which."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.started = False
        """Training has started (Lightning's `on_train_start`): from here on a run directory is kept."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.started = True
        # after Lightning registered its SIGTERM handler (Trainer._run), so ours is the one that runs
        if _is_main_thread():
            for signum in SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    signal.signal(signum, _handler)
        _requests.training = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        signum = torch.tensor(_requests.signum or 0, device=trainer.strategy.root_device)
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(signum, op=torch.distributed.ReduceOp.MAX)
        if int(signum):
            self.signum = int(signum)
            _requests.signum = self.signum  # a second signal on any rank now stops at once
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        _requests.training = False
