"""A run is never lost and never mixed: signals, run directories, resume, fork, damaged checkpoints.

Signals are sent to a real `scripts/train.py` process; second runs into one directory, locks held by a
real second process, truncated checkpoints and resumes are real runs on the tiny zoo agents.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from hacrl_lightning.agents.sources import AgentLoadError
from hacrl_lightning.callbacks.checkpoint import latest_checkpoint
from hacrl_lightning.cli import compose_config
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.resume import config_dict, resume_changes
from hacrl_lightning.run_dir import LOCK_NAME
from hacrl_lightning.training import train

REPO = Path(__file__).resolve().parents[1]
SMALL = ["agents=[tiny_a,tiny_b]", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
         "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false", "trainer.micro_batch_size=8"]
UPDATES_PER_STEP = 4  # 16 responses per learner in mini-batches of 4 (2 prompts x G)


def config(run_dir: Path, zoo_cache: Path, *overrides: str) -> TrainConfig:
    cfg, _ = compose_config([*SMALL, f"zoo_cache={zoo_cache}", f"run_dir={run_dir}", *overrides])
    return cfg


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under `directory` with its size and modification time (ns): what a run must not touch."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


# --- signals -----------------------------------------------------------------------------------------


def _default_sigint() -> None:
    """In the child: SIGINT and SIGHUP at their defaults. A suite started as a background job of a shell
    (`make test &`) inherits SIGINT ignored, and under `nohup` SIGHUP too; train.py rightly leaves an ignored
    signal ignored, so without this those cases would test the launcher rather than the run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_script(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint)


def wait_for(proc: subprocess.Popen, text: str, seen: list[str]) -> None:
    """Read the process's output until a line contains `text` (the lines go to `seen`)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("the process ended before printing " + repr(text) + ":\n" + "".join(seen[-30:]))
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within 240 s")


@pytest.mark.slow
def test_sigterm_to_the_script_stops_the_run_with_a_checkpoint_an_interrupted_summary_and_143(tmp_path, zoo_cache):
    """A real `scripts/train.py` and a real SIGTERM, end to end (the other signals, and a second one, run in this
    process below: the same handlers, the same `main`)."""
    run = tmp_path / "run"
    proc = start_script([*SMALL, "trainer.steps=50", f"zoo_cache={zoo_cache}", f"run_dir={run}"])
    seen: list[str] = []
    wait_for(proc, "eval step 0", seen)  # the initial evaluation is done: step 1 is under way
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
    output = "".join(seen) + out
    assert proc.returncode == 143, output[-3000:]
    assert "Traceback" not in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["steps_wanted"] == 50 and 1 <= summary["steps"] < 50
    assert summary["last_checkpoint"] == str(run / "checkpoints" / f"step_{summary['steps']:07d}.ckpt")
    assert f"resume={run}" in output and not (run / LOCK_NAME).exists()


class SendSignal(Callback):
    """Sends `signum` to this process `times` times as the first step starts (as a user or a scheduler would
    once the initial evaluation is done)."""

    def __init__(self, signum: int, times: int):
        self.signum, self.times = signum, times

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.steps_done == 0:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)  # the handler runs here, in the main thread


@pytest.mark.slow
@pytest.mark.parametrize("signum,times,code", [(signal.SIGTERM, 1, 143), (signal.SIGINT, 1, 130), (signal.SIGINT, 2, 130),
                                               (signal.SIGHUP, 1, 129)],
                         ids=["sigterm", "sigint", "sigint_twice", "sighup"])
def test_a_signal_stops_the_run_with_a_checkpoint_an_interrupted_summary_and_128_plus_the_signal(
        tmp_path, zoo_cache, script_main, monkeypatch, capsys, signum, times, code):
    """scripts/train.py's `main` in this process, its run sent real signals: one finishes the step and checkpoints
    it, a second stops at once; the exit status is 128 + the signal, as a shell's."""
    from hacrl_lightning import training

    if signum == signal.SIGHUP and (os.isatty(1) or os.isatty(2)):
        pytest.skip("SIGHUP points a terminal's stdout and stderr at /dev/null (run without -s)")
    real = training.train
    monkeypatch.setattr(training, "train", lambda cfg, **kw: real(cfg, extra_callbacks=[SendSignal(signum, times)],
                                                                  **kw))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP)}
    _default_sigint()  # as a terminal's shell starts a command (a suite run in the background inherits SIGINT ignored)
    try:
        status = script_main("train")([*SMALL, "trainer.steps=50", f"zoo_cache={zoo_cache}", f"run_dir={tmp_path / 'run'}"])
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    run = tmp_path / "run"
    output = "".join(capsys.readouterr())
    assert status == code, output[-3000:]
    assert "Traceback" not in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.Signals(signum).name
    assert summary["steps_wanted"] == 50 and summary["steps"] < 50
    if times == 1:  # the step under way when the signal came is finished and saved
        assert summary["steps"] >= 1
        assert summary["last_checkpoint"] == str(run / "checkpoints" / f"step_{summary['steps']:07d}.ckpt")
        assert torch.load(summary["last_checkpoint"], weights_only=False)["hacrl"]["steps_done"] == summary["steps"]
        assert f"resume={run}" in output
    else:  # a second signal stops at once, mid-step: nothing newer than the last periodic checkpoint (none here)
        assert summary["last_checkpoint"] is None
    assert not (run / LOCK_NAME).exists()


def _terminal_of_its_own() -> None:
    """In the child (a new session, `start_new_session`): the pty on its stdin becomes its controlling
    terminal, so closing the pty's other end hangs it up, as closing a terminal window or an ssh session does."""
    import fcntl
    import termios

    _default_sigint()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def read_until(fd: int, text: str) -> str:
    """Read a pty's output until it holds `text` (or fail after 240 s)."""
    import select

    seen, deadline = "", time.monotonic() + 240
    while text not in seen:
        assert time.monotonic() < deadline, f"no {text!r} within 240 s:\n{seen[-3000:]}"
        if select.select([fd], [], [], 1.0)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal: it ended
                chunk = b""
            assert chunk, f"the process ended before printing {text!r}:\n{seen[-3000:]}"
            seen += chunk.decode(errors="replace")
    return seen


@pytest.mark.slow
def test_closing_the_runs_terminal_stops_it_after_the_step_with_a_checkpoint(tmp_path, zoo_cache):
    """A real terminal (a pty, the run's controlling terminal, progress bar on) closed mid-run: the kernel
    sends SIGHUP and fails every later write to the terminal; the run still finishes its step, checkpoints it,
    writes an interrupted summary and releases its lock (it was killed at once, exit 129, before)."""
    run = tmp_path / "run"
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *SMALL, "trainer.steps=50",
                             f"zoo_cache={zoo_cache}", f"run_dir={run}"], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=_terminal_of_its_own)
    os.close(slave)
    try:
        read_until(master, "eval step 0")  # the initial evaluation is done: step 1 is under way
    finally:
        os.close(master)  # the terminal closes
    assert proc.wait(timeout=240) == 129
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGHUP"
    assert 1 <= summary["steps"] < 50
    assert summary["last_checkpoint"] == str(run / "checkpoints" / f"step_{summary['steps']:07d}.ckpt")
    assert torch.load(summary["last_checkpoint"], weights_only=False)["hacrl"]["steps_done"] == summary["steps"]
    assert not (run / LOCK_NAME).exists()


@pytest.mark.slow
def test_the_printed_continue_command_resumes_a_run_whose_directory_needs_quoting(tmp_path, zoo_cache):
    """A space (the shell), `=`, `,` and a non-ASCII letter (Hydra): the `continue with:` line, pasted into a shell
    (here: shlex.split), resumes the run to its end."""
    import shlex

    run = tmp_path / "my runs" / "lr=3e-4,é"
    proc = start_script([*SMALL, "trainer.steps=3", f"zoo_cache={zoo_cache}", f"run_dir='{run}'"])
    seen: list[str] = []
    wait_for(proc, "eval step 0", seen)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, (''.join(seen) + out)[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("continue with: ")]
    program, script, *args = shlex.split(line.removeprefix("continue with: "))
    assert (program, script) == ("python", "scripts/train.py") and args[-1] == f"resume='{run}'"
    resumed = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3 and summary["sessions"] == 2


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_end_and_its_clocks_add_up(tmp_path, zoo_cache):
    run = tmp_path / "run"
    proc = start_script([*SMALL, "trainer.steps=3", f"zoo_cache={zoo_cache}", f"run_dir={run}"])
    seen: list[str] = []
    wait_for(proc, "eval step 0", seen)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=240)
    assert proc.returncode == 143
    first = json.loads((run / "summary.json").read_text())

    summary = train(config(run, zoo_cache, "trainer.steps=3", f"resume={run}"))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["resumed_from"] == first["last_checkpoint"]
    assert summary["agents"]["tiny_a"]["optimizer_updates"] == 3 * UPDATES_PER_STEP
    assert summary["sessions"] == 2 and summary["started_at"] == first["started_at"]
    assert summary["wall_s"] >= summary["train_s"] > first["train_s"]
    assert summary["wall_s"] > first["wall_s"] - 1e-6  # the first session's time is counted (to its checkpoint)
    assert summary["ended_at"] >= first["ended_at"]


# --- run directories ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_into_a_run_directory_is_refused_and_overwrite_replaces_it(tmp_path, zoo_cache, script_main,
                                                                                 capsys):
    run = tmp_path / "run"
    train(config(run, zoo_cache, "trainer.steps=1"))
    before = snapshot(run)
    assert "run_config.json" in before and "checkpoints/step_0000001.ckpt" in before

    args = [*SMALL, "agents=[tiny_a,tiny_c]", "trainer.steps=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    assert script_main("train")(args) == 2
    err = capsys.readouterr().err
    assert "run_dir" in err and "already holds a run" in err and f"resume={run}" in err and "overwrite=true" in err
    assert snapshot(run) == before  # nothing read, nothing written

    assert script_main("train")([*args, "overwrite=true"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["agents"]) == ["tiny_a", "tiny_c"]
    assert json.loads((run / "run_config.json").read_text())["agents"].keys() == {"tiny_a", "tiny_c"}
    keys = weights(run / "checkpoints" / "step_0000001.ckpt").keys()  # the first run's checkpoint is gone
    assert any("tiny_c" in key for key in keys) and not any("tiny_b" in key for key in keys)


def train_script(args: list[str]) -> subprocess.CompletedProcess:
    """`python scripts/train.py args` to its end (a real process, as a user runs it)."""
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def users_project(directory: Path) -> None:
    """A user's own directory, with the generic names a run also writes (config.yaml, checkpoints/)."""
    (directory / "src").mkdir(parents=True)
    (directory / "src" / "main.py").write_text("print('mine')\n")
    (directory / "notes.txt").write_text("keep me")
    (directory / "config.yaml").write_text("lr: 0.1\n")
    (directory / "checkpoints").mkdir()
    (directory / "checkpoints" / "model.pt").write_bytes(b"weights of mine")


@pytest.mark.slow
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "plain"])
def test_a_users_own_directory_is_refused_untouched_even_with_overwrite(tmp_path, zoo_cache, overwrite):
    own = tmp_path / "mine"
    users_project(own)
    before = snapshot(own)
    proc = train_script([*SMALL, "trainer.steps=1", f"zoo_cache={zoo_cache}", f"run_dir={own}",
                         *(["overwrite=true"] if overwrite else [])])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "not a run" in proc.stderr and "notes.txt" in proc.stderr
    assert "nothing was changed" in proc.stderr and "resume=" not in proc.stderr  # no fix that cannot work
    assert snapshot(own) == before and sorted(p.name for p in own.iterdir()) == [
        "checkpoints", "config.yaml", "notes.txt", "src"]


@pytest.mark.slow
def test_overwrite_deletes_only_what_the_run_wrote_and_keeps_the_users_files(tmp_path, zoo_cache):
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    assert train_script(args).returncode == 0
    first = (run / "run_config.json").stat().st_mtime_ns
    (run / "notes.txt").write_text("my notes on this run")
    (run / "analysis").mkdir()
    (run / "analysis" / "plot.py").write_text("import this\n")

    proc = train_script([*args, "agents=[tiny_a,tiny_c]", "overwrite=true"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "kept analysis, notes.txt (not written by a run)" in proc.stderr
    assert (run / "notes.txt").read_text() == "my notes on this run"
    assert (run / "analysis" / "plot.py").read_text() == "import this\n"
    assert (run / "run_config.json").stat().st_mtime_ns != first
    assert json.loads((run / "summary.json").read_text())["agents"].keys() == {"tiny_a", "tiny_c"}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000001.ckpt"]
    assert not any("tiny_b" in key for key in weights(run / "checkpoints" / "step_0000001.ckpt"))


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_a_run_directory_in_use_by_another_process_is_refused(tmp_path, zoo_cache):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from hacrl_lightning.run_dir import claim_run_dir\n"
        f"claim = claim_run_dir({str(run)!r}, resuming=False, overwrite=False)\n"
        "print('held', flush=True); time.sleep(120)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid}"):
            train(config(run, zoo_cache, "trainer.steps=1"))
    finally:
        holder.kill()
        holder.wait()
    summary = train(config(run, zoo_cache, "trainer.steps=1"))  # the lock died with its holder
    assert summary["status"] == "completed"


def test_a_failure_before_training_leaves_no_run_directory(tmp_path, zoo_cache):
    """A model directory that passes the preflight (config.json, tokenizer) but holds no weights."""
    from hacrl_lightning.zoo import ensure_built

    source = ensure_built("tiny_a", cache_dir=zoo_cache)
    broken = tmp_path / "no_weights"
    broken.mkdir()
    for file in Path(source).iterdir():
        if file.is_file() and not file.name.endswith((".safetensors", ".bin")):
            (broken / file.name).write_bytes(file.read_bytes())
    run = tmp_path / "run"
    cfg = config(run, zoo_cache, "trainer.steps=1", f"agents.tiny_a.model={broken}")
    with pytest.raises(AgentLoadError, match="no file named model.safetensors"):
        train(cfg)
    assert not run.exists()


def test_a_failure_in_the_fits_set_up_leaves_no_run_directory(tmp_path, zoo_cache):
    """The vLLM engines are made in the DataModule's setup, inside `trainer.fit`: without vllm (this
    machine; the preflight would refuse it, `train` is called directly here) the fit fails before training."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    run = tmp_path / "run"
    with pytest.raises(Exception, match="vllm"):
        train(config(run, zoo_cache, "trainer.steps=1", "rollout=vllm"))
    assert not run.exists()


# --- resume: what may change ------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_changes_refuse_what_alters_the_run_and_record_the_rest(zoo_cache, tmp_path):
    saved = config_dict(config(tmp_path, zoo_cache, "trainer.steps=4"))
    same = config(tmp_path, zoo_cache, "trainer.steps=4", "trainer.eval_every=2", "trainer.log_every=3",
                  "data.reward_workers=1", f"resume={tmp_path}")
    problems, changes = resume_changes(saved, same, at_step=2, completed=False)
    assert problems == []
    assert changes == {"trainer.eval_every": (0, 2), "trainer.log_every": (1, 3), "data.reward_workers": (None, 1)}

    altered = config(tmp_path, zoo_cache, "trainer.steps=4", "rollout.group_size=4", "agents.tiny_b.lr=7e-4",
                     "algorithm=gspo_x2", "data.prompts_per_step=8")
    problems, _ = resume_changes(saved, altered, at_step=2, completed=False)
    keys = {problem.key for problem in problems}
    assert {"rollout.group_size", "agents.tiny_b.lr", "algorithm.name", "data.prompts_per_step"} <= keys
    assert all(p.fix.startswith(f"resume with {p.key}=") for p in problems if p.key == "rollout.group_size")

    other_agents = config(tmp_path, zoo_cache, "trainer.steps=4", "agents=[tiny_a,tiny_c]")
    problems, _ = resume_changes(saved, other_agents, at_step=2, completed=False)
    assert [p.key for p in problems] == ["agents"]  # one problem for the set, not one per field

    problems, _ = resume_changes(saved, config(tmp_path, zoo_cache, "trainer.steps=1"), at_step=2, completed=False)
    assert [p.key for p in problems] == ["trainer.steps"]
    problems, _ = resume_changes(saved, config(tmp_path, zoo_cache, "trainer.steps=4"), at_step=4, completed=True)
    assert [p.key for p in problems] == ["trainer.steps"] and "extend" in problems[0].allowed
    problems, _ = resume_changes(saved, config(tmp_path, zoo_cache, "trainer.steps=6"), at_step=4, completed=True)
    assert problems == []


def test_a_run_saved_before_a_setting_existed_resumes_with_the_old_behaviour(zoo_cache, tmp_path):
    """A `run_config.json` written before `algorithm.dual_clip_c`, `algorithm.rollout_is_cap`,
    `data.filter_overlong_prompts`, `data.rewards`, `agent_defaults` and the paper-code settings existed: its run
    trained without them (`setting(implied=)`, `config.implied_values`). Today's defaults change two of them, and
    the resume says which values keep the run as it was; with those it resumes."""
    saved = config_dict(config(tmp_path, zoo_cache, "trainer.steps=4"))
    for section, key in (("algorithm", "dual_clip_c"), ("algorithm", "rollout_is_cap"), ("data", "filter_overlong_prompts"),
                         ("data", "rewards"), ("algorithm", "learner_order"), ("algorithm", "partner_advantage_span"),
                         ("algorithm", "kl_agg_mode")):
        del saved[section][key]
    del saved["agent_defaults"]
    problems, _ = resume_changes(saved, config(tmp_path, zoo_cache, "trainer.steps=4"), at_step=2, completed=False)
    assert {p.key: p.fix.split(",")[0] for p in problems} == {
        "algorithm.dual_clip_c": "resume with algorithm.dual_clip_c=null",
        "data.filter_overlong_prompts": "resume with data.filter_overlong_prompts=false"}
    kept = config(tmp_path, zoo_cache, "trainer.steps=4", "algorithm.dual_clip_c=null", "data.filter_overlong_prompts=false")
    assert resume_changes(saved, kept, at_step=2, completed=False) == ([], {})


@pytest.mark.slow
def test_a_larger_trainer_steps_extends_a_finished_run_exactly(tmp_path, zoo_cache):
    straight = train(config(tmp_path / "straight", zoo_cache, "trainer.steps=3"))
    run = tmp_path / "run"
    train(config(run, zoo_cache, "trainer.steps=2"))
    with pytest.raises(ConfigError, match="trainer.steps"):  # the run has finished: nothing to do
        train(config(run, zoo_cache, "trainer.steps=2", f"resume={run}"))
    with pytest.raises(ConfigError, match="rollout.group_size"):
        train(config(run, zoo_cache, "trainer.steps=3", "rollout.group_size=4", f"resume={run}"))
    extended = train(config(run, zoo_cache, "trainer.steps=3", "trainer.eval_every=3", f"resume={run}"))
    assert extended["status"] == "completed" and extended["steps"] == 3
    assert extended["resume_changes"] == {"trainer.steps": [2, 3], "trainer.eval_every": [0, 3]}
    for name in ("tiny_a", "tiny_b"):
        assert extended["agents"][name]["optimizer_updates"] == straight["agents"][name]["optimizer_updates"]
    want, got = weights(latest_checkpoint(tmp_path / "straight")), weights(latest_checkpoint(run))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.slow
def test_an_extension_killed_while_exporting_resumes_at_its_own_length(tmp_path, zoo_cache):
    """An extension (2 -> 3 steps) killed after its last checkpoint, while exporting: the summary on disk is still
    the first session's ("completed", 2 steps; it is written after the exports). `resume=` with trainer.steps=3 is
    the run's own length, not a finished run's: it exports and completes (it was refused, "set trainer.steps=4")."""
    run = tmp_path / "run"
    train(config(run, zoo_cache, "trainer.steps=2"))
    first_summary = (run / "summary.json").read_text()
    train(config(run, zoo_cache, "trainer.steps=3", f"resume={run}"))
    (run / "summary.json").write_text(first_summary)  # the state a kill during the extension's export leaves
    summary = train(config(run, zoo_cache, "trainer.steps=3", f"resume={run}"))
    assert summary["status"] == "completed" and summary["steps"] == 3


@pytest.mark.slow
def test_resume_from_another_runs_checkpoint_forks_and_never_writes_into_that_run(tmp_path, zoo_cache):
    source = tmp_path / "source"
    train(config(source, zoo_cache, "trainer.steps=2", "trainer.checkpoint_every=1"))
    before = snapshot(source)
    fork = tmp_path / "fork"
    summary = train(config(fork, zoo_cache, "trainer.steps=3", f"resume={source / 'checkpoints' / 'step_0000001.ckpt'}"))
    assert snapshot(source) == before
    assert summary["steps"] == 3 and summary["resumed_from"].endswith("source/checkpoints/step_0000001.ckpt")
    assert sorted(p.name for p in (fork / "checkpoints").iterdir()) == ["step_0000003.ckpt"]
    assert (fork / "run_config.json").is_file() and (fork / "summary.json").is_file()


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_with_a_message_and_kept_aside(tmp_path, zoo_cache, capsys):
    run = tmp_path / "run"
    # the minutes cadence (here a few milliseconds) checkpoints after every step without checkpoint_every
    first = train(config(run, zoo_cache, "trainer.steps=2", "trainer.checkpoint_minutes=0.0001"))
    assert first["status"] == "completed"
    newest = run / "checkpoints" / "step_0000002.ckpt"
    assert sorted(p.name for p in newest.parent.iterdir()) == ["step_0000001.ckpt", "step_0000002.ckpt"]
    os.truncate(newest, newest.stat().st_size // 2)  # a full disk or a bad copy, after the rename

    summary = train(config(run, zoo_cache, "trainer.steps=3", f"resume={run}"))
    err = capsys.readouterr().err
    assert f"{newest} does not load" in err and "step_0000001.ckpt instead" in err
    assert summary["resumed_from"].endswith("step_0000001.ckpt")
    assert summary["skipped_checkpoints"] == [str(newest)]
    assert summary["steps"] == 3 and summary["agents"]["tiny_a"]["optimizer_updates"] == 3 * UPDATES_PER_STEP
    assert sorted(p.name for p in newest.parent.iterdir()) == [  # kept aside, where no later resume picks it
        "step_0000001.ckpt", "step_0000002.ckpt.damaged", "step_0000003.ckpt"]
    assert latest_checkpoint(run).name == "step_0000003.ckpt"


def test_the_default_config_checkpoints_on_a_time_cadence():
    assert TrainConfig().trainer.checkpoint_minutes == 15.0


@pytest.mark.slow
def test_sigterm_to_rank_zero_stops_both_ranks_after_the_same_step_and_the_run_resumes(tmp_path, zoo_cache):
    """2 gloo ranks with per-agent FSDP2 (tests/fsdp_run.py, a checkpoint every step): SIGTERM reaches only the
    launching process (rank zero); the stop decision is all-reduced, so rank one stops after the same step. The
    updates are planned over the global batch (n·P/mini_batch_prompts = 2·4/2 per learner and step, not P/2 per
    rank), the checkpoint is a distributed one, and the resume continues it on both ranks."""
    script, run = str(REPO / "tests" / "fsdp_run.py"), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, script, str(run), str(zoo_cache), "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step_0000001.ckpt").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no step-1 checkpoint within 240 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]  # fsdp_run.py returns the summary's run, not the CLI's exit code
    done = [line for line in out.splitlines() if line.startswith("RANK-DONE")]
    assert len(done) == 2 and done[0] == done[1], out[-3000:]  # same steps and updates on both ranks
    summary = json.loads((run / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM" and 1 <= steps < 30
    assert done[0] == f"RANK-DONE steps={steps} updates={[UPDATES_PER_STEP * steps] * 2}"
    assert summary["last_checkpoint"] == str(run / "checkpoints" / f"step_{steps:07d}.ckpt")
    assert Path(summary["last_checkpoint"]).is_dir()  # a distributed checkpoint, one shard per rank

    resumed = subprocess.run([sys.executable, script, str(run), str(zoo_cache), str(steps + 1), "resume"],
                             capture_output=True, text=True, timeout=300, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count(f"RANK-DONE steps={steps + 1}") == 2
    assert latest_checkpoint(run).name == f"step_{steps + 1:07d}.ckpt"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["sessions"] == 2
    assert all(summary["agents"][name]["export"] for name in ("tiny_a", "tiny_b"))  # an interrupted run's resume exports


# --- the end-of-fit exports: every rank agrees on how they end -------------------------------------------------


@pytest.mark.slow
def test_a_failed_export_fails_the_run_with_its_reason_and_resume_exports_again(tmp_path, zoo_cache):
    """One process: the export of tiny_a meets a file of someone else's. The run fails with one message naming the
    agent, the reason and `resume=`; summary.json says failed; the checkpoint is kept; once the file is gone, resume
    trains nothing more and exports both agents."""
    from conftest import ForeignExport
    from hacrl_lightning.training import ExportFailed

    run = tmp_path / "run"
    cfg = config(run, zoo_cache, "trainer.steps=1", "trainer.export_agents=true")
    with pytest.raises(ExportFailed, match=r"the export of tiny_a failed \(FileExistsError: .*resume="):
        train(cfg, extra_callbacks=[ForeignExport(run, "tiny_a")])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("ExportFailed: the export of tiny_a failed")
    assert latest_checkpoint(run).name == "step_0000001.ckpt" and not (run / LOCK_NAME).exists()
    (run / "exports" / "tiny_a" / "notes.txt").unlink()
    summary = train(config(run, zoo_cache, "trainer.steps=1", "trainer.export_agents=true", f"resume={run}"))
    assert summary["status"] == "completed" and summary["steps"] == 1
    assert all(summary["agents"][name]["export"] for name in ("tiny_a", "tiny_b"))
    assert (run / "exports" / "tiny_a" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["signal_in_export", "foreign_export"])
def test_on_two_ranks_a_signal_or_a_failure_in_rank_zeros_export_ends_both_ranks_alike(tmp_path, zoo_cache, how):
    """2 gloo ranks, per-agent FSDP2 (tests/fsdp_run.py): each export is a collective (the ranks gather it, rank zero
    writes). A SIGTERM to rank zero as tiny_a's export starts, or a failure of its write there, ended only rank zero
    at once, and rank one waited in the next gather. Now the export under way finishes, the ranks agree, and both
    stop the same way: interrupted (the signal) or failed (the reason, naming rank zero). After the failure, resume
    exports both (one resume: after the signal it is the SIGTERM test's resume above, which exports as well)."""
    script, run = str(REPO / "tests" / "fsdp_run.py"), tmp_path / "run"
    proc = subprocess.run([sys.executable, script, str(run), str(zoo_cache), "1", how], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    out = proc.stdout + proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    if how == "signal_in_export":
        assert proc.returncode == 0 and out.count("RANK-DONE steps=1") == 2, out[-3000:]
        assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM" and summary["steps"] == 1
        assert "SIGTERM received: finishing this agent's export, then stopping" in out
    else:
        assert proc.returncode != 0 and "RANK-DONE" not in out, out[-3000:]
        assert out.count("the export of tiny_a on rank 0 failed (FileExistsError") >= 2, out[-3000:]  # both ranks
        assert summary["status"] == "failed" and summary["error"].startswith("ExportFailed: the export of tiny_a on "
                                                                             "rank 0 failed")
        (run / "exports" / "tiny_a" / "notes.txt").unlink()
        resumed = subprocess.run([sys.executable, script, str(run), str(zoo_cache), "1", "resume"],
                                 capture_output=True, text=True, timeout=300, cwd=REPO)
        assert resumed.returncode == 0 and resumed.stdout.count("RANK-DONE steps=1") == 2, resumed.stderr[-3000:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert all(summary["agents"][name]["export"] for name in ("tiny_a", "tiny_b"))
