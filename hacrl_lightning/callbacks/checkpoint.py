"""Checkpoints every N training steps, written atomically, and the lookup of the newest one for resume.

A checkpoint is Lightning's full training state (every agent, every optimizer and LR schedule,
callback states such as the capability window, the data position, loop counters). It is written
to `step_XXXXXXX.ckpt.partial`, flushed to disk (fsync), and renamed to `step_XXXXXXX.ckpt` only
when complete (then the directory entry is fsynced too), so a process killed mid-write leaves the
previous checkpoints untouched and `latest_checkpoint` never returns a partial one; a stale
`.partial` is removed by the next save of that step. Budgets count training steps, not
Lightning's `global_step`.

Test hook: with `HACRL_CRASH_IN_CHECKPOINT=<step>` in the environment, the process cuts the temporary
file of that step's checkpoint to half its size and kills itself with SIGKILL, before the rename:
a deterministic "killed in the middle of writing" (tests/test_reliability.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

from lightning.pytorch import Callback

CHECKPOINT_RE = re.compile(r"^step_(\d+)\.ckpt$")
CRASH_ENV = "HACRL_CRASH_IN_CHECKPOINT"


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:07d}.ckpt"


def save_atomically(trainer, path: Path) -> Path:
    """`trainer.save_checkpoint` into `<path>.partial`, then rename (a collective: call on all ranks)."""
    partial = path.with_name(path.name + ".partial")
    if trainer.is_global_zero and partial.exists():
        shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
    trainer.strategy.barrier()
    trainer.save_checkpoint(str(partial), weights_only=False)  # optimizers and callback states too
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        _fsync_tree(partial)
        _crash_hook(partial)
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        os.replace(partial, path)
        _fsync_dir(path.parent)
    trainer.strategy.barrier()
    return path


def _fsync_tree(path: Path) -> None:
    """Flush a checkpoint file, or every file of a distributed checkpoint directory, to disk."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        with open(file, "rb+") as handle:
            os.fsync(handle.fileno())


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def latest_checkpoint(location: str | os.PathLike) -> Path:
    """A checkpoint file/dir as given, or the newest complete `step_*.ckpt` in a run dir or its checkpoints/."""
    location = Path(location)
    if CHECKPOINT_RE.match(location.name) or location.suffix == ".ckpt":
        if not location.exists():
            raise FileNotFoundError(f"resume={str(location)!r}: no such checkpoint")
        return location
    for directory in (location / "checkpoints", location):
        found = sorted((p for p in directory.glob("step_*.ckpt") if CHECKPOINT_RE.match(p.name)),
                       key=lambda p: int(CHECKPOINT_RE.match(p.name).group(1)))
        if found:
            return found[-1]
    raise FileNotFoundError(f"resume={str(location)!r}: no complete checkpoint (step_*.ckpt) in it or in its "
                            "checkpoints/ folder; give a run directory that saved one, or a .ckpt path")


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to (`<run>/checkpoints/step_*.ckpt` -> `<run>`)."""
    parent = checkpoint.resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


class StepCheckpoint(Callback):
    """Save every `every` training steps (0: only at the end) into `directory`, keeping the newest `keep`."""

    def __init__(self, directory: str | os.PathLike, *, every: int, keep: int = 3):
        self.directory = Path(directory)
        self.every = every
        self.keep = keep

    def _save(self, trainer, pl_module) -> None:
        step = pl_module.steps_done
        path = checkpoint_path(self.directory, step)
        if path.exists():
            return
        if trainer.is_global_zero:
            self.directory.mkdir(parents=True, exist_ok=True)
        save_atomically(trainer, path)
        if trainer.is_global_zero:
            old = sorted(p for p in self.directory.glob("step_*.ckpt") if CHECKPOINT_RE.match(p.name))
            for stale in old[: max(0, len(old) - self.keep)]:
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every and pl_module.steps_done % self.every == 0:
            self._save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, pl_module)
