"""A run directory holds one run: claiming it (a lock, no mixing with another run), and letting it go.

`claim_run_dir` is the first thing `training.train` does. It locks `<run_dir>/.lock` (an advisory
`flock`, released by the operating system even when the process is killed, so a stale lock never
blocks) and then refuses a directory that already holds something, unless the run resumes from it
or the user asked for a fresh run there (`overwrite=true`). A run directory is recognised by what only
a run writes: the `.hacrl_run` marker every claim leaves (or, for a run made before the marker, a
`run_config.json` that holds a training config). `overwrite=true` deletes only the entries a run
writes (`RUN_ENTRIES`) and keeps any other file; a directory that is not a run's is refused
untouched, `overwrite=true` or not. If anything fails before training starts, `RunDir.abandon`
removes the directory again when this claim created it, so no half-made run is left behind.
`lock_directory` is the lock alone, also taken by `scripts/compare.py` on its output directory.
`output_dir_problem` is the rule of the other commands' output folders (evaluate.py's `output_dir`,
compare.py's `out`): a new or empty folder, or one of theirs, else `overwrite=true`. `name_problem` refuses a
path with a name longer than its filesystem allows (255 bytes per name on most) before anything is made.

Only rank zero claims: under data parallelism the other ranks (which Lightning re-launches, or a
cluster launcher starts beside it) write into the directory rank zero holds. Deliberately not here:
what is written into the directory (training, callbacks) and the config comparison of a resume
(`resume.resume_changes`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

from hacrl_lightning.errors import ConfigError, Problem

LOCK_NAME = ".lock"
MARKER_NAME = ".hacrl_run"
"""Written by every claim: the proof that a directory is a run's (a name no other tool writes)."""
RUN_ENTRIES = (MARKER_NAME, "run_config.json", "config.yaml", "config.resumed.yaml", "summary.json", "checkpoints",
               "tensorboard", "exports", "engine_dirs")
"""Everything a run writes in its directory (and `<file>.tmp` while a file is written): what `overwrite=true`
deletes, and nothing else."""


def _shell_argument(key: str, value: str) -> str:
    return shlex.quote(f"{key}={value}")


argument_format = _shell_argument
"""How a message writes a command-line argument `key=value` (one shell word). The CLI layer, which knows
Hydra's quoting, installs its own (`cli.shell_override`) when it is imported; this module stays free of Hydra."""

MARKER_TEXT = ("A hacrl-lightning run directory (scripts/train.py). overwrite=true deletes only what a run "
               f"writes here: {', '.join(RUN_ENTRIES)}; any other file is kept.\n")


@dataclass
class RunDir:
    path: Path
    created: bool
    """This claim created the directory (so abandoning it removes it)."""
    lock: Optional[IO] = None
    marked: bool = False
    """This claim made an empty directory a run's (its marker; abandoning it removes the marker)."""

    def release(self) -> None:
        """Drop the lock (the run is over, whatever its outcome); the directory stays."""
        if self.lock is not None:
            unlock_directory(self.path, self.lock)
            self.lock = None

    def abandon(self) -> None:
        """The run failed before training started: remove the directory if this claim created it."""
        self.release()
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.marked:
            (self.path / MARKER_NAME).unlink(missing_ok=True)


def run_dir_of(checkpoint: str | os.PathLike) -> Path:
    """The run directory a checkpoint belongs to (`<run>/checkpoints/step_*.ckpt` -> `<run>`), found by the
    path's names before any link is followed: a `checkpoints/` that links to another disk is still the run's."""
    path = Path(os.path.abspath(Path(checkpoint).expanduser()))
    if path.is_symlink():  # a link to a checkpoint (`best.ckpt`): the run is where the file is
        path = path.resolve()
    parent = path.parent
    return (parent.parent if parent.name == "checkpoints" else parent).resolve()


def resume_run_dir(resume: str | os.PathLike) -> Path:
    """The run directory that `resume=` names: a checkpoint's run, or the directory given (or the run of a
    `checkpoints/` folder). Paths only: nothing is read."""
    location = Path(resume).expanduser()
    if location.suffix == ".ckpt":
        return run_dir_of(location)
    location = Path(os.path.abspath(location))
    return (location.parent if location.name == "checkpoints" else location).resolve()


def lock_directory(path: Path, *, key: str, what: str) -> IO:
    """Take `<path>/.lock` (an existing directory) for this process: an advisory `flock` the operating system
    drops when the process dies. Raises ConfigError naming `key`, the directory and the holder (its pid, since
    when, and which script) when another process holds it; `what` words the holder in the message."""
    try:
        lock = open(path / LOCK_NAME, "a+")
    except OSError as err:  # a read-only directory, or something else under the lock's name
        raise ConfigError([Problem(key, str(path), "a directory this user can write",
                                   f"cannot open {path / LOCK_NAME} ({err.strerror}): make the directory writable, "
                                   f"or choose another {key}")]) from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ConfigError([Problem(key, str(path), f"a directory no other {what} is using",
                                   f"it is in use by {holder}; wait for that {what} to end, or choose another {key}")]) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')} ({Path(sys.argv[0]).name or 'python'})\n")
    lock.flush()
    return lock


def unlock_directory(path: Path, lock: IO) -> None:
    """Drop a lock `lock_directory` took (its file removed first, so no stale name is left)."""
    (path / LOCK_NAME).unlink(missing_ok=True)
    lock.close()


def is_run_dir(path: Path) -> bool:
    """`path` holds a run: the marker of a claim, or (a run made before the marker) a `run_config.json`
    holding a training config. Generic names (`config.yaml`, `checkpoints/`) prove nothing."""
    if (path / MARKER_NAME).is_file():
        return True
    try:
        saved = json.loads((path / "run_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and {"agents", "algorithm", "trainer"} <= saved.keys()


def run_entries(path: Path) -> tuple[list[str], list[str]]:
    """(the entries of `path` a run wrote, the others), by name; the lock is in neither."""
    written = set(RUN_ENTRIES) | {f"{name}.tmp" for name in RUN_ENTRIES}
    names = sorted(p.name for p in path.iterdir() if p.name != LOCK_NAME)
    return [n for n in names if n in written], [n for n in names if n not in written]


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _mark(path: Path) -> None:
    (path / MARKER_NAME).write_text(MARKER_TEXT)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def name_problem(path: str | os.PathLike, *, key: str = "run_dir") -> Optional[Problem]:
    """The problem with a path one of whose names is longer than its filesystem allows (NAME_MAX of the nearest
    existing folder, 255 bytes where it cannot be asked), or whose whole length is (PATH_MAX); None when it fits."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    existing = next((p for p in (path, *path.parents) if _exists(p)), Path("/"))
    limits = []
    for name, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            limits.append(os.pathconf(existing, name))
        except (OSError, ValueError):
            limits.append(default)
    name_max, path_max = limits
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-12:]}"
            return Problem(key, shown, f"names of at most {name_max} bytes each (the filesystem's limit per path "
                                       "component)",
                           f"the name {shown!r} in it is {size} bytes, too long for the filesystem; nothing was "
                           f"made: choose a {key} with a shorter name")
    if len(os.fsencode(str(path))) + 64 > path_max:  # room for the run's own files inside it
        return Problem(key, f"{str(path)[:40]}...", f"a path of at most {path_max - 64} bytes",
                       f"it is {len(os.fsencode(str(path)))} bytes, too long for the files a run writes inside it; "
                       f"nothing was made: choose a shorter {key}")
    return None


def claim_run_dir(path: str | os.PathLike, *, resuming: bool, overwrite: bool, rank: int = 0) -> RunDir:
    """Lock `path` for this run and check that it may be written; raises ConfigError naming the fix.

    `resuming`: the run continues the one in `path` (its checkpoint is there); `overwrite`: the user
    asked for a fresh run in place of the one there. Ranks other than zero only get the path."""
    too_long = name_problem(path)
    if too_long:
        raise ConfigError([too_long])
    path = Path(path).resolve()
    if rank != 0:
        return RunDir(path, created=False)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError([Problem("run_dir", str(path), "a directory this user can create and write",
                                   f"choose another run_dir ({err.strerror})")]) from None
    lock = lock_directory(path, key="run_dir", what="run")
    claim = RunDir(path, created=created, lock=lock)
    contents = sorted(p.name for p in path.iterdir() if p.name not in (LOCK_NAME, MARKER_NAME))
    if resuming or not contents:  # (a marker alone: a claim that ended before it wrote anything)
        claim.marked = not contents
        _mark(path)
        return claim
    if not is_run_dir(path):
        claim.release()
        raise ConfigError([Problem("overwrite" if overwrite else "run_dir", "true" if overwrite else str(path),
                                   "a new or empty directory, or a run's directory (one holding .hacrl_run)",
                                   f"run_dir={path} holds other files ({_listed(contents)}), not a run; nothing was "
                                   "changed: choose another run_dir (a new one is made)")])
    if not overwrite:
        claim.release()
        raise ConfigError([Problem("run_dir", str(path), "an empty or new directory",
                                   f"it already holds a run ({_listed(contents)}); to continue it: "
                                   f"{argument_format('resume', str(path))}; to replace it (the run's files are "
                                   "deleted, any other file is kept): overwrite=true; or choose another run_dir")])
    written, kept = run_entries(path)
    for name in written:
        target = path / name
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    if kept:
        print(f"overwrite: deleted the previous run's {_listed(written)}; kept {_listed(kept)} (not written by a run)",
              file=sys.stderr)
    _mark(path)
    return claim


def output_dir_problem(path: str | os.PathLike, *, key: str, overwrite: bool, owned: bool = False,
                       writes: str) -> Optional[Problem]:
    """The problem with writing a command's outputs (`writes`, e.g. "results.json and results.md") into `path`:
    None when it is new or empty, `owned` (the command's own folder, which it continues), or the user said
    `overwrite=true` (then only the command's own files in it are replaced); else it holds someone's files
    and is refused untouched. A path that is a file, or a folder this user cannot write, is refused too."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return Problem(key, str(path), "a folder (new, or empty)", f"{path} is a file: choose another {key}")
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            return Problem(key, str(path), "a folder this user can create",
                           f"{parent} is not writable: choose another {key}")
        return None
    if not os.access(path, os.W_OK | os.X_OK):
        return Problem(key, str(path), "a folder this user can write", f"it is read-only: choose another {key}")
    contents = sorted(p.name for p in path.iterdir())
    if not contents or owned or overwrite:
        return None
    return Problem(key, str(path), f"a new or empty folder (this command writes {writes} into it)",
                   f"it already holds {_listed(contents)}; nothing was changed: choose another {key}, or add "
                   f"overwrite=true to replace this command's own files there (any other file is kept)")


def linked_exports_problem(path: str | os.PathLike, *, export_agents: bool) -> Optional[Problem]:
    """A run exports its agents into `<run>/exports/<agent>`, replacing what is there: through an `exports` that
    is a link, that would replace folders outside the run (someone's model folder of the same name). Refused
    (the link and its target untouched) when the run exports; `checkpoints/` may be a link (another disk)."""
    exports = Path(path) / "exports"
    if not export_agents or not exports.is_symlink():
        return None
    return Problem("run_dir", str(path), "a run directory whose exports/ is a folder of the run (not a link)",
                   f"{exports} links to {os.path.realpath(exports)}, and an export replaces same-named folders "
                   "there; nothing was changed: remove the link (its target is kept) and copy the exports where "
                   "you want them after the run, or set trainer.export_agents=false")


def live_holder(path: str | os.PathLike) -> Optional[str]:
    """Who holds the run directory `path`: its `.lock` line (`pid N since ... (train.py)`) when that process is
    alive, else None. Only reads: taking the lock, even for a moment, could refuse a run starting then."""
    try:
        holder = (Path(path) / LOCK_NAME).read_text().strip()
        words = holder.split()
        if len(words) > 1 and words[0] == "pid" and words[1].isdigit():
            try:
                os.kill(int(words[1]), 0)
            except PermissionError:  # alive, another user's
                pass
            return holder
    except (OSError, ValueError):  # no lock file, or its process is gone (a killed run leaves the file)
        pass
    return None
