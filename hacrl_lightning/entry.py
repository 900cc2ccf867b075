"""The console scripts of an installed package: `hacrl-train`, `hacrl-evaluate`, `hacrl-compare`,
`hacrl-plan` and `hacrl-bench` run `main(argv)` of `scripts/train.py`, `evaluate.py`, `compare.py`,
`plan.py` and `bench.py`, the same entry functions as `python scripts/<name>.py`.

The scripts are found where `cli.SCRIPTS_DIR` says: inside the package in a wheel install (the wheel
ships scripts/ as `hacrl_lightning/scripts/`), at the top of the repo in a source checkout or an
editable install. Deliberately not here: any option parsing or job logic (each script owns its
command line; `cli.py` the configuration).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import NoReturn

from hacrl_lightning.cli import SCRIPTS_DIR


def load_script(name: str) -> ModuleType:
    """The module of `scripts/<name>.py`, loaded once per process as `hacrl_lightning.scripts.<name>`."""
    module_name = f"hacrl_lightning.scripts.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = SCRIPTS_DIR / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: this installation has no `{name}` command "
                         f"(reinstall hacrl-lightning, or run from a checkout of the repo)")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses defined by the script look their module up here
    spec.loader.exec_module(module)
    return module


def run(name: str) -> NoReturn:
    """Run `scripts/<name>.py`'s `main` with this process's arguments and exit with its status."""
    sys.exit(load_script(name).main(sys.argv[1:]))


def train() -> NoReturn:
    """`hacrl-train ...` = `python scripts/train.py ...`."""
    run("train")


def evaluate() -> NoReturn:
    """`hacrl-evaluate ...` = `python scripts/evaluate.py ...`."""
    run("evaluate")


def compare() -> NoReturn:
    """`hacrl-compare ...` = `python scripts/compare.py ...`."""
    run("compare")


def plan() -> NoReturn:
    """`hacrl-plan ...` = `python scripts/plan.py ...`."""
    run("plan")


def bench() -> NoReturn:
    """`hacrl-bench ...` = `python scripts/bench.py ...`."""
    run("bench")
