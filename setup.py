"""Packaging that pyproject.toml cannot say: the top-level configs/, agents/ and scripts/ shipped inside
the wheel, as `hacrl_lightning/configs/` (with `configs/agents/` = agents/), `hacrl_lightning/scripts/`.

In the repo they stay at the top (the layout users know; `configs/agents` is a symlink to `../agents`,
which a wheel cannot hold, so agents/ is mapped to its place explicitly). `hacrl_lightning.cli` finds
them in the package when installed from a wheel and in the repo otherwise (`cli.INSTALLED`).
Everything else (metadata, dependencies, console scripts, the zoo's files) is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
DATA_DIRS = {"hacrl_lightning.configs": "configs", "hacrl_lightning.configs.agents": "agents",
             "hacrl_lightning.scripts": "scripts"}
"""Package in the wheel -> folder of the repo."""
CONFIG_GROUPS = sorted(f"hacrl_lightning.configs.{d.name}" for d in (ROOT / "configs").iterdir()
                       if d.is_dir() and not d.is_symlink())
"""configs/algorithm, configs/data, ...: each a package of YAML files (agents/ is mapped above)."""

setup(
    packages=find_packages(include=["hacrl_lightning*"]) + list(DATA_DIRS) + CONFIG_GROUPS,
    package_dir=DATA_DIRS,
    package_data={**{package: ["*.yaml"] for package in ["hacrl_lightning.configs", *DATA_DIRS, *CONFIG_GROUPS]},
                  "hacrl_lightning.configs.agents": ["*.yaml", "arch/*/*.json"],  # hub presets' architectures (memory plan)
                  "hacrl_lightning.zoo": ["zoo_weights/*/*"]},
)
