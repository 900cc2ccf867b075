"""Where an agent's files come from: a hub id, a local directory, or a prefixed source such as `zoo:<preset>`.

`resolve_source` turns a source into what `from_pretrained` reads: a hub id or a directory as it is,
and `<prefix><name>` into a local directory by the resolver registered for the prefix
(`register_resolver`). The offline zoo registers `zoo:` (`zoo.py`, imported by
`hacrl_lightning.agents`, so it is registered before any agent can be loaded): the zoo builds agents,
and this registry is what lets `Agent.load` use it without `agent.py` and `zoo.py` importing each
other. `fetch` loads from a local directory, the local Hugging Face cache, or the hub after a quick
probe, and words every failure as an `AgentLoadError` with the fix.
Deliberately not here: the agent itself (`agent.py`) and building anything (`zoo.py`).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict

HUB_PROBE_TIMEOUT_S = 10.0
"""How long to wait for the hub before giving up on a model that is not in the local HF cache."""

Resolver = Callable[[str, "str | os.PathLike | None"], str]
"""(name after the prefix, zoo cache or None) -> a local directory; raises KeyError for an unknown name."""
_RESOLVERS: Dict[str, Resolver] = {}


class AgentLoadError(RuntimeError):
    """An agent could not be loaded; the message names the agent, the source and the fix."""


def register_resolver(prefix: str, resolver: Resolver) -> None:
    """Resolve sources starting with `prefix` (e.g. `zoo:`) with `resolver`; registering it again replaces it."""
    _RESOLVERS[prefix] = resolver


def resolve_source(agent: str, source: str, *, key: str, zoo_cache: str | os.PathLike | None) -> str:
    """A registered prefix's source (`zoo:<preset>`) -> its local directory (built if needed); anything
    else unchanged. An unknown name under a known prefix raises AgentLoadError naming the key."""
    for prefix, resolver in _RESOLVERS.items():
        if source.startswith(prefix):
            try:
                return str(resolver(source[len(prefix):], zoo_cache))
            except KeyError as error:
                raise AgentLoadError(f"agent {agent!r}: {key}={source!r}: {error.args[0]}") from None
    return source


def looks_like_path(source: str) -> bool:
    """A local path (absolute, relative with ./ or ~, or an existing directory) rather than a hub id."""
    return source.startswith(("/", "./", "../", "~", ".\\")) or os.path.isdir(os.path.expanduser(source))


def _hub_offline() -> bool:
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(flag.strip().upper() in ("1", "ON", "YES", "TRUE") for flag in flags)


def _probe_hub(repo_id: str, revision: str | None, timeout: float) -> str | None:
    """None when the hub answers for `repo_id` within `timeout` seconds, else why not."""
    from huggingface_hub import HfApi

    outcome: list[str | None] = []

    def probe() -> None:
        try:
            HfApi().model_info(repo_id, revision=revision, timeout=timeout)
            outcome.append(None)
        except Exception as error:  # any failure means "do not start a download"
            outcome.append(f"{type(error).__name__}: {error}".splitlines()[0][:300])

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo ignores socket timeouts
    thread.start()
    thread.join(timeout + 1.0)
    return outcome[0] if outcome else f"no answer within {timeout:.0f} s"


def fetch(loader: Callable[..., Any], source: str, *, agent: str, key: str, **kwargs) -> Any:
    """`loader.from_pretrained(source)`: a local dir directly; a hub id from the local HF cache, or
    from the hub only after a quick probe says it is reachable (no minutes of download retries)."""
    if looks_like_path(source):
        path = os.path.expanduser(source)
        if not os.path.isdir(path):
            raise AgentLoadError(
                f"agent {agent!r}: {key}={source!r} is not a directory. Fix: point {key} at a directory "
                f"holding config.json and the weights (e.g. one written by `huggingface-cli download` or Agent.export)."
            )
        return loader(path, **kwargs)
    try:
        return loader(source, local_files_only=True, **kwargs)
    except OSError:
        pass  # not (completely) in the local HF cache
    why = "the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)" if _hub_offline() else \
        _probe_hub(source, kwargs.get("revision"), HUB_PROBE_TIMEOUT_S)
    if why is not None:
        raise AgentLoadError(
            f"agent {agent!r}: {key}={source!r} is not in the local Hugging Face cache and cannot be fetched "
            f"({why}). Fix: download it where the hub is reachable (`huggingface-cli download {source} "
            f"--local-dir /path/to/dir`), copy the directory here and point the preset at it: {key}=/path/to/dir"
        )
    return loader(source, **kwargs)
