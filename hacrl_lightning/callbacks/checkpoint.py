"""Checkpoints: on a cadence, at the last step and when a run stops early; written atomically; the
newest intact one found for resume.

A checkpoint is Lightning's full training state (every agent, every optimizer and LR schedule,
callback states such as the capability window, the data position, loop counters). It is written
to `step_XXXXXXX.ckpt.partial`, flushed to disk (fsync), and renamed to `step_XXXXXXX.ckpt` only
when complete (then the directory entry is fsynced too; `files.py`), so a process killed mid-write leaves the
previous checkpoints untouched and `latest_checkpoint` never returns a partial one; a stale
`.partial` is removed by the next save. Budgets count training steps, not
Lightning's `global_step`.

`StepCheckpoint` saves every `every` steps, whenever `minutes` have passed since the last save (the
default cadence: a crash costs minutes, not the run), after the last step (still inside the step, so
a larger `trainer.steps` can extend the run on resume), and after the step at which the run was told
to stop (`trainer.should_stop`: a signal, see `interrupt.py`). `resume_checkpoint` returns the newest
checkpoint that loads, naming the ones it skipped (a file cut short by a full disk or a bad copy).

A full disk ends the run cleanly (`CheckpointNotSaved`, a `RunFailed`: the run's summary says
`failed`, the message names the filesystem, the space and `resume=`). Before each save the free space
of the checkpoint directory is compared with the checkpoint's size (the newest one's, else the bytes of
the weights and optimizer state; `space_shortfall`); when it is short, checkpoints the save would prune
anyway go first (never the newest), and if that is not enough nothing is written. A write that fails
all the same (another writer filled the disk, a quota) removes its `.partial`. Either way the older
checkpoints stay intact and `resume=<run dir>` continues from the newest once there is space.

Every checkpoint is written where it will live: `LocalCheckpointIO` (the Trainer's checkpoint plugin) writes the
`.partial` file itself, never a whole copy in `$TMPDIR` first (Lightning's own save goes through fsspec's temporary
file, so a small temporary folder failed every checkpoint), so the free-space check measures the disk the file goes
to. A failed write is told by its cause: no space (free space, `resume=`), a file size limit (`ulimit -f`: EFBIG,
and the limit is checked before each save: `size_limit_shortfall`) or a folder this user cannot write.

Test hook: with `HACRL_CRASH_IN_CHECKPOINT=<step>` in the environment, the process cuts the temporary
file of that step's checkpoint to half its size and kills itself with SIGKILL, before the rename:
a deterministic "killed in the middle of writing" (tests/test_reliability.py).
"""

from __future__ import annotations

import errno
import io
import os
import re
import resource
import shutil
import signal
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback

from hacrl_lightning.errors import RunFailed
from hacrl_lightning.files import fsync_tree, replace_durably
from hacrl_lightning.placement import on_every_rank
from hacrl_lightning.run_dir import run_dir_of
from hacrl_lightning.safe_load import UnsafeCheckpoint, check_distributed_checkpoint, load_checkpoint_file

CHECKPOINT_RE = re.compile(r"^step_(\d+)\.ckpt$")
WEIGHTS_RE = re.compile(r"^weights_step_(\d+)\.ckpt$")
"""`trainer.keep_at_end=weights`: the last step's weights without optimizer, loop or callback state (evaluate.py
reads it; a run cannot resume from it)."""
CRASH_ENV = "HACRL_CRASH_IN_CHECKPOINT"
SPACE_MARGIN = (1.05, 1 << 20)
"""Free space a save wants: its estimated size times the first, plus the second in bytes (the summary,
TensorBoard events and the size of a checkpoint's own metadata beside its tensors)."""


class CheckpointNotSaved(RunFailed):
    """A checkpoint could not be written (too little space, or the write failed): nothing of it is left on
    disk and the older checkpoints are intact."""


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:07d}.ckpt"


def weights_path(directory: Path, step: int) -> Path:
    return directory / f"weights_step_{step:07d}.ckpt"


def save_atomically(trainer, path: Path, *, weights_only: bool = False) -> Path:
    """`trainer.save_checkpoint` into `<path>.partial`, then rename (a collective: call on all ranks);
    `weights_only`: the module's weights and its `on_save_checkpoint` state, no optimizer or callback state.
    A write that fails on any rank (no space, a quota, an I/O error: `_attempt`) removes the `.partial`
    and raises `CheckpointNotSaved` on every rank."""
    partial = path.with_name(path.name + ".partial")
    if trainer.is_global_zero and partial.exists():
        _remove(partial)
    trainer.strategy.barrier()
    error = _attempt(lambda: trainer.save_checkpoint(str(partial), weights_only=weights_only))
    trainer.strategy.barrier()
    if trainer.is_global_zero and error is None:
        error = _attempt(lambda: fsync_tree(partial))
    if not trainer.strategy.reduce_boolean_decision(error is None, all=True):  # every rank agrees
        if trainer.is_global_zero:
            _remove(partial)
        reason = f"the write failed ({_reason(error)})" if error else "another rank's write failed"
        raise CheckpointNotSaved(not_saved_message(path, reason, cause=_cause(error)))
    if trainer.is_global_zero:
        _crash_hook(partial)
        if path.exists():
            _remove(path)
        replace_durably(partial, path)
    trainer.strategy.barrier()
    return path


def _attempt(write) -> BaseException | None:
    """Run `write()`; the error of a failed write it raised (None: it succeeded). A failed write is an OSError,
    or, for a distributed checkpoint (FSDP2), torch's `CheckpointException`: a BaseException (not an Exception)
    that wraps each rank's error, a full disk among them."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        write()
    except (OSError, CheckpointException) as err:
        return err
    return None


class LocalCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint writer, writing the file at the path it is given (the `.partial` that
    `save_atomically` renames) and nowhere else: Lightning's own goes through an fsspec transaction, which writes the
    whole checkpoint into `$TMPDIR` first. The state is serialised in memory (as Lightning's is) and written with
    Python's file calls, so a failed write raises the `OSError` that names its cause (torch's own file writer
    reports any failure as a `RuntimeError` without its errno). `adapt`, when set, maps a checkpoint as it loads,
    before Lightning restores anything from it (`resume_agents=change`: `resume.adapt_checkpoint`)."""

    adapt = None

    def load_checkpoint(self, *args, **kwargs):
        checkpoint = super().load_checkpoint(*args, **kwargs)
        return self.adapt(checkpoint) if self.adapt is not None else checkpoint

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("LocalCheckpointIO.save_checkpoint(..., storage_options=...) is not supported")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(buffer.getbuffer())


def _cause(error: BaseException | None) -> str:
    """What a failed write needs from the user: `space` (free space), `limit` (a file size limit, EFBIG) or
    `access` (a folder or filesystem this user cannot write)."""
    failures = getattr(error, "failures", None)
    errors = [f[0] for f in failures.values()] if isinstance(failures, dict) else [error]
    numbers = {getattr(e, "errno", None) for e in errors}
    if errno.EFBIG in numbers:
        return "limit"
    if numbers & {errno.EACCES, errno.EPERM, errno.EROFS}:
        return "access"
    return "space"


def size_limit_shortfall(estimate: int) -> str | None:
    """Why a file of about `estimate` bytes is above this process's file size limit (`ulimit -f`,
    RLIMIT_FSIZE), or None (no limit, or it fits)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    need = int(estimate * SPACE_MARGIN[0])
    if limit == resource.RLIM_INFINITY or limit >= need:
        return None
    return (f"it needs about {_mb(need)} in one file and this process's file size limit (ulimit -f, RLIMIT_FSIZE) "
            f"is {_mb(limit)}")


def _reason(error: BaseException) -> str:
    """One line for a failed write: a distributed checkpoint's `CheckpointException` prints every rank's traceback,
    so each rank's own error is named instead."""
    failures = getattr(error, "failures", None)
    if not isinstance(failures, dict):
        return str(error)
    return "; ".join(f"rank {rank}: {type(failure[0]).__name__}: {failure[0]}" for rank, failure in sorted(failures.items()))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _size(path: Path) -> int:
    """Bytes of a checkpoint file, or of every file of a distributed checkpoint directory."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def state_bytes(trainer, pl_module) -> int:
    """The bytes of the module's weights and buffers and of every optimizer's state: what a first checkpoint
    holds (tensors shared by several names counted once; a sharded tensor at its global size)."""
    tensors = {id(t): t for t in (*pl_module.parameters(), *pl_module.buffers())}
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            tensors.update({id(v): v for v in state.values() if isinstance(v, torch.Tensor)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def space_shortfall(directory: Path, estimate: int) -> str | None:
    """Why a checkpoint of about `estimate` bytes does not fit in `directory`'s filesystem (None: it does)."""
    need = int(estimate * SPACE_MARGIN[0]) + SPACE_MARGIN[1]
    free = shutil.disk_usage(directory).free
    if free >= need:
        return None
    return f"it needs about {_mb(need)} and the filesystem holding {directory} has {_mb(free)} free"


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def not_saved_message(path: Path, reason: str, *, cause: str = "space") -> str:
    """What a checkpoint that was not saved costs and how to go on: the fix for its `cause` (`_cause`: free space,
    raise the file size limit, make the folder writable), then the newest intact one and `resume=`, or, where
    none was saved yet, a fresh start."""
    run = run_dir_of(path)
    match = CHECKPOINT_RE.match(path.name) or WEIGHTS_RE.match(path.name)
    step = int(match.group(1)) if match else path.name
    older = _checkpoints(path.parent) if path.parent.is_dir() else []
    head = f"checkpoint of step {step} not saved in {path.parent}: {reason}; nothing of it is left on disk. "
    fix = {"space": f"free space there (or move {run} to a larger disk)" if older
           else "free space there, or choose a run_dir on a larger disk",
           "limit": "this is the file size limit, not a full disk: raise it (ulimit -f unlimited in the shell "
                    "that starts the run)",
           "access": f"this user cannot write {path.parent}: make it writable (chmod u+w {path.parent}), or "
                     "choose a run_dir this user can write"}[cause]
    if older:
        return head + f"The newest checkpoint, {older[-1].name}, is intact: {fix}, then continue with resume={run}"
    return head + f"No checkpoint was saved before it: {fix}, then start again (overwrite=true to reuse {run})"


def _crash_hook(partial: Path) -> None:
    """Test hook (`HACRL_CRASH_IN_CHECKPOINT=<step>`): half-write this step's temporary file, then SIGKILL."""
    wanted = os.environ.get(CRASH_ENV)
    match = CHECKPOINT_RE.match(partial.name.removesuffix(".partial"))
    if not wanted or not match or int(match.group(1)) != int(wanted):
        return
    files = [partial] if partial.is_file() else [p for p in partial.rglob("*") if p.is_file()]
    file = max(files, key=lambda p: p.stat().st_size)
    with open(file, "rb+") as handle:
        handle.truncate(file.stat().st_size // 2)
        os.fsync(handle.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def _checkpoints(directory: Path) -> list[Path]:
    """The complete `step_*.ckpt` in `directory`, oldest first."""
    return sorted((p for p in directory.glob("step_*.ckpt") if CHECKPOINT_RE.match(p.name)),
                  key=lambda p: int(CHECKPOINT_RE.match(p.name).group(1)))


def _weights_only(location: Path, weights: Path) -> str:
    """Why `resume=location` cannot continue from `weights` (a weights-only checkpoint), and what to do instead."""
    run = run_dir_of(weights)
    return (f"resume={str(location)!r}: the run kept only {weights.name}, its weights without optimizer state "
            "(trainer.keep_at_end=weights), which cannot continue it exactly; evaluate it (scripts/evaluate.py "
            f"agents=[{run}]), or start a new run from its exports (agents.<key>.model=<run>/exports/<key>)")


def candidates(location: str | os.PathLike) -> list[Path]:
    """A checkpoint file/dir as given, or the complete `step_*.ckpt` of a run dir (or its checkpoints/), newest first."""
    location = Path(location)
    if WEIGHTS_RE.match(location.name) and location.exists():
        raise FileNotFoundError(_weights_only(location, location))
    if CHECKPOINT_RE.match(location.name) or location.suffix == ".ckpt":
        if not location.exists():
            raise FileNotFoundError(f"resume={str(location)!r}: no such checkpoint")
        return [location]
    for directory in (location / "checkpoints", location):
        found = _checkpoints(directory)
        if found:
            return found[::-1]
    weights = newest_weights(location)
    if weights is not None:
        raise FileNotFoundError(_weights_only(location, weights))
    raise FileNotFoundError(f"resume={str(location)!r}: no complete checkpoint (step_*.ckpt) in it or in its "
                            "checkpoints/ folder; give a run directory that saved one, or a .ckpt path")


def newest_evaluable(location: str | os.PathLike) -> Path:
    """What evaluation reads at `location`: a checkpoint file as given, else the newest of a run dir's complete full
    checkpoint and its `weights_step_*.ckpt` (by step). Raises FileNotFoundError (saying why) when there is neither."""
    weights = newest_weights(location) if not Path(location).suffix == ".ckpt" else None
    try:
        full = latest_checkpoint(location)
    except FileNotFoundError:
        if weights is None:
            raise
        return weights
    if weights is None:
        return full
    steps = [int(rx.match(p.name).group(1)) if rx.match(p.name) else -1
             for p, rx in ((full, CHECKPOINT_RE), (weights, WEIGHTS_RE))]
    return weights if steps[1] > steps[0] else full


def newest_weights(location: str | os.PathLike) -> Path | None:
    """The newest `weights_step_*.ckpt` of a run dir or its checkpoints/ (`trainer.keep_at_end=weights`), or None."""
    location = Path(location)
    found = [p for directory in (location / "checkpoints", location) if directory.is_dir()
             for p in directory.glob("weights_step_*.ckpt") if WEIGHTS_RE.match(p.name)]
    return max(found, key=lambda p: int(WEIGHTS_RE.match(p.name).group(1)), default=None)


def latest_checkpoint(location: str | os.PathLike) -> Path:
    """A checkpoint file/dir as given, or the newest complete `step_*.ckpt` in a run dir or its checkpoints/."""
    return candidates(location)[0]


def damage(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (None: it loads). Reads the file's index and maps its
    tensors without copying them (a distributed checkpoint: its metadata and the size of every shard), with
    `safe_load`'s readers: a checkpoint that would run code raises `UnsafeCheckpoint` (never damage to skip)."""
    try:
        if path.is_dir():
            from torch.distributed.checkpoint import FileSystemReader

            check_distributed_checkpoint(path)  # before torch's own plain pickle.load of its .metadata
            metadata = FileSystemReader(str(path)).read_metadata()
            for info in metadata.storage_data.values():
                shard = path / info.relative_path
                if not shard.is_file() or shard.stat().st_size < info.offset + info.length:
                    return f"shard {info.relative_path} is missing or cut short"
        else:
            load_checkpoint_file(path, mmap=True)
    except UnsafeCheckpoint:
        raise
    except Exception as err:  # noqa: BLE001 - any failure to load is damage, named in the message
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".strip()
    return None


def resume_checkpoint(location: str | os.PathLike) -> tuple[Path, list[tuple[Path, str]]]:
    """The newest checkpoint at `location` that loads, and the newer ones skipped with the reason.
    Raises FileNotFoundError when there is none (every one damaged), and `UnsafeCheckpoint` at the first one
    that would run code: a run directory holding such a file is not resumed from an older one either."""
    skipped = []
    for path in candidates(location):
        reason = damage(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    raise FileNotFoundError(f"resume={str(location)!r}: no checkpoint there loads ("
                            + "; ".join(f"{p.name}: {r}" for p, r in skipped) + ")")


class StepCheckpoint(Callback):
    """Save into `directory` every `every` steps (0: off), every `minutes` of wall time (0: off), after
    step `steps` (the last) and after the step at which the run was told to stop; keep the newest `keep`."""

    def __init__(self, directory: str | os.PathLike, *, every: int, steps: int, minutes: float = 0.0, keep: int = 3,
                 last: str = "checkpoint"):
        self.directory = Path(directory)
        self.every, self.steps, self.minutes, self.keep = every, steps, minutes, keep
        self.last = last
        """After the last step (`trainer.keep_at_end`): `checkpoint` saves a full checkpoint, `weights` the weights
        alone (`weights_step_N.ckpt`), `exports` nothing (the exports will be what stays)."""
        self._saved_step: int | None = None
        self._first: int | None = None
        """`_first_estimate`, taken at this run's first save (every rank saves together, so all take it then)."""
        self._last_save = time.monotonic()

    def _save(self, trainer, pl_module) -> None:
        step = pl_module.steps_done
        if step == self._saved_step:
            return
        path = checkpoint_path(self.directory, step)
        shortfall = None
        if self._first is None:  # a collective: every rank, at the first save (the state's size does not change)
            self._first = self._first_estimate(trainer, pl_module)
        first = self._first
        if trainer.is_global_zero:
            self.directory.mkdir(parents=True, exist_ok=True)
            shortfall = self._make_room(first)
        shortfall = trainer.strategy.broadcast(shortfall, src=0)  # rank zero's disk decides for all (a collective)
        if shortfall:
            raise CheckpointNotSaved(not_saved_message(path, shortfall[0], cause=shortfall[1]))
        save_atomically(trainer, path)
        self._saved_step, self._last_save = step, time.monotonic()
        if trainer.is_global_zero:
            old = _checkpoints(self.directory)
            for stale in old[: max(0, len(old) - self.keep)]:
                _remove(stale)

    @staticmethod
    def _first_estimate(trainer, pl_module) -> int:
        """What a first checkpoint holds: `state_bytes` of every rank's agents, each group's counted once (every rank
        holds every agent at its global size under `shared`; under `split` a group holds only its own)."""
        shares = dict(on_every_rank((tuple(getattr(pl_module, "local", ())), state_bytes(trainer, pl_module))))
        return sum(shares.values())

    def _make_room(self, first_estimate: int) -> tuple[str, str] | None:
        """Rank zero, before a save: None when the checkpoint fits (`size_limit_shortfall`, `space_shortfall`; its
        size estimated from
        the newest checkpoint, else `first_estimate`: the state's bytes), after removing, where space is short, the old
        checkpoints this save would prune anyway (never the newest) and any `.partial` left by a write that was
        killed or failed; else why it does not fit and its cause (`_cause`'s words)."""
        for stale in self.directory.glob("*.ckpt.partial"):
            _remove(stale)
        old = _checkpoints(self.directory)
        estimate = _size(old[-1]) if old else first_estimate
        limit = size_limit_shortfall(estimate)
        if limit:
            return limit, "limit"
        shortfall = space_shortfall(self.directory, estimate)
        prunable = old[: max(0, min(len(old) - 1, len(old) + 1 - self.keep))]
        if shortfall and prunable:
            for stale in prunable:
                _remove(stale)
            shortfall = space_shortfall(self.directory, estimate)
        return (shortfall, "space") if shortfall else None

    def _time_is_up(self, trainer) -> bool:
        """Rank zero's clock decides, so all ranks save together (the save is a collective)."""
        if not self.minutes:
            return False
        due = trainer.is_global_zero and time.monotonic() - self._last_save >= 60 * self.minutes
        return bool(trainer.strategy.broadcast(due, src=0))

    def _save_weights(self, trainer, pl_module) -> None:
        """The last step's weights alone (`trainer.keep_at_end=weights`), atomically, where the disk has room."""
        path = weights_path(self.directory, pl_module.steps_done)
        shortfall = None
        if trainer.is_global_zero:
            self.directory.mkdir(parents=True, exist_ok=True)
            weights = sum(t.numel() * t.element_size() for t in pl_module.state_dict().values())
            limit = size_limit_shortfall(weights)
            shortfall = (limit, "limit") if limit else None
            if shortfall is None and (space := space_shortfall(self.directory, weights)):
                shortfall = (space, "space")
        shortfall = trainer.strategy.broadcast(shortfall, src=0)
        if shortfall:
            raise CheckpointNotSaved(not_saved_message(path, shortfall[0], cause=shortfall[1]))
        save_atomically(trainer, path, weights_only=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.steps_done
        if step >= self.steps and self.last != "checkpoint" and not trainer.should_stop:
            if self.last == "weights":
                self._save_weights(trainer, pl_module)
            return
        if ((self.every and step % self.every == 0) or step >= self.steps or trainer.should_stop
                or self._time_is_up(trainer)):
            self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.last != "checkpoint" and pl_module.steps_done >= self.steps:
            return
        saved = trainer.is_global_zero and checkpoint_path(self.directory, pl_module.steps_done).exists()
        if not trainer.strategy.broadcast(saved, src=0):  # e.g. a resume that trained nothing; rank zero's view, so
            self._save(trainer, pl_module)  # every rank enters the save (a collective) or none does

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        """A checkpoint written after a run's last step carries Lightning's "the loader is exhausted" flag,
        which would end a resumed run with a larger `trainer.steps` at once; clear it when steps remain."""
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        if progress is not None and checkpoint["hacrl"]["steps_done"] < self.steps:
            progress["is_last_batch"] = False
