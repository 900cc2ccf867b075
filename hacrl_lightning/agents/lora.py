"""LoRA agents (`agents.<key>.lora`, docs/training.md#lora): a model wrapped by `peft`, and its weights as a
deployment and a vLLM engine see them.

`apply_lora` wraps a loaded causal LM (the base frozen, an adapter B·A on each target module, B = 0 so the
wrapped model starts equal to the base); a target the model lacks is refused naming the linear layers it has, and
a rank above the targeted layers' width (`lora_width`) naming the limit.
`served_items` turns a LoRA model's state dict into the base model's names and weights (W + B·A·alpha/rank,
in fp32, one module at a time): what an export writes and what `rollout.weight_sync` pushes to an engine.
`save_adapter` writes the adapter alone (peft's directory, and `hacrl_base.json`: which base it was trained on) and
`load_adapter_dir` reads one back onto its base, refusing a malformed folder or another base in one line.
`is_lora` asks without importing peft (seconds), so runs without LoRA never load it.

Deliberately not here: when adapters are applied (`Agent.load`), the KL reference with the adapter off
(`HACRLModule`), the engines' LoRA requests (`rollout/vllm.py`).
"""

from __future__ import annotations

import json
import sys
import warnings
import zlib
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from hacrl_lightning.config import LORA_TARGETS_ALL, LoraConfig

__all__ = ["ADAPTER_DIR", "LoraTargetError", "adapter_disabled", "adapter_state_dict", "apply_lora", "is_lora", "load_adapter_dir",
           "lora_targets", "lora_width", "require_peft", "save_adapter", "served_items", "served_state_dict", "trainable_parameters"]

ADAPTER_DIR = "adapter"
"""An export of a LoRA agent holds its adapter alone (peft's files) in this subdirectory."""
PEFT_PREFIX = "base_model.model."


class LoraTargetError(ValueError):
    """`lora.target_modules` names a module the model does not have, or one that is not a linear layer; or
    `lora.rank` is above the width of the layers it targets."""


def require_peft():
    """peft, or one line saying how to get it."""
    try:
        import peft
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise ImportError("LoRA agents need the `peft` package: pip install peft (a dependency of hacrl-lightning: "
                          "pip install -e . installs it)") from err
    return peft


def is_lora(model: nn.Module) -> bool:
    """Whether `model` is a peft model (without importing peft: a run without LoRA never loads it)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def linear_names(model: nn.Module) -> list[str]:
    """The last name part of every linear layer of `model` (GPT-2's `Conv1D` too) but its output layer, sorted
    (what targets can name)."""
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, (nn.Linear, Conv1D)) and module is not output})


def lora_targets(model: nn.Module, lora: LoraConfig, *, key: str) -> list[str] | str:
    """peft's `target_modules` for `lora.target_modules` on `model` (`all-linear` as peft spells it); refuses a
    name that is no linear layer of the model's blocks, naming those it has."""
    targets = list(lora.target_modules)
    if targets == [LORA_TARGETS_ALL]:
        return LORA_TARGETS_ALL
    have = linear_names(model)
    missing = [t for t in targets if t == LORA_TARGETS_ALL or t.rsplit(".", 1)[-1] not in have]
    if missing:
        raise LoraTargetError(f"{key}.target_modules: {missing} {'is' if len(missing) == 1 else 'are'} not among this "
                              f"model's linear layers {have}. Fix: name some of those, or [{LORA_TARGETS_ALL}] alone")
    return targets


def lora_width(model: nn.Module, targets: list[str] | str) -> tuple[int, list[str]]:
    """(the fewest in or out features of the layers `targets` adapt, their names): the largest useful rank."""
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    wanted = None if targets == LORA_TARGETS_ALL else {t.rsplit(".", 1)[-1] for t in targets}
    widths: dict[str, int] = {}
    for name, module in model.named_modules():
        short = name.rsplit(".", 1)[-1]
        if not isinstance(module, (nn.Linear, Conv1D)) or module is output or (wanted and short not in wanted):
            continue
        widths[short] = min(widths.get(short, min(module.weight.shape)), min(module.weight.shape))
    return min(widths.values(), default=0), sorted(widths)


def apply_lora(model: nn.Module, lora: LoraConfig, *, key: str) -> nn.Module:
    """`model` (a transformers causal LM) as a peft LoRA model: every base weight frozen, an adapter on each
    target (A random, B zero: the wrapped model's outputs equal the base's until a step). A is drawn from a
    generator seeded by `key` (the agent's), not from the process's: every rank, every load order and the
    reference loop (`reference.py`) start from the same adapter."""
    peft = require_peft()
    targets = lora_targets(model, lora, key=key)
    width, layers = lora_width(model, targets)
    if width and lora.rank > width:  # memory.lora_rank_problems says so before loading where config.json is known
        raise LoraTargetError(f"{key}.rank={lora.rank} is above {width}, the fewest in or out features of its "
                              f"targeted layers {layers} (a higher rank adds parameters, never a direction). Fix: "
                              f"set {key}.rank={min(width, 16)} (ranks of 8 to 64 are usual; {width} at most)")
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                             target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")  # peft sets it for Conv1D
        torch.manual_seed(zlib.crc32(key.encode()))
        return peft.get_peft_model(model, config)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: the adapter's for a LoRA model, every one otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_disabled(model: nn.Module):
    """A context in which `model` (a LoRA model) computes as its base model: its KL reference."""
    return model.disable_adapter()


def _scalings(model: nn.Module) -> dict[str, tuple[float, bool]]:
    """{module name without peft's prefix: (alpha / rank, whether its weight is stored [in, out])} of every module
    with an adapter (GPT-2's `Conv1D` stores [in, out]; peft's `fan_in_fan_out`)."""
    out = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and "default" in scaling and hasattr(module, "lora_A"):
            out[_base_name(name)] = (float(scaling["default"]), bool(getattr(module, "fan_in_fan_out", False)))
    return out


def _base_name(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name


def served_items(model: nn.Module, items: Iterable[tuple[str, torch.Tensor]], *,
                 merged: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """`items` (name, full tensor) of a LoRA model's state dict, as the base model's (name, tensor): a module with
    an adapter gives `<module>.weight` = W + (B @ A)·alpha/rank in fp32 (then the input's dtype) once its three
    tensors have come (one module held at a time), its bias under `<module>.bias`; every other tensor keeps its
    value under the base model's name. `merged=False`: the base's own W (the adapter left out). Items of a model
    without LoRA pass through."""
    if not is_lora(model):
        yield from items
        return
    if not merged:
        for name, tensor in items:
            name = _base_name(name)
            if ".lora_A." not in name and ".lora_B." not in name:
                yield name.replace(".base_layer.", "."), tensor
        return
    scalings = _scalings(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        name = _base_name(name)
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:
                module = name.split(marker)[0]
                pending.setdefault(module, {})[part] = tensor
                break
        else:
            if ".base_layer." not in name:
                yield name, tensor
                continue
            module, rest = name.split(".base_layer.", 1)
            if rest != "weight":
                yield f"{module}.{rest}", tensor
                continue
            pending.setdefault(module, {})["weight"] = tensor
        parts = pending.get(module, {})
        if len(parts) == 3:
            del pending[module]
            weight, a, b = parts["weight"], parts["lora_A"], parts["lora_B"]
            scaling, transposed = scalings[module]
            delta = (b.float() @ a.float()) * scaling                                        # [out, in]
            combined = weight.float() + (delta.T if transposed else delta)
            yield f"{module}.weight", combined.to(weight.dtype)
    if pending:
        raise ValueError(f"a LoRA state dict without all of base, A and B for {sorted(pending)[:3]}")


def served_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], *,
                      merged: bool = True) -> dict[str, torch.Tensor]:
    """`served_items` over a whole state dict (an export): the base model's names, adapters merged (or left out)."""
    return dict(served_items(model, state_dict.items(), merged=merged))


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a LoRA model under its own names, whole (DTensor shards gathered: a collective)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if ".lora_A." in name or ".lora_B." in name:
            out[name] = (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().cpu()
    return out


def save_adapter(model: nn.Module, directory: Path, *, state_dict: dict[str, torch.Tensor], base: str) -> None:
    """The adapter alone as peft writes it (`adapter_config.json`, `adapter_model.safetensors`) into `directory`;
    `base`: the model it applies to (`base_model_name_or_path`: the agent's model source)."""
    model.save_pretrained(str(directory), state_dict=state_dict)
    config_path = directory / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    fingerprint = base_fingerprint(state_dict)
    if fingerprint is not None:
        (directory / BASE_FINGERPRINT).write_text(json.dumps(fingerprint) + "\n")
    readme = directory / "README.md"  # peft's model card template: nothing of this run in it
    if readme.exists():
        readme.unlink()


ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FINGERPRINT = "hacrl_base.json"
"""`save_adapter` records in this file beside peft's which weights the adapter was trained on: the name of one adapted
layer and a CRC of its base weight rounded to bfloat16 (the same whether the base is held in fp32 or bf16)."""


def adapter_problem(directory: Path, what: str, fix: str) -> "AgentLoadError":
    """One line naming the adapter folder, what is wrong with it and the fix."""
    from hacrl_lightning.agents.sources import AgentLoadError

    return AgentLoadError(f"LoRA adapter folder {directory}: {what}. Fix: {fix}")


def read_adapter_config(directory: Path) -> dict:
    """The adapter's `adapter_config.json` (a JSON object naming its base), once its weights are known whole
    (`adapter_model.safetensors`: its header read, its tensors inside the file); else one `AgentLoadError` line."""
    path = directory / "adapter_config.json"
    redo = "write the adapter again (Agent.export writes <export>/adapter), or give the merged export instead"
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise adapter_problem(directory, f"adapter_config.json is not JSON ({str(err).splitlines()[0]})", redo) \
            from None
    if not isinstance(config, dict):
        raise adapter_problem(directory, f"adapter_config.json holds a {type(config).__name__}, not peft's settings",
                              redo)
    weights = directory / ADAPTER_WEIGHTS
    if not weights.is_file():
        other = " (adapter_model.bin, a pickle, is not read: it could run code)" \
            if (directory / "adapter_model.bin").exists() else ""
        raise adapter_problem(directory, f"no {ADAPTER_WEIGHTS} beside adapter_config.json{other}", redo)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as handle:
            for name in handle.keys():
                handle.get_slice(name)
        size, end = weights.stat().st_size, _safetensors_end(weights)
        if end > size:
            raise SafetensorError(f"its tensors need {end} bytes, the file has {size}")
    except (SafetensorError, OSError, ValueError) as err:
        raise adapter_problem(directory, f"{ADAPTER_WEIGHTS} is damaged or cut short ({str(err).splitlines()[0]})",
                              redo) from None
    return config


def _safetensors_end(path: Path) -> int:
    """The byte where a safetensors file's last tensor ends (8-byte header length, the JSON header, the data)."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    ends = [int(info["data_offsets"][1]) for key, info in header.items() if key != "__metadata__"]
    return 8 + length + max(ends, default=0)


def _fingerprint(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.detach().float().to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())


def base_fingerprint(state_dict: dict[str, torch.Tensor]) -> dict | None:
    """{layer, crc} of the first adapted layer's base weight in a LoRA model's state dict (`BASE_FINGERPRINT`)."""
    layer = next((key for key in sorted(state_dict) if key.endswith(".base_layer.weight")), None)
    if layer is None:
        return None
    return {"layer": _base_name(layer).replace(".base_layer.", "."), "crc": _fingerprint(state_dict[layer])}


def load_adapter_dir(model: nn.Module, directory: Path) -> nn.Module:
    """`model` (the adapter's base, loaded) with the adapter in `directory` merged into its weights: a plain
    transformers model again. Reads weights only (safetensors), never code. Refused in one line naming the folder
    (`read_adapter_config`): settings that are not JSON, weights missing or cut short, targets the base lacks, and
    a base other than the one it was trained on (`BASE_FINGERPRINT`: the merged export of this same adapter, say,
    which already holds it and would count it twice)."""
    peft = require_peft()
    config = read_adapter_config(directory)
    targets = config.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    have = linear_names(model)
    missing = [t for t in names if t != LORA_TARGETS_ALL and t.rsplit(".", 1)[-1] not in have]
    base = config.get("base_model_name_or_path")
    if missing:
        raise adapter_problem(directory, f"its target_modules {missing} are not layers of its base {base!r} (which "
                              f"has {have})", "give the adapter the base it was trained on (base_model_name_or_path "
                              "in adapter_config.json)")
    try:
        recorded = json.loads((directory / BASE_FINGERPRINT).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        recorded = None  # an adapter written elsewhere: its base cannot be checked
    if isinstance(recorded, dict) and model.dtype != torch.float16:  # fp16 rounds some weights off bf16's grid
        weight = dict(model.named_parameters()).get(str(recorded.get("layer")))
        if weight is not None and _fingerprint(weight) != recorded.get("crc"):
            raise adapter_problem(
                directory, f"its base {base!r} is not the model it was trained on (layer {recorded['layer']} differs: "
                "a merged export of this adapter already holds it, and applying it again would count it twice)",
                "set base_model_name_or_path in adapter_config.json to the model it was trained on, or evaluate the "
                "merged export alone")
    try:
        wrapped = peft.PeftModel.from_pretrained(model, str(directory), is_trainable=False)
    except (ValueError, RuntimeError, KeyError) as err:
        raise adapter_problem(directory, f"peft cannot apply it to {base!r} ({str(err).splitlines()[0][:300]})",
                              "give the adapter the base it was trained on, or write it again") from None
    return wrapped.merge_and_unload()
