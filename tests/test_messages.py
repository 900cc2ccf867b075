"""One clear line where a traceback or a wrong diagnosis used to be (docs/reliability.md): each case is made real
(a file that does not parse, a cut-short weights file, a signal, an allocation the address-space limit refuses)
and the message must name the file, key or row, what is allowed and the fix, with no traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
QUICK = ["trainer.steps=1", "trainer.eval_every=0", "data.eval_size=4", "data.prompts_per_step=2",
         "rollout.group_size=2", "trainer.mini_batch_prompts=2"]


def refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        compose_config(overrides, preflight=True)
    return str(err.value)


@pytest.mark.parametrize("text, says", [
    ("model: zoo:tiny_a\nlr: [1e-4\n", r"agents: got '.*bad.yaml'; allowed: a YAML file that parses; fix: bad.yaml "
                                       r"line 3, column 1: expected ',' or '\]'"),
    ("model: !!python/object/apply:os.system ['true']\n", r"allowed: plain YAML values \(a !!python tag would build "
                                                           r"Python objects; it is never read\); fix: bad.yaml line 1"),
])
def test_an_agent_file_that_does_not_parse_or_holds_a_python_tag(tmp_path, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    message = refused([f"agents=[{path},tiny_b]"])
    assert pytest.importorskip("re").search(says, message), message


def test_an_agent_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"model: zoo:tiny_a\nsystem_prompt: caf\xe9\n")
    assert "allowed: a UTF-8 text file; fix: byte 36 is not UTF-8" in refused([f"agents=[{path},tiny_b]"])


def test_every_wrong_type_in_an_agent_file_is_named_with_its_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: zoo:tiny_a\nlr: fast\nmax_prompt_len: many\n")
    message = refused([f"agents=[{path},tiny_b]"])
    assert "2 configuration problem(s)" in message
    assert "agents.mine.lr: got 'fast'; allowed: a value of type Float; fix: give lr a float" in message
    assert "agents.mine.max_prompt_len: got 'many'; allowed: a value of type Integer; fix: give max_prompt_len " \
           "an integer" in message and str(path) in message


def test_a_data_file_that_is_not_utf8_names_its_row(tmp_path):
    row = {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "reward_model": {"ground_truth": "2"}}
    data = tmp_path / "train.jsonl"
    data.write_bytes((json.dumps(row) + "\n").encode() * 3 + b'{"prompt": "caf\xe9"}\n')
    message = refused(["data=math", f"data.train_files=[{data}]", f"data.eval_files=[{data}]"])
    assert f"data.train_files: got '{data}'" in message
    assert "row 4: line 4 is not UTF-8 (byte b'\\xe9'" in message and "save the file as UTF-8" in message


@pytest.fixture(scope="module")
def export(tmp_path_factory, zoo_cache) -> Path:
    """A complete exported agent directory (tiny_a's zoo build)."""
    from hacrl_lightning.zoo import ensure_built

    return ensure_built("tiny_a", cache_dir=zoo_cache)


def test_a_model_folder_without_tokenizer_files_says_so(tmp_path, export):
    folder = tmp_path / "model"
    shutil.copytree(export, folder)
    for path in folder.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            path.unlink()
    agent = tmp_path / "mine.yaml"
    agent.write_text(f"model: {folder}\nmax_prompt_len: 96\nmax_response_len: 24\n")
    message = refused([f"agents=[tiny_b,{agent}]"])
    assert "1 configuration problem(s)" in message and "WordPiece" not in message
    assert f"agents.mine.model: got '{folder}'; allowed: a directory holding a tokenizer" in message


def test_a_weights_file_cut_short_is_one_line(tmp_path, export, script_main, capsys):
    folder = tmp_path / "model"
    shutil.copytree(export, folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    agent = tmp_path / "mine.yaml"
    agent.write_text(f"model: {folder}\nmax_prompt_len: 96\nmax_response_len: 24\n")
    status = script_main("train")([f"agents=[tiny_b,{agent}]", *QUICK, f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"agents.mine.model='{folder}' does not load (SafetensorError" in err and "copied again" in err
    assert not (tmp_path / "run").exists()


def test_a_run_directory_that_cannot_be_locked_is_one_line(tmp_path, zoo_cache, script_main, capsys):
    run = tmp_path / "run"
    (run / ".lock").mkdir(parents=True)  # the lock file cannot be opened (as on a read-only directory)
    status = script_main("train")([*QUICK, f"run_dir={run}", f"zoo_cache={zoo_cache}"])
    err = capsys.readouterr().err
    assert status == 2 and "run_dir: got" in err and "cannot open" in err and "Traceback" not in err


def _run_script(argv: list[str], *, interrupt_after: str | None = None, at: float = 1.0,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """A script in its own process, sent SIGINT `at` seconds after it starts, or after it printed `interrupt_after`."""
    proc = subprocess.Popen([sys.executable, "-u", *argv], cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if interrupt_after is None:
        time.sleep(at)
    else:
        for line in proc.stdout:
            if interrupt_after in line:
                break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_ctrl_c_in_the_first_seconds_of_train_is_one_line(tmp_path):
    # after the config is checked, while the trainer's modules load (seconds): before any run directory exists
    run = tmp_path / "run"
    done = _run_script(["scripts/train.py", *QUICK, f"run_dir={run}"], interrupt_after="run directory:")
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert "Traceback" not in done.stderr and "nothing was written" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not run.exists()


@pytest.mark.slow
def test_ctrl_c_during_evaluation_is_one_line_and_leaves_no_half_made_folder(tmp_path, zoo_cache):
    out = tmp_path / "eval"
    # 128 problems x 16 sampled answers: seconds of generation after the "agents:" line, however fast the machine
    done = _run_script(["scripts/evaluate.py", "agents=[zoo:tiny_a]", "benchmarks=[synthetic]", "reward_workers=0",
                        "protocol=custom", "samples=16", f"output_dir={out}", f"zoo_cache={zoo_cache}"],
                       interrupt_after="agents:")
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert "Traceback" not in done.stderr and "evaluate.py: interrupted; no results were written" in done.stderr
    assert not out.exists()


OOM_DRIVER = """
import resource, sys
from lightning.pytorch import Callback
from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import RunFailed
from hacrl_lightning.training import train

class Limit(Callback):  # once the run is set up: 600 MB more address space at most
    def on_train_start(self, trainer, pl_module):
        size = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 600 * 2**20, resource.RLIM_INFINITY))

cfg, _ = compose_config(sys.argv[1:])
try:
    train(cfg, extra_callbacks=[Limit()])
except RunFailed as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
def test_running_out_of_memory_in_training_names_the_setting_and_no_phantom_checkpoint(tmp_path, zoo_cache):
    # tiny_qwen3's logits: 16 rows x 112 positions x 151,936 x 4 B = 1.1 GB per micro-batch > the 600 MB allowed
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", OOM_DRIVER, "agents=[tiny_qwen3,tiny_a]", *QUICK,
                           "trainer.micro_batch_size=16", "data.prompts_per_step=8", "rollout.group_size=2",
                           "trainer.mini_batch_prompts=8", f"run_dir={run}", f"zoo_cache={zoo_cache}"],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO),
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    # the first pass over 16 rows (the old log-probs' forward) is refused; its message is the update's
    assert "agent 'tiny_qwen3': its forward pass scoring its responses (old log-probs) in training step 1 failed " \
           "(RuntimeError" in line and "lower trainer.micro_batch_size (now 16)" in line
    assert "lr=" not in line and "No checkpoint was written yet" in line


def test_compare_names_a_run_held_by_another_process_and_touches_nothing(tmp_path, script_main, capsys):
    out = tmp_path / "cmp"
    run = out / "runs" / "hacpo" / "seed0"
    run.mkdir(parents=True)
    (out / ".hacrl_compare").write_text("")
    (run / "summary.json").write_text('{"status": "interrupted"}')
    (run / ".lock").write_text(f"pid {os.getpid()} since 2026-11-26 12:00:00 (train.py)\n")  # a live holder: us
    assert script_main("compare")(["methods=[hacpo]", "seeds=[0]", f"out={out}", "trainer.steps=2"]) == 2
    err = capsys.readouterr().err
    assert f"{run} is in use by pid {os.getpid()} since 2026-11-26 12:00:00 (train.py)" in err
    assert (run / "summary.json").read_text() == '{"status": "interrupted"}'  # not deleted, not re-run


@pytest.mark.parametrize("text, says", [
    ("name: math\ntrain_files: [/x.jsonl\n", "allowed: a YAML file that parses; fix: mine.yaml line 3, column 1"),
    ("name: !!python/object/apply:os.system ['true']\n", "allowed: plain YAML values (a !!python tag would build"),
])
def test_a_data_config_of_ones_own_that_does_not_parse_or_holds_a_python_tag(tmp_path, text, says):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.yaml").write_text(text)
    message = refused([f"hydra.searchpath=[file://{tmp_path}]", "data=mine"])
    assert f"config: got '{tmp_path / 'data' / 'mine.yaml'}'" in message and says in message
