"""A run directory holds one run: claiming it (a lock, no mixing with another run), and letting it go.

`claim_run_dir` is the first thing `training.train` does. It locks `<run_dir>/.lock` (an advisory
`flock`, released by the operating system even when the process is killed, so a stale lock never
blocks) and then refuses a directory that already holds something, unless the run resumes from it
or the user asked for a fresh run there (`overwrite=true`, which removes the old contents, and only
in a directory that looks like a run). If anything fails before training starts, `RunDir.abandon`
removes the directory again when this claim created it, so no half-made run is left behind.

Only rank zero claims: under data parallelism the other ranks (which Lightning re-launches, or a
cluster launcher starts beside it) write into the directory rank zero holds. Deliberately not here:
what is written into the directory (training, callbacks) and the config comparison of a resume
(`preflight.resume_problems`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

from hacrl_lightning.errors import ConfigError, Problem

LOCK_NAME = ".lock"
RUN_MARKERS = ("run_config.json", "config.yaml", "summary.json", "checkpoints", "tensorboard")
"""What a hacrl run directory holds; `overwrite=true` only clears a directory with one of these."""


@dataclass
class RunDir:
    path: Path
    created: bool
    """This claim created the directory (so abandoning it removes it)."""
    lock: Optional[IO] = None

    def release(self) -> None:
        """Drop the lock (the run is over, whatever its outcome); the directory stays."""
        if self.lock is not None:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            self.lock.close()
            self.lock = None

    def abandon(self) -> None:
        """The run failed before training started: remove the directory if this claim created it."""
        self.release()
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)


def run_dir_of(checkpoint: str | os.PathLike) -> Path:
    """The run directory a checkpoint belongs to (`<run>/checkpoints/step_*.ckpt` -> `<run>`)."""
    parent = Path(checkpoint).resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def resume_run_dir(resume: str | os.PathLike) -> Path:
    """The run directory that `resume=` names: a checkpoint's run, or the directory given (or the run of a
    `checkpoints/` folder). Paths only: nothing is read."""
    location = Path(resume).expanduser()
    if location.suffix == ".ckpt":
        return run_dir_of(location)
    location = location.resolve()
    return location.parent if location.name == "checkpoints" else location


def claim_run_dir(path: str | os.PathLike, *, resuming: bool, overwrite: bool, rank: int = 0) -> RunDir:
    """Lock `path` for this run and check that it may be written; raises ConfigError naming the fix.

    `resuming`: the run continues the one in `path` (its checkpoint is there); `overwrite`: the user
    asked for a fresh run in place of the one there. Ranks other than zero only get the path."""
    path = Path(path).resolve()
    if rank != 0:
        return RunDir(path, created=False)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError([Problem("run_dir", str(path), "a directory this user can create and write",
                                   f"choose another run_dir ({err.strerror})")]) from None
    lock = open(path / LOCK_NAME, "a+")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ConfigError([Problem("run_dir", str(path), "a directory no other run is using",
                                   f"it is in use by {holder}; wait for that run to end, or choose another run_dir")]) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    lock.flush()
    claim = RunDir(path, created=created, lock=lock)
    contents = sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)
    if not contents or resuming:
        return claim
    if not overwrite:
        claim.release()
        shown = ", ".join(contents[:4]) + (", ..." if len(contents) > 4 else "")
        raise ConfigError([Problem("run_dir", str(path), "an empty or new directory",
                                   f"it already holds a run ({shown}); to continue it: resume={path}; to replace it "
                                   "(its contents are deleted): overwrite=true; or choose another run_dir")])
    if not any(name in RUN_MARKERS for name in contents):
        claim.release()
        raise ConfigError([Problem("overwrite", "true", "a run_dir that holds a previous run (run_config.json, checkpoints/, ...)",
                                   f"run_dir={path} holds other files ({', '.join(contents[:4])}); choose another run_dir")])
    for name in contents:
        target = path / name
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    return claim
