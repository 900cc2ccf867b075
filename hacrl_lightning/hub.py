"""The Hugging Face hub as this machine sees it: is a repo in the local cache, does the hub answer
(a quick probe), and the download command the installed `huggingface_hub` ships.

`missing_from_hub(repos)` checks many repos at once (the probes run side by side, so N unreachable
repos cost one timeout, not N) and says, per repo, why it cannot be had; this is what lets the
preflight name every missing model and benchmark in one error. `download_command` words the fix
with the command line that is really installed: `hf download` (huggingface_hub >= 0.34) or, in
older versions, `huggingface-cli download`. Deliberately not here: loading anything (`agents/`,
`data/benchmarks.py`) and the wording of problems (`preflight.py`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional

PROBE_TIMEOUT_S = 10.0
"""How long to wait for the hub before calling a repo that is not in the local cache unreachable."""
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
"""A cached model has its config.json and one of these (a single file or a shard index)."""
MODEL_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DATASET_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
"""The environment flags that switch the hub off for models / for datasets."""


def offline(flags: Iterable[str]) -> bool:
    """True when one of the environment `flags` switches the hub off (1 / ON / YES / TRUE)."""
    return any(os.environ.get(flag, "").strip().upper() in ("1", "ON", "YES", "TRUE") for flag in flags)


def download_command() -> str:
    """The download command of the installed huggingface_hub: `hf download`, or `huggingface-cli
    download` where only the old CLI is shipped."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        scripts = {e.name for e in distribution("huggingface-hub").entry_points if e.group == "console_scripts"}
    except PackageNotFoundError:
        scripts = set()
    return "huggingface-cli download" if "hf" not in scripts and "huggingface-cli" in scripts else "hf download"


def download_hint(repo_id: str, local_dir: str, *, repo_type: str = "model") -> str:
    """The command line that downloads `repo_id` into `local_dir` (`hf download Qwen/Qwen3-4B --local-dir /models/x`)."""
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    return f"{download_command()} {repo_id}{kind} --local-dir {local_dir}"


def model_cached(repo_id: str, revision: Optional[str] = None) -> bool:
    """True when the local HF cache holds the model's config.json and its weights (or their index)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, filename, revision=revision), str)

    return cached("config.json") and any(cached(name) for name in WEIGHT_FILES)


def probe(repo_id: str, *, repo_type: str = "model", revision: Optional[str] = None,
          timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """None when the hub answers for `repo_id` within `timeout` seconds, else why not."""
    from huggingface_hub import HfApi

    outcome: list[Optional[str]] = []

    def ask() -> None:
        try:
            info = HfApi().model_info if repo_type == "model" else HfApi().dataset_info
            info(repo_id, revision=revision, timeout=timeout)
            outcome.append(None)
        except Exception as error:  # any failure means "do not start minutes of download retries"
            outcome.append(f"{type(error).__name__}: {error}".splitlines()[0][:300])

    thread = threading.Thread(target=ask, daemon=True)  # getaddrinfo ignores socket timeouts
    thread.start()
    thread.join(timeout + 1.0)
    return outcome[0] if outcome else f"no answer within {timeout:.0f} s"


def missing_from_hub(repos: Iterable[tuple[str, str, Optional[str]]], *,
                     timeout: float = PROBE_TIMEOUT_S) -> dict[tuple[str, str, Optional[str]], str]:
    """(repo_id, repo_type, revision) -> why it cannot be had, for every repo that is neither in the
    local cache (models) nor reachable; all probes run at once. With the hub switched off
    (HF_HUB_OFFLINE ...) a model outside the cache is missing and a dataset is left to `datasets`
    (its own cache is not the hub's)."""
    missing: dict[tuple[str, str, Optional[str]], str] = {}
    todo = []
    for repo in dict.fromkeys(repos):
        if repo[1] == "model" and model_cached(repo[0], repo[2]):
            continue
        if offline(MODEL_OFFLINE if repo[1] == "model" else DATASET_OFFLINE):
            if repo[1] == "model":
                missing[repo] = "it is not in the local cache and the hub is switched off (HF_HUB_OFFLINE)"
            continue  # a dataset: `datasets` reads its own cache
        todo.append(repo)
    if todo:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            answers = pool.map(lambda r: probe(r[0], repo_type=r[1], revision=r[2], timeout=timeout), todo)
            missing.update({r: f"the hub is unreachable: {why}" for r, why in zip(todo, answers) if why is not None})
    return missing
