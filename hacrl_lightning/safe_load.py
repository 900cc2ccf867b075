"""Reading files that someone else may have written (checkpoints, YAML) without running their code.

A `.ckpt` file is a pickle, and unpickling can call any function the file names: `torch.load(...,
weights_only=False)` on a hostile checkpoint runs its program. Every read of a checkpoint in the project goes
through here: `load_checkpoint_file` uses torch's `weights_only=True` unpickler (tensors, numbers, strings and
containers only; the project's own checkpoints hold nothing else, and Lightning's own `fit(ckpt_path=...)`
reads them the same way), and `check_distributed_checkpoint` reads the one pickle of an FSDP2 checkpoint
directory that torch itself reads with a plain `pickle.load` (`.metadata`) with an unpickler that knows only
the classes torch writes there, before anything else opens it. A refused file raises `UnsafeCheckpoint`,
naming the file, what it tried to load and the fix; a pickle the weights-only reader cannot parse (an opcode it does
not support: another program's file, a newer pickle protocol, bytes damaged) raises `UnreadableCheckpoint`, one line
naming the file, the reader's words and the fix. `read_yaml` reads an agent, data or run config file as
plain values (OmegaConf's safe loader: a `!!python` tag is refused) and turns a syntax error, a tag or a
file that is not UTF-8 into one `ConfigError` line naming the file, line and column.
Deliberately not here: which checkpoint to read (`callbacks/checkpoint.py`) and model folders (the agents'
`trust_remote_code` rule, `docs/reliability.md §10`).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

from hacrl_lightning.errors import ConfigError, Problem

__all__ = ["UnreadableCheckpoint", "UnsafeCheckpoint", "check_distributed_checkpoint", "load_checkpoint_file", "read_yaml", "yaml_problem"]


class UnsafeCheckpoint(ValueError):
    """A checkpoint holds more than tensors and plain data (a pickle that would run code when read); nothing of
    it was run."""

    def __init__(self, path: str | os.PathLike, what: str):
        super().__init__(
            f"{path}: refused: it holds {what}, not only tensors and plain data; loading it would run code that "
            "came with the file, and nothing of it was run. Fix: use a checkpoint written by this project "
            "(scripts/train.py), or convert a trusted file yourself with torch.load(..., weights_only=False) and "
            "torch.save of its tensors")
        self.path = Path(path)


class UnreadableCheckpoint(ValueError):
    """A checkpoint's pickle that torch's weights-only reader cannot parse (an unsupported opcode, a protocol it does
    not read): not a checkpoint this project wrote, or damaged; nothing of it was run. A `ValueError`, so a run
    directory's newest checkpoint that is unreadable is skipped as damage (`callbacks.checkpoint.damage`)."""

    def __init__(self, path: str | os.PathLike, why: str):
        super().__init__(
            f"{path}: not readable as a checkpoint: torch's weights-only reader stops at {why}; nothing of it was run. "
            "Fix: give a checkpoint written by this project (scripts/train.py), or copy the file again if it was cut "
            "or damaged in transit; a trusted file from another program can be converted with "
            "torch.load(..., weights_only=False) and torch.save of its tensors")
        self.path = Path(path)


REFUSED = re.compile(r"(?:Unsupported|unsupported) (?:global|GLOBAL)[: ]*(?:GLOBAL )?([\w.]+)|GLOBAL ([\w.]+)")
"""How torch's weights-only unpickler says a file named a global it will not build (`Unsupported global: GLOBAL
posix.system`, `Trying to load unsupported GLOBAL posix.system`): the file would run code. Other errors of
the same kind (a file cut short) are damage, not danger."""


def load_checkpoint_file(path: str | os.PathLike | io.BytesIO, *, mmap: bool = False, name: str | None = None
                         ) -> dict[str, Any]:
    """`torch.load` of a checkpoint file (or bytes) with `weights_only=True`, on the CPU; `UnsafeCheckpoint` when
    it names a global torch will not build, `UnreadableCheckpoint` when its pickle does not parse (an unsupported
    opcode); other errors (a zip archive cut short, say) pass through."""
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as err:
        named = REFUSED.search(str(err))
        if named is None:
            said = str(err).split("WeightsUnpickler error:")[-1].strip().splitlines()
            raise UnreadableCheckpoint(name or path, f"'{said[0]}'" if said else type(err).__name__) from None
        raise UnsafeCheckpoint(name or path, f"a reference to {named.group(1) or named.group(2)}") from None


_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "TensorStorageMetadata",
                                              "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo", "_StoragePrefix", "SerializationFormat"},
    "torch.distributed.checkpoint.storage": {"WriteResult"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "collections": {"OrderedDict"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "builtins": {"set", "frozenset", "slice", "complex"},
}
"""Exactly what `torch.distributed.checkpoint` writes into `.metadata`: its own dataclasses and enums, torch's
sizes, dtypes, layouts and memory formats, paths and plain containers. Names are matched whole: a dotted name
(`metadata` + `os.system`, which pickle would follow through the module's own imports) never matches."""


def _torch_constant(module: str, name: str) -> bool:
    """A dtype, layout or memory format of torch (`torch.float32`, `torch.strided`, `torch.contiguous_format`)."""
    import torch

    value = getattr(torch, name, None) if module == "torch" and "." not in name else None
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


class _Refused(pickle.UnpicklingError):
    """A global outside `_METADATA_CLASSES` (the only error that means the file would run code)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Knows only `_METADATA_CLASSES` and torch's constants."""

    def find_class(self, module: str, name: str):
        if name in _METADATA_CLASSES.get(module, ()) or _torch_constant(module, name):
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


def check_distributed_checkpoint(directory: str | os.PathLike) -> None:
    """Check an FSDP2 checkpoint directory before torch reads it: its index (`.metadata`, which torch reads
    with a plain `pickle.load`) with `_MetadataUnpickler`, then every non-tensor item the index lists (torch
    reads those with `torch.load(weights_only=False)`) with `weights_only=True`, each within the directory.
    `UnsafeCheckpoint` naming the file when one asks for anything else; a file cut short or missing is left
    to the reader's own error (damage, not danger). A directory without an index: the reader's error too."""
    directory = Path(directory)
    path = directory / ".metadata"
    if not path.is_file():
        return
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except _Refused as err:
        raise UnsafeCheckpoint(path, f"a reference to {err}") from None
    except Exception:  # noqa: BLE001 - a cut-short or garbled index is damage: the reader words it
        return
    _check_byte_items(directory, metadata)
    extra = directory / "meta.pt"  # Lightning's non-tensor state beside the shards
    if extra.is_file():
        load_checkpoint_file(extra)


def _check_byte_items(directory: Path, metadata: Any) -> None:
    """Every `BytesStorageMetadata` item of the index: its bytes inside the directory, read with
    `weights_only=True`."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    items = getattr(metadata, "state_dict_metadata", {}) or {}
    storage = getattr(metadata, "storage_data", {}) or {}
    root = directory.resolve()
    for index, info in storage.items():
        if not isinstance(items.get(getattr(index, "fqn", None)), BytesStorageMetadata):
            continue
        shard = (directory / str(info.relative_path)).resolve()
        if root not in shard.parents:
            raise UnsafeCheckpoint(directory / ".metadata", f"a shard outside the checkpoint ({info.relative_path})")
        if getattr(info, "transform_descriptors", None):
            raise UnsafeCheckpoint(shard, f"item {index.fqn} stored through {info.transform_descriptors}, which "
                                   "cannot be checked before it is read")
        try:
            with open(shard, "rb") as handle:
                handle.seek(info.offset)
                data = handle.read(info.length)
        except OSError:
            return  # a missing shard is damage: the reader words it
        if len(data) < info.length:
            return
        name = f"{shard} (item {index.fqn})"
        try:
            load_checkpoint_file(io.BytesIO(data), name=name)
        except UnsafeCheckpoint:
            raise
        except Exception as err:  # noqa: BLE001 - torch would read it unchecked (weights_only=False): refused
            why = (str(err).split("WeightsUnpickler error:")[-1].strip().splitlines() or [type(err).__name__])[0]
            raise UnsafeCheckpoint(name, f"data the weights-only reader does not accept ({why})") from None


def read_yaml(path: str | os.PathLike, *, key: str):
    """The DictConfig (or ListConfig) of a YAML file, read as plain values. A file that does not parse, holds a
    tag such as `!!python/object` (which would build objects) or is not UTF-8 raises `ConfigError` with one
    problem under `key`, naming the file, the line and column, and the fix."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(path)
    try:
        return OmegaConf.load(path)
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError([yaml_problem(err, key=key, path=path)]) from None


def yaml_problem(err: Exception, *, key: str, path: str | os.PathLike | None = None) -> Problem:
    """The one-line Problem of a YAML file that does not parse, holds a `!!python` tag or is not UTF-8 (`err`:
    yaml's error, whose mark names the file when `path` is not given, or a UnicodeDecodeError)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    path = Path(path if path is not None else getattr(mark, "name", "") or "<yaml>")
    if isinstance(err, UnicodeDecodeError):
        return Problem(key, str(path), "a UTF-8 text file",
                       f"byte {err.start} is not UTF-8 ({err.reason}): save {path.name} as UTF-8")
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "the file"
    problem = str(getattr(err, "problem", None) or err).splitlines()[0]
    tag = "python/" in str(err)
    allowed = ("plain YAML values (a !!python tag would build Python objects; it is never read)" if tag
               else "a YAML file that parses")
    return Problem(key, str(path), allowed, f"{path.name} {where}: {problem}; "
                   + ("remove the tag" if tag else "fix the YAML there"))
