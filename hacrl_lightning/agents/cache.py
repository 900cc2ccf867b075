"""The local cache that zoo builds and fetched tokenizer files share: where it is, and how an entry
is made whole or not at all.

Root: an explicit argument > $HACRL_ZOO_CACHE > ~/.cache/hacrl_lightning/zoo. An entry is a
directory filled in a temporary sibling and renamed into place (`install`), under an exclusive
file lock (`lock`) so two processes do not fill the same entry at once; its owner writes a
manifest last that lists every file with its size and SHA-256 (`file_table`), and an entry whose
files disagree with it (`file_problems` names which and how) is redone, never half-used. A filler
killed mid-way leaves its staging directory; the next filler of that entry, holding its lock, removes
it (`remove_stale_staging`).
Deliberately not here: what goes into an entry (`hacrl_lightning.zoo`, `wheels.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, TypeVar

ENV_CACHE = "HACRL_ZOO_CACHE"
DEFAULT_CACHE = Path("~/.cache/hacrl_lightning/zoo")

T = TypeVar("T")


def resolve_cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The cache root: `cache` if given, else $HACRL_ZOO_CACHE, else ~/.cache/hacrl_lightning/zoo."""
    chosen = cache or os.environ.get(ENV_CACHE) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_table(directory: Path, *, skip: str) -> Dict[str, Dict[str, Any]]:
    """`{file name: {bytes, sha256}}` of the plain files in `directory`, except `skip` (the manifest)."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != skip}


def file_problems(directory: Path, table: Dict[str, Dict[str, Any]]) -> list[str]:
    """What is wrong with each file of `table` in `directory` ("model.safetensors: missing", "...: 10 bytes,
    the manifest says 20", "...: its SHA-256 differs from the manifest's"); raises on a malformed table."""
    problems = []
    for name, info in table.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path.stat().st_size != info["bytes"]:
            problems.append(f"{name}: {path.stat().st_size} bytes, the manifest says {info['bytes']}")
        elif file_digest(path) != info["sha256"]:
            problems.append(f"{name}: its SHA-256 differs from the manifest's")
    return problems


def files_intact(directory: Path, table: Dict[str, Dict[str, Any]]) -> bool:
    """Every file of `table` is in `directory` with its size and checksum (raises on a malformed table)."""
    return not file_problems(directory, table)


def lacks_a_model(table: Dict[str, Dict[str, Any]]) -> str | None:
    """Why a model entry's file table cannot be a model (no `config.json`, no `*.safetensors`: a build or conversion
    on a rank where transformers wrote nothing), else None."""
    missing = [what for what, present in (("config.json", "config.json" in table),
                                          ("weights (*.safetensors)", any(f.endswith(".safetensors") for f in table)))
               if not present]
    return f"lists no {' and no '.join(missing)}" if missing else None


def read_manifest(directory: Path, name: str) -> dict | None:
    """The manifest `name` of a complete, intact entry (every file of its `files` table there with its size and
    checksum), else None."""
    import json

    try:
        manifest = json.loads((directory / name).read_text())
        return manifest if files_intact(directory, manifest["files"]) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def staging_dirs(final: Path) -> list[Path]:
    """The staging directories of entry `final` (`install`'s `.<name>.XXXXXXXX` siblings; not its lock file)."""
    return sorted(p for p in final.parent.glob(f".{final.name}.*") if p.is_dir() and not p.is_symlink())


def remove_stale_staging(final: Path) -> list[Path]:
    """Remove the staging directories a filler of `final` killed mid-way left, and return them. Call it
    holding the entry's `lock`: every filler holds it, so no live process owns one of them then."""
    stale = staging_dirs(final)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (so two processes do not fill the same entry at once)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: fills may race, the rename still keeps entries whole
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(final: Path, fill: Callable[[Path], T]) -> T:
    """`fill(staging)` in a fresh temporary sibling of `final`, then rename it to `final` (replacing a
    partial or corrupt one); on any failure nothing is left but what was there before. Returns fill's value."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        result = fill(staging)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
