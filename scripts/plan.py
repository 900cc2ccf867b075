"""The per-GPU memory plan of a run, before a GPU hour is spent: what each agent holds on one GPU.

    python scripts/plan.py experiment=paper_size_qwen3_4b_8b trainer.devices=8
    python scripts/plan.py experiment=paper_model rollout=vllm --json plan.json
    python scripts/plan.py agents=[qwen3_1.7b,qwen3_4b,qwen3_8b_base] trainer=fsdp rollout=vllm
    python scripts/plan.py experiment=paper_model rollout=vllm --sbatch 2     # a SLURM script for 2 nodes

Takes the same overrides as scripts/train.py (composed and validated the same way, `hacrl_lightning.cli`)
and loads no weights: each agent's architecture comes from agents/arch/<hub id>.json for a hub preset, or
the config.json of a local directory or zoo build (`hacrl_lightning.architecture`). Prints, per agent and per
GPU, the fp32 master weights, gradients and AdamW state (sharded over devices x nodes under trainer=fsdp),
the KL reference, FSDP2's gathered weights, the activation peak of one micro-batch with and without
gradient checkpointing, the engine's weights and KV cache, the peak of every phase of a step on each GPU
(rollout, old log-probs and update of each agent, weight sync; with trainer.placement=split per group, with
trainer.offload_idle and rollout.sleep what they free), and the largest against one GPU's memory (the
device's own where CUDA is present, else trainer.gpu_memory_gib, 80 by default); when it does not fit,
the changes that would make it fit, cheapest first, and the plan they reach; when it fits with room, the largest
passes that still fit (`trainer.micro_batch_size` and `trainer.micro_batch_tokens`: fewer, fuller passes, the same
update). train.py runs the same check on a GPU and refuses a
run that cannot fit (docs/PERFORMANCE.md#the-memory-plan).

Flags: --json PATH (the same figures, with "fits": true|false; a new file, or one an earlier plan.py wrote:
any other file there is refused untouched), --sbatch NODES (a whole number >= 1: print an sbatch script
that launches this run on NODES nodes of trainer.devices GPUs; docs/training.md#several-nodes),
--cfg job (print the composed config), -h/--help. Exit status: 0 it fits, 1 it does not, 2 a usage error
(a flag's value), a bad config or an agent whose architecture is unknown offline.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from omegaconf import OmegaConf

from hacrl_lightning.cli import compose_config, parse_cli
from hacrl_lightning.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


WRITER = "scripts/plan.py"
"""The `written_by` of every --json file: an existing file without it is someone else's, never replaced."""


class UsageError(ValueError):
    """A flag's value plan.py cannot use: one line naming the flag, the value, what is allowed and the fix (exit 2)."""


def take_flag(args: list[str], flag: str) -> str | None:
    """Remove `flag VALUE` from args and return VALUE (None when absent)."""
    if flag not in args:
        return None
    i = args.index(flag)
    example = f"{flag} {'plan.json' if flag == '--json' else '2'}"
    if i + 1 >= len(args) or args[i + 1].startswith("--"):
        raise UsageError(f"{flag} takes a value, e.g. {example}")
    value = args[i + 1]
    del args[i : i + 2]
    if flag in args:
        raise UsageError(f"{flag} is given twice; give it once, e.g. {example}")
    return value


def node_count(value: str) -> int:
    """--sbatch's NODES: a whole number >= 1, else `UsageError`."""
    try:
        nodes = int(value)
    except ValueError:
        nodes = 0
    if nodes < 1 or str(nodes) != value.strip().lstrip("+"):
        raise UsageError(f"--sbatch: got {value!r}; allowed: a whole number of nodes >= 1; fix: e.g. --sbatch 2")
    return nodes


def json_target_problem(value: str) -> str | None:
    """Why --json's PATH must not be written (None: a new file, or a plan an earlier plan.py wrote there)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return f"--json: {value} is a folder; fix: give a file name, e.g. --json {path / 'plan.json'}"
    if not path.exists():
        parent = path.parent if str(path.parent) else Path(".")
        return None if parent.is_dir() else f"--json: {value}: its folder {parent} does not exist; fix: create it first"
    try:
        written_by = json.loads(path.read_text()).get("written_by")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        written_by = None
    if written_by == WRITER:
        return None
    return (f"--json: {value} already exists and was not written by {WRITER}; nothing was changed; fix: give a new "
            "file name, or move that file away")


def sbatch_script(overrides: list[str], *, nodes: int, devices: int) -> str:
    """An sbatch script for this run on `nodes` nodes of `devices` GPUs: one SLURM task per GPU, as
    Lightning's SLURM environment expects (it reads the ranks and the master address from SLURM)."""
    run = [o for o in overrides if not o.startswith(("trainer.num_nodes=", "trainer.devices="))]
    command = shlex.join(["python", "scripts/train.py", *run, f"trainer.num_nodes={nodes}", f"trainer.devices={devices}"])
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=hacrl",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={devices}      # one task per GPU: Lightning's SLURMEnvironment",
        f"#SBATCH --gpus-per-node={devices}",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=24:00:00",
        "#SBATCH --signal=SIGTERM@120     # 2 min before the limit: the run checkpoints and stops;",
        "#                                  continue it with resume=<its run_dir> in a new job",
        "",
        f"cd {shlex.quote(str(REPO))}",
        "source .venv/bin/activate",
        f"srun {command}",
        "",
    ])


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.strip())
        return 0
    args = list(argv)
    try:
        json_path, given_nodes = take_flag(args, "--json"), take_flag(args, "--sbatch")
        nodes = None if given_nodes is None else node_count(given_nodes)
        refused = json_target_problem(json_path) if json_path is not None else None
        if refused:
            raise UsageError(refused)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        overrides, show = parse_cli(args)
        cfg, dcfg = compose_config(overrides)  # values and names only: no hub, file or tokenizer is touched
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if show:
        print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
        return 0
    from hacrl_lightning.architecture import run_architectures
    from hacrl_lightning.memory import (describe_fixes, describe_larger_passes, fixes, gpu_memory_bytes, larger_passes,
                                        plan_memory, with_changes)

    if nodes is not None:
        cfg.trainer.num_nodes = nodes
    architectures, problems = run_architectures(cfg)
    if problems:
        print(f"error: {ConfigError(problems)}", file=sys.stderr)
        return 2
    gpu_bytes, source = gpu_memory_bytes(cfg)
    plan = plan_memory(cfg, architectures, gpu_bytes)
    changes = [] if plan.fits else fixes(cfg, architectures, gpu_bytes)
    larger = larger_passes(cfg, architectures, gpu_bytes) if plan.fits else None
    print(plan.table())
    print(f"one GPU: {gpu_bytes / 2**30:.1f} GiB ({source})")
    if larger:
        print(describe_larger_passes(larger, gpu_bytes))
    if not plan.fits:
        print("changes that would make it fit, cheapest first (each with the plan's total after it):")
        print(describe_fixes(changes, gpu_bytes))
        if changes and changes[-1]["fits"]:
            print("\nthe plan with those changes:")
            print(plan_memory(with_changes(cfg, changes), architectures, gpu_bytes).table())
    if json_path:
        from hacrl_lightning.files import write_atomically

        write_atomically(Path(json_path).expanduser(),
                         json.dumps({"written_by": WRITER, **plan.to_json(changes), "larger_passes": larger},
                                    indent=2) + "\n")
        print(f"plan: {json_path}")
    if nodes is not None:
        print("\n# sbatch script:\n" + sbatch_script(overrides, nodes=nodes, devices=cfg.trainer.devices))
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
