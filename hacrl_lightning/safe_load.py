"""Reading files that someone else may have written (checkpoints, YAML) without running their code.

A `.ckpt` file is a pickle, and unpickling can call any function the file names: `torch.load(...,
weights_only=False)` on a hostile checkpoint runs its program. Every read of a checkpoint in the project goes
through here: `load_checkpoint_file` uses torch's `weights_only=True` unpickler (tensors, numbers, strings and
containers only; the project's own checkpoints hold nothing else, and Lightning's own `fit(ckpt_path=...)`
reads them the same way), and `check_distributed_checkpoint` reads the one pickle of an FSDP2 checkpoint
directory that torch itself reads with a plain `pickle.load` (`.metadata`) with an unpickler that knows only
the classes torch writes there, before anything else opens it. A refused file raises `UnsafeCheckpoint`,
naming the file, what it tried to load and the fix. `read_yaml` reads an agent, data or run config file as
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

__all__ = ["UnsafeCheckpoint", "check_distributed_checkpoint", "load_checkpoint_file", "read_yaml", "yaml_problem"]


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


def load_checkpoint_file(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """`torch.load` of a checkpoint file with `weights_only=True`, on the CPU; `UnsafeCheckpoint` when the file
    asks for anything else (other errors, a truncated file say, pass through)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only load failed" not in str(err).lower() and "weights_only" not in str(err):
            raise
        named = re.search(r"GLOBAL ([\w.]+)", str(err))
        raise UnsafeCheckpoint(path, f"a reference to {named.group(1)}" if named else "Python objects") from None


_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                     "torch.distributed.checkpoint.storage", "torch.distributed.checkpoint._extension")
_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                     ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                     ("pathlib", "PureWindowsPath"), ("builtins", "set"), ("builtins", "frozenset"),
                     ("builtins", "slice"), ("builtins", "complex")}


def _torch_constant(module: str, name: str) -> bool:
    """A dtype, layout or memory format of torch (`torch.float32`, `torch.strided`, `torch.contiguous_format`)."""
    import torch

    value = getattr(torch, name, None) if module == "torch" else None
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))


class _MetadataUnpickler(pickle.Unpickler):
    """Knows only what `torch.distributed.checkpoint` writes into `.metadata`: its own dataclasses, torch's
    sizes, dtypes and layouts, paths and plain containers."""

    def find_class(self, module: str, name: str):
        if (module in _METADATA_MODULES and not name.startswith("__")) or (module, name) in _METADATA_GLOBALS \
                or _torch_constant(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def check_distributed_checkpoint(directory: str | os.PathLike) -> None:
    """Read `directory/.metadata` (an FSDP2 checkpoint's index, a pickle that torch reads with `pickle.load`)
    with `_MetadataUnpickler`; `UnsafeCheckpoint` naming the file when it names anything else. A directory
    without one is left to the reader's own error."""
    path = Path(directory) / ".metadata"
    if not path.is_file():
        return
    try:
        _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpoint(path, f"a reference to {err}") from None
    extra = Path(directory) / "meta.pt"  # Lightning's non-tensor state beside the shards
    if extra.is_file():
        load_checkpoint_file(extra)


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
