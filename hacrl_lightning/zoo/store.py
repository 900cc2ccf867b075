"""The zoo's store: the shipped builds (`SHIPPED`), the cache of preset entries (each a standalone Hugging Face
directory with a manifest of checksums, made under a lock in a staging directory and renamed into place), and the
`zoo:<preset>` agent source it registers with `agents.sources`. Deliberately not here: the recipes (`presets.py`)
and building (`builder.py`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hacrl_lightning.agents.cache import file_problems, file_table, files_intact, install, \
    lacks_a_model, lock, remove_stale_staging, resolve_cache_dir
from hacrl_lightning.agents.sources import register_resolver
from hacrl_lightning.errors import ConfigError, Problem
from hacrl_lightning.zoo.builder import build, stats
from hacrl_lightning.zoo.presets import ZOO_FORMAT, ZooSpec, get_spec

MANIFEST = "zoo_manifest.json"
SHIPPED = Path(__file__).resolve().parent / "zoo_weights"
"""The warm-started presets' builds, shipped with the package (`<name>/`: the exported HF directory and
its manifest of checksums). A preset whose recipe matches its shipped build is copied from here, never
rebuilt: a build depends on how this CPU rounds floating-point sums (measured 2026-11-25), the shipped files do not."""


def entry_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    spec = get_spec(name)
    return resolve_cache_dir(cache) / f"{spec.name}-{spec.key()}"


def _write_manifest(directory: Path, spec: ZooSpec, facts: dict[str, Any]) -> None:
    manifest = {"name": spec.name, "key": spec.key(), "format": ZOO_FORMAT,
                "files": file_table(directory, skip=MANIFEST), "facts": facts, "spec": asdict(spec)}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a complete, intact entry (every listed file present with its checksum), else None."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        whole = files_intact(directory, manifest["files"]) and not lacks_a_model(manifest["files"])
        return manifest if whole else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ShippedZooError(RuntimeError):
    """A shipped preset's files disagree with the checksums it shipped with (a damaged install)."""


def shipped_manifest(spec: ZooSpec) -> dict[str, Any] | None:
    """The manifest of the build of `spec` shipped with the package (`SHIPPED/<name>/`) when one ships for
    this very recipe (its key is `spec.key()`), else None (no shipped build, or the recipe changed since:
    then the preset is built here). Raises ShippedZooError when a shipped file fails its checksum."""
    directory = SHIPPED / spec.name
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    if manifest.get("key") != spec.key():
        return None
    if not files_intact(directory, manifest["files"]):
        damaged = [f for f, info in manifest["files"].items() if not files_intact(directory, {f: info})]
        raise ShippedZooError(
            f"the shipped weights of zoo preset {spec.name!r} in {directory} are damaged ({', '.join(damaged)} "
            f"differ from the checksums in {MANIFEST}). Fix: restore them (`git checkout -- {directory}` in a clone, "
            f"or reinstall hacrl-lightning); a rebuild would give another model on another CPU")
    return manifest


def entry_damage(directory: Path, key: str) -> str | None:
    """Why the cache entry `directory` cannot be used: "" when it is not there, None when it is whole,
    else what is wrong (the manifest missing or unreadable, or each file that disagrees with it)."""
    if not directory.exists():
        return ""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        if manifest.get("key") != key:
            return f"{MANIFEST} is for another recipe (key {manifest.get('key')!r}, wanted {key!r})"
        problems = file_problems(directory, manifest["files"])
        if lacks_a_model(manifest["files"]):
            problems.append(f"{MANIFEST} {lacks_a_model(manifest['files'])} (its build wrote no model)")
    except FileNotFoundError:
        return f"{MANIFEST}: missing (its build or copy never finished)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST}: unreadable ({type(err).__name__}: {err})"
    return "; ".join(problems) or None


class ZooCacheError(ConfigError):
    """The zoo cache cannot be written where an entry must be made or redone (a read-only cache)."""


def _cache_unwritable(root: Path, final: Path, damage: str, err: OSError) -> ZooCacheError:
    need = f"its entry {final.name} is damaged ({damage}) and must be redone" if damage else \
        f"its entry {final.name} is not there yet and must be made"
    return ZooCacheError([Problem(
        "zoo_cache", str(root), f"a directory this user can write ({need}; writing failed: {err.strerror or err})",
        f"point the zoo cache at a writable directory: HACRL_ZOO_CACHE=<writable dir> in the environment or "
        f"zoo_cache=<writable dir> on the command line (or make {root} writable)")])


def ensure_built(name: str, *, cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """The directory of preset `name` in the cache: the shipped build copied in (checksums verified) when
    one ships for the preset's recipe, else built here; redone if missing, partial or corrupt (a damaged
    entry is named, with what is wrong with it), after removing staging directories a killed build left.
    Raises ZooCacheError (a ConfigError on `zoo_cache`) when the cache cannot be written where it must be."""
    spec = get_spec(name)
    root = resolve_cache_dir(cache_dir)
    final = root / f"{spec.name}-{spec.key()}"
    if entry_damage(final, spec.key()) is None:
        stats["hits"] += 1
        return final
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        root.mkdir(parents=True, exist_ok=True)
        open(root / f".{final.name}.lock", "a").close()
    except OSError as err:
        raise _cache_unwritable(root, final, entry_damage(final, spec.key()), err) from None
    with lock(root / f".{final.name}.lock"):
        damage = entry_damage(final, spec.key())
        if damage is None:  # made by another process meanwhile
            stats["hits"] += 1
            return final
        for stale in remove_stale_staging(final):
            log(f"[zoo] removed {stale}: the staging directory of a build or copy that was killed mid-way")
        if damage:
            log(f"[zoo] {spec.name}: the cache entry {final} is damaged ({damage}); making it again")
        shipped = shipped_manifest(spec)
        if shipped is not None:
            install(final, lambda staging: _copy_shipped(spec, staging))
            stats["shipped"] += 1
            return final
        if (SHIPPED / spec.name).is_dir():
            log(f"[zoo] {spec.name}: its recipe differs from the build shipped in {SHIPPED / spec.name} (key "
                f"{spec.key()}): building it here, with this CPU's rounding; `python -m hacrl_lightning.zoo "
                f"ship {spec.name}` records a build as the shipped one")
        log(f"[zoo] building {spec.name} into {final} (one time, ~10-80 s on a laptop CPU)")
        facts = install(final, lambda staging: _build_entry(spec, staging, root, log))
        log(f"[zoo] {spec.name}: {facts['parameters']:,} parameters, held-out greedy accuracy "
            f"{_accuracy(facts)}, built in {facts['build_seconds']:.1f} s")
    return final


def _copy_shipped(spec: ZooSpec, staging: Path) -> None:
    """The shipped files, manifest last, each checked against the shipped checksum after the copy."""
    source = SHIPPED / spec.name
    manifest = json.loads((source / MANIFEST).read_text())
    for file in manifest["files"]:
        shutil.copyfile(source / file, staging / file)
    if not files_intact(staging, manifest["files"]):
        raise ShippedZooError(f"copying the shipped {spec.name} into {staging} changed its files; check the disk")
    shutil.copyfile(source / MANIFEST, staging / MANIFEST)


def ship(name: str, *, log=None) -> dict[str, Any]:
    """Build `name` from its recipe and make that build the shipped one (`SHIPPED/<name>/`, replaced
    whole). For a maintainer who changed a recipe; commit the directory with the change."""
    spec = get_spec(name)
    SHIPPED.mkdir(parents=True, exist_ok=True)
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory() as tokenizer_cache:  # registry tokenizers are never shipped
        return install(SHIPPED / spec.name, lambda staging: _build_entry(spec, staging, Path(tokenizer_cache), log))


def verify(name: str, *, log=None) -> list[str]:
    """Build `name` from its recipe here and compare it with the shipped build: the list of differences
    (files, each weight tensor's largest change, held-out accuracy), empty when bit-identical."""
    spec = get_spec(name)
    shipped = shipped_manifest(spec)
    if shipped is None:
        return [f"{name}: no shipped build for its current recipe (key {spec.key()}) in {SHIPPED / name}"]
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / name
        built.mkdir()
        facts = build(spec, built, log=log, cache_dir=Path(tmp) / "cache")
        problems = [f"{name}: {file} differs from the shipped one" for file, info in shipped["files"].items()
                    if not files_intact(built, {file: info})]
        if any("model.safetensors" in p for p in problems):
            from safetensors.torch import load_file

            mine, theirs = load_file(built / "model.safetensors"), load_file(SHIPPED / name / "model.safetensors")
            worst = max(((mine[k] - theirs[k]).abs().max().item(), k) for k in theirs)
            problems.append(f"{name}: largest weight difference {worst[0]:.3g} ({worst[1]}); held-out accuracy "
                            f"{_accuracy(facts)} here, {_accuracy(shipped['facts'])} shipped")
    return problems


ZOO_PREFIX = "zoo:"
"""An agent source `zoo:<preset>` is resolved by `ensure_built` (registered with `sources` below)."""


def _resolve_source(preset: str, cache_dir: str | os.PathLike | None) -> Path:
    return ensure_built(preset, cache_dir=cache_dir)


register_resolver(ZOO_PREFIX, _resolve_source)


def _accuracy(facts: dict[str, Any]) -> str:
    accuracy = facts["heldout_accuracy"]
    return "n/a (random weights)" if accuracy is None else f"{accuracy:.3f}"


def _build_entry(spec: ZooSpec, staging: Path, root: Path, log) -> dict[str, Any]:
    facts = build(spec, staging, log=log, cache_dir=root)
    _write_manifest(staging, spec, facts)
    return facts
