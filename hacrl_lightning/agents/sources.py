"""Where an agent's files come from: a hub id, a local directory, or a prefixed source such as `zoo:<preset>`.

`resolve_source` turns a source into what `from_pretrained` reads: a hub id or a directory as it is,
and `<prefix><name>` into a local directory by the resolver registered for the prefix
(`register_resolver`). `SOURCES` is the table of prefixed sources and the package that provides each:
`zoo:` the offline zoo (`hacrl_lightning.zoo`), `pypi:` a model packaged on the index (`packaged.py`). A
provider registers its resolver when imported, and this module imports it, by its name in the table, the
first time a source of its prefix is resolved: the zoo builds agents with the task, the rewards and the
engines, and the table is what lets `Agent.load` use it while nothing in `agents/` imports it. `fetch`
loads from a local directory, the local Hugging Face cache, or the hub after a quick probe, and words
every failure as an `AgentLoadError` with the fix.
Deliberately not here: the agent itself (`agent.py`) and building anything (`hacrl_lightning.zoo`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict

from hacrl_lightning import hub

Resolver = Callable[[str, "str | os.PathLike | None"], str]
"""(name after the prefix, zoo cache or None) -> a local directory; raises KeyError for an unknown name."""
SOURCES: Dict[str, str] = {"zoo:": "hacrl_lightning.zoo", "pypi:": "hacrl_lightning.agents.packaged"}
"""Prefix -> the package that resolves it (imported on first use; it calls `register_resolver`)."""
_RESOLVERS: Dict[str, Resolver] = {}


class AgentLoadError(RuntimeError):
    """An agent could not be loaded; the message names the agent, the source and the fix."""


def register_resolver(prefix: str, resolver: Resolver) -> None:
    """Resolve sources starting with `prefix` (e.g. `zoo:`) with `resolver`; registering it again replaces it."""
    _RESOLVERS[prefix] = resolver


def _resolver(prefix: str) -> Resolver:
    """The resolver of `prefix`, importing its provider (`SOURCES`) the first time."""
    if prefix not in _RESOLVERS:
        import importlib

        importlib.import_module(SOURCES[prefix])
    return _RESOLVERS[prefix]


def resolve_source(agent: str, source: str, *, key: str, zoo_cache: str | os.PathLike | None) -> str:
    """A prefixed source (`zoo:<preset>`) -> its local directory (built if needed); anything else unchanged.
    An unknown name under a known prefix raises AgentLoadError naming the key."""
    for prefix in {**SOURCES, **_RESOLVERS}:
        if source.startswith(prefix):
            resolver = _resolver(prefix)
            try:
                return str(resolver(source[len(prefix):], zoo_cache))
            except KeyError as error:
                raise AgentLoadError(f"agent {agent!r}: {key}={source!r}: {error.args[0]}") from None
    return source


def looks_like_path(source: str) -> bool:
    """A local path (absolute, relative with ./ or ~, or an existing directory) rather than a hub id."""
    return source.startswith(("/", "./", "../", "~", ".\\")) or os.path.isdir(os.path.expanduser(source))


def is_hub_id(source: str) -> bool:
    """A hub id (`Qwen/Qwen3-4B`, `gpt2`): not a local path or file, not a prefixed source (`zoo:`)."""
    return not (looks_like_path(source) or os.path.exists(os.path.expanduser(source)) or source.count("/") > 1
                or any(source.startswith(prefix) for prefix in {**SOURCES, **_RESOLVERS}))


def hub_fix(repo_id: str, setting: str) -> str:
    """How to get a hub model onto a machine that cannot reach the hub, with the installed CLI's
    command; `setting` is the override that then points at the copy (`/path/to/dir` in it)."""
    return (f"download it where the hub is reachable (`{hub.download_hint(repo_id, '/path/to/dir')}`), copy the "
            f"directory here and point at it: {setting}")


try:
    from safetensors import SafetensorError
except ImportError:  # pragma: no cover - safetensors is a dependency of transformers
    SafetensorError = OSError


def fetch(loader: Callable[..., Any], source: str, *, agent: str, key: str, **kwargs) -> Any:
    """`loader.from_pretrained(source)`: a local dir directly; a hub id from the local HF cache, or
    from the hub only after a quick probe says it is reachable (no minutes of download retries)."""
    if looks_like_path(source):
        path = os.path.expanduser(source)
        if not os.path.isdir(path):
            raise AgentLoadError(
                f"agent {agent!r}: {key}={source!r} is not a directory. Fix: point {key} at a directory "
                f"holding config.json and the weights (e.g. one written by `{hub.download_command()}` or Agent.export)."
            )
        try:
            return loader(path, **kwargs)
        except (OSError, ValueError, SafetensorError) as err:  # no weights file, a file cut short, a config that
            # does not parse
            raise AgentLoadError(f"agent {agent!r}: {key}={source!r} does not load ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''}). Fix: point {key} at a complete "
                                 "model directory (config.json, tokenizer, weights); a weights file cut short (a copy "
                                 "or download that stopped) must be copied again") from None
    try:
        return loader(source, local_files_only=True, **kwargs)
    except OSError:
        pass  # not (completely) in the local HF cache
    why = "the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)" if hub.offline(hub.MODEL_OFFLINE) else \
        hub.probe(source, revision=kwargs.get("revision"))
    if why is not None:
        raise AgentLoadError(f"agent {agent!r}: {key}={source!r} is not in the local Hugging Face cache and cannot "
                             f"be fetched ({why}). Fix: {hub_fix(source, f'{key}=/path/to/dir')}")
    return loader(source, **kwargs)
