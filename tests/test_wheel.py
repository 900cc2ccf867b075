"""The package as users of the ecosystem install it: a wheel, installed (not editable) into a fresh
virtual environment outside the repo, runs from any directory with the configs, agent presets and
scripts it ships, and takes a user's own agent file and experiment from a folder of theirs.

The wheel is built from a copy of the source tree (the `configs/agents` symlink included), so the
build writes nothing into the repo. The fresh venv holds only the wheel; its dependencies come from
the test's own environment through a `.pth` line (that environment's site-packages, where the
project itself is only an editable finder that a `.pth` line does not run), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.prompts_per_step=2", "trainer.mini_batch_prompts=2", "rollout.group_size=2", "data.eval_size=4",
        "trainer.eval_every=0", "trainer.export_agents=false"]
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "runs", "outputs",
                              ".pytest_cache", ".hypothesis", ".cache", "eval", "results", "tests")


def _run(args: list, *, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"$ {' '.join(map(str, args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv (its bin/) where the project is installed from its wheel, and nowhere else."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=SKIP)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
          "-w", root / "dist", source], cwd=root)
    wheel = next((root / "dist").glob("hacrl_lightning-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    purelib = _run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=root).stdout.strip()
    Path(purelib, "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index",
          "--quiet", wheel], cwd=root)
    return venv / "bin"


@pytest.fixture
def env(zoo_cache) -> dict:
    """The environment of a user's shell: no PYTHONPATH into the repo, the session's zoo cache."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HACRL_ZOO_CACHE": str(zoo_cache)}


@pytest.mark.slow
def test_the_wheel_ships_configs_agents_and_scripts_and_runs_from_anywhere(installed, env, tmp_path):
    """The installed package composes the default job from another directory with the configs inside
    itself (not the repo's), and `hacrl-train --cfg job` prints it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = _run([installed / "python", "-c", "import hacrl_lightning.cli as c; print(*c.compose_config([])[0].agents); "
                  "print(c.INSTALLED, c.CONFIG_DIR)"], cwd=elsewhere, env=env).stdout.splitlines()
    assert shown[0].split() == ["tiny_a", "tiny_b"]
    where = shown[1].split()
    assert where[0] == "True" and Path(where[1]).is_relative_to(installed.parent) and REPO not in Path(where[1]).parents
    assert Path(where[1], "agents", "tiny_a.yaml").is_file()  # agents/ (a symlink in the repo) shipped as a group
    assert Path(where[1], "agents", "arch", "Qwen", "Qwen3-4B.json").is_file()  # what the memory plan reads offline

    job = _run([installed / "hacrl-train", "--cfg", "job"], cwd=elsewhere, env=env).stdout
    assert "tiny_a:" in job and "tiny_b:" in job and "name: hacpo" in job


@pytest.mark.slow
def test_a_users_agent_file_and_experiment_folder(installed, env, tmp_path):
    """A 2-step `hacrl-train` job outside the repo with an agent preset given as a path in `agents=[...]`
    and an experiment file from the user's folder (`hydra.searchpath=[file://my_configs]`); a missing
    agent file is refused by name."""
    (tmp_path / "my_configs" / "experiment").mkdir(parents=True)
    (tmp_path / "my_configs" / "experiment" / "two_steps.yaml").write_text(
        "# @package _global_\ntrainer:\n  steps: 2\n")
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "my_b.yaml").write_text(
        "# @package agents.my_b\nmodel: zoo:tiny_b\nmax_prompt_len: 96\nmax_response_len: 24\nlr: 3.0e-4\n")

    overrides = ["hydra.searchpath=[file://my_configs]", "experiment=two_steps", "agents=[tiny_a,my_agents/my_b.yaml]"]
    _run([installed / "hacrl-train", *overrides, *TINY, "run_dir=run"], cwd=tmp_path, env=env)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert set(summary["agents"]) == {"tiny_a", "my_b"}
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "my_b:" in saved and "lr: 0.0003" in saved

    refused = subprocess.run([installed / "hacrl-train", "agents=[tiny_a,my_agents/missing.yaml]", "--cfg", "job"],
                             cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "agents: got 'my_agents/missing.yaml'" in refused.stderr
