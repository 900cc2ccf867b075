"""A new user's first hour: the commands of the README and the experiment files, run on this CPU
machine without the hub, fail before anything is built, and a first evaluation scores the demo's task.

- GPU-only commands (`trainer=fsdp trainer.devices=8`, `rollout=vllm`) stop in the preflight with the
  key, what this machine has and the fix; CPU ranks (`trainer.accelerator=cpu`) stay allowed.
- Hub models and benchmarks that are neither cached nor reachable are named all at once, with the
  download command the installed huggingface_hub ships (`hf download`); the hub is made unreachable
  by pointing huggingface_hub at a closed local port, so the test behaves the same with a network.
- `scripts/evaluate.py benchmarks=[synthetic]` gives, for the same weights, the training's held-out figure.

Every script runs in-process (`script_main`): exit status, message, no traceback, no run directory,
no model loaded (`from_pretrained` of a causal LM is watched, not replaced).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import huggingface_hub
import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import DataConfig
from hacrl_lightning.hub import download_command
from hacrl_lightning.preflight import device_problems


@pytest.fixture
def hub_unreachable(monkeypatch):
    """The hub at a closed port of this machine: every probe is refused at once, network or not."""
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(flag, raising=False)


def refused(script_main, capsys, script: str, argv: list[str]) -> str:
    """Run a script's main, check it stopped in the preflight (status 2, no traceback), return stderr."""
    status = script_main(script)(argv)
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert "Traceback" not in err and err.startswith("error: ")
    assert "run directory:" not in out  # nothing of the run was started
    return err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU machine's view")
@pytest.mark.parametrize("argv,key,fix", [
    (["trainer=fsdp", "trainer.devices=8"], "trainer.accelerator: got 'gpu'",
     "trainer.accelerator=cpu trainer.devices=2"),
    (["rollout=vllm"], "rollout.backend: got 'vllm'", "rollout=hf"),
])
def test_gpu_only_commands_stop_in_the_preflight_on_a_cpu_machine(argv, key, fix, script_main, capsys, tmp_path,
                                                                  model_loads, zoo_cache):
    run = tmp_path / "run"
    err = refused(script_main, capsys, "train", [*argv, f"run_dir={run}", f"zoo_cache={zoo_cache}"])
    assert key in err and ("no CUDA GPU" in err or "no vllm package" in err) and fix in err
    assert not run.exists() and model_loads == []


def test_cpu_ranks_rehearse_the_sharded_path_and_one_device_needs_no_gpu():
    for argv in (["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"], [],
                 ["experiment=paper_smoke"]):
        cfg, _ = compose_config(argv)
        assert device_problems(cfg) == [], argv


def test_the_fix_names_a_download_command_that_is_installed():
    program = download_command().split()[0]
    assert (Path(sys.executable).parent / program).exists(), program


def test_paper_size_names_every_missing_model_and_benchmark_at_once(script_main, capsys, tmp_path, model_loads,
                                                                    hub_unreachable):
    run = tmp_path / "run"
    err = refused(script_main, capsys, "train", ["experiment=paper_size", "trainer.accelerator=cpu", f"run_dir={run}"])
    assert "4 configuration problem(s)" in err, err
    for key, repo in [("agents.qwen3_1_7b_base.model", "Qwen/Qwen3-1.7B-Base"),
                      ("agents.qwen3_4b_base.model", "Qwen/Qwen3-4B-Base")]:
        assert f"{key}: got {repo!r}" in err and f"`{download_command()} {repo} --local-dir /path/to/dir`" in err
        assert f"{key}=/path/to/dir" in err
    assert "data.train_files: got 'benchmark math_train (DigitalLearningGmbH/MATH-lighteval)'" in err
    assert "data.eval_files: got 'benchmark math500 (HuggingFaceH4/MATH-500)'" in err
    assert f"`{download_command()} HuggingFaceH4/MATH-500 --repo-type dataset" in err
    assert not run.exists() and model_loads == []


def test_evaluate_names_a_missing_hub_agent_and_benchmark_and_writes_nothing(script_main, capsys, tmp_path,
                                                                            hub_unreachable, zoo_cache):
    out = tmp_path / "eval"
    err = refused(script_main, capsys, "evaluate", ["agents=[Qwen/Qwen3-4B,zoo:tiny_a]", "benchmarks=[gsm8k,synthetic]",
                                                    f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    assert "2 configuration problem(s)" in err, err
    assert "agents[0]: got 'Qwen/Qwen3-4B'" in err and f"`{download_command()} Qwen/Qwen3-4B" in err
    assert "files.gsm8k: got 'benchmark gsm8k (openai/gsm8k)'" in err
    assert not out.exists()


@pytest.mark.slow
def test_evaluate_scores_the_synthetic_task_as_the_training_does(script_main, capsys, tmp_path, zoo_cache):
    """Zoo agents equal the run's held-out figure before training; its exports, the figure after."""
    run = tmp_path / "run"
    assert script_main("train")(["trainer.steps=1", "trainer.export_agents=true", f"run_dir={run}",
                                 f"zoo_cache={zoo_cache}"]) == 0
    summary = json.loads((run / "summary.json").read_text())["agents"]
    assert compose_config([])[0].data == DataConfig()  # the demo's task
    for entries, figure in ((["zoo:tiny_a", "zoo:tiny_b"], "initial"),
                            ([str(run / "exports" / "tiny_a"), str(run / "exports" / "tiny_b")], "final")):
        out = tmp_path / f"eval_{figure}"
        capsys.readouterr()
        status = script_main("evaluate")([f"agents=[{','.join(entries)}]", "benchmarks=[synthetic]", "reward_workers=0",
                                          f"output_dir={out}", f"zoo_cache={zoo_cache}"])
        assert status == 0, capsys.readouterr()
        results = json.loads((out / "results.json").read_text())
        assert results["benchmarks"]["synthetic"]["problems"] == 128
        for name in ("tiny_a", "tiny_b"):
            assert results["agents"][name]["scores"]["synthetic"]["avg@1"] == summary[name][figure]["acc"], name
        assert results["agents"]["tiny_b"]["average"] > 0


# --- messages a user can act on ------------------------------------------------------------------------


def test_help_is_a_help_text_and_a_multirun_points_to_compare(script_main, capsys, tmp_path):
    assert script_main("train")(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The main job") and "resume=runs/x" in out and "scripts/compare.py" in out
    assert "algorithm: grpo, gspo, gspo_x2" in out and "tiny_a" in out and "Lexer" not in out
    assert script_main("evaluate")(["-h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Evaluate agents") and "output_dir=" in out
    for script, argv in (("train", ["-m", "seed=0,1"]), ("train", ["--multirun", "algorithm=grpo,hacpo"]),
                         ("evaluate", ["-m", "agents=[zoo:tiny_a]"])):
        err = refused(script_main, capsys, script, argv)
        assert "-m/--multirun" in err and "scripts/compare.py" in err and "Lexer" not in err, err
    err = refused(script_main, capsys, "train", ["seed=0,1"])  # a sweep without -m
    assert "seed: got '0,1'" in err and "scripts/compare.py" in err


@pytest.mark.parametrize("name", ["é", "lr=3e-4", "a,b"])
def test_a_value_hydra_cannot_read_gets_the_quoted_form_to_type(script_main, capsys, tmp_path, name):
    """`run_dir=<dir>/é` and `run_dir=<dir>/lr=3e-4` are Hydra lexer errors, `<dir>/a,b` a sweep: the fix is the
    argument to type, quoted for Hydra and the shell, and that argument is what the user meant."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    run = tmp_path / name
    err = refused(script_main, capsys, "train", [f"run_dir={run}", "trainer.steps=1"])
    typed = f"\"run_dir='{run}'\""
    assert f"run_dir: got '{run}'" in err and typed in err and "Lexer" not in err, err
    (word,) = shlex.split(typed)
    assert OverridesParser.create().parse_overrides([word])[0].value() == str(run)
    assert not run.exists()
