"""Durable writes: a file is either its old whole self or its new whole self, even across a crash.

`write_atomically` writes a text or bytes file to `<name>.tmp` in the same directory, flushes and
fsyncs it, renames it over the target (`os.replace`, atomic on POSIX) and fsyncs the directory, so
a reader never sees half a file and a crash never leaves an empty one; a write that fails (a full
disk) removes the `.tmp` again and re-raises. `replace_durably` is the last two steps, for a file or
directory written some other way (a checkpoint's `.partial`, `callbacks/checkpoint.py`), after
`fsync_tree` has flushed it. Every file the package writes atomically goes through here.
Deliberately not here: what is written, where, and what a failed write means to the run (the callers).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "replace_durably", "write_atomically"]


def write_atomically(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (str: UTF-8) to `path` durably and atomically (module docstring); returns the path."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        replace_durably(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk (or a signal mid-write): leave no partial .tmp behind
        raise
    return path


def replace_durably(source: Path, target: Path) -> None:
    """Rename `source` over `target` (same directory, atomic) and make the rename durable."""
    os.replace(source, target)
    fsync_dir(target.parent)


def fsync_tree(path: Path) -> None:
    """Flush a file, or every file of a directory tree (a distributed checkpoint), to disk."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        with open(file, "rb+") as handle:
            os.fsync(handle.fileno())


def fsync_dir(directory: Path) -> None:
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
