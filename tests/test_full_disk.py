"""A full disk costs a run nothing already saved: real small filesystems, real runs.

Each test mounts a real filesystem of a few megabytes (a tmpfs; a loop-mounted ext4 image where a tmpfs
cannot be mounted) and trains the tiny zoo pair into it: a checkpoint of the pair is 5.3 MB. On main a run
into a 3 MB filesystem ended with two chained tracebacks, no summary, and a 3.1 MB `.partial` that kept
the disk full, after which neither a re-run nor `resume=` was accepted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from hacrl_lightning.callbacks.checkpoint import CheckpointNotSaved, damage, save_atomically
from hacrl_lightning.cli import compose_config
from hacrl_lightning.run_dir import LOCK_NAME
from hacrl_lightning.training import train

REPO = Path(__file__).resolve().parents[1]
SMALL = ["agents=[tiny_a,tiny_b]", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
         "trainer.eval_every=0", "data.eval_size=4", "trainer.export_agents=false", "trainer.micro_batch_size=8"]


def _mount(directory: Path, megabytes: int) -> str | None:
    """Mount a filesystem of `megabytes` at `directory`: a tmpfs, else a loop-mounted ext4 image. None when
    one is mounted, else what was tried and how it failed (for the skip)."""
    image = directory.with_suffix(".img")
    attempts = [[["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(directory)]],
                [["truncate", "-s", f"{megabytes}M", str(image)], ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
                 ["mount", "-o", "loop", str(image), str(directory)]]]
    tried = []
    for commands in attempts:
        for command in commands:
            try:
                result = subprocess.run(command, capture_output=True, text=True)
            except FileNotFoundError as err:
                result = subprocess.CompletedProcess(command, 127, "", str(err))
            if result.returncode != 0:
                tried.append(f"`{' '.join(command)}`: {result.stderr.strip() or result.returncode}")
                break
        else:
            return None
    return "; ".join(tried)


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(megabytes)`: the mount point of a real filesystem that small, unmounted at teardown."""
    mounted = []

    def make(megabytes: int) -> Path:
        directory = tmp_path / f"disk{len(mounted)}"
        directory.mkdir()
        failure = _mount(directory, megabytes)
        if failure:
            pytest.skip(f"no small filesystem could be mounted here (tried {failure})")
        mounted.append(directory)
        return directory

    yield make
    for directory in mounted:
        if subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def run_script(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_full_disk_fails_the_run_cleanly_and_resume_continues_once_space_is_freed(small_disk, zoo_cache):
    """16 MB with 8 MB taken by another file: step 1's checkpoint fits, step 2's does not. The run ends with
    one message (exit 1), a `failed` summary, step 1's checkpoint intact and no partial file; once the other
    file is gone, `resume=` finishes the run."""
    disk = small_disk(16)
    ballast = disk / "someone_elses_file"
    ballast.write_bytes(bytes(8_000_000))
    run = disk / "run"
    args = [*SMALL, "trainer.steps=2", "trainer.checkpoint_every=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    result = run_script(args)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "checkpoint of step 2 not saved" in error and "MB free" in error
    assert "step_0000001.ckpt, is intact" in error and f"resume={run}" in error
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("CheckpointNotSaved: checkpoint of step 2")
    assert summary["last_checkpoint"] == str(run / "checkpoints" / "step_0000001.ckpt")
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001.ckpt"]
    assert damage(run / "checkpoints" / "step_0000001.ckpt") is None
    assert not list(run.rglob("*.partial")) and not list(run.rglob("*.tmp")) and not (run / LOCK_NAME).exists()

    ballast.unlink()  # space is freed
    resumed = run_script([*args, f"resume={run}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["resumed_from"] == str(run / "checkpoints" / "step_0000001.ckpt")


class SaveInto(Callback):
    """After step 1: a real `save_atomically` of the run's state to `path`, with no space check before it
    (as when another writer fills the disk during the save); the error it raised is kept."""

    def __init__(self, path: Path):
        self.path, self.error = path, None

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if pl_module.steps_done == 1:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                save_atomically(trainer, self.path)
            except CheckpointNotSaved as err:
                self.error = err


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_is_refused_or_removed_and_the_disk_is_not_left_full(small_disk, zoo_cache):
    """The issue's 3 MB filesystem: a write that runs out of space removes its partial file; the run's own
    save is refused before it writes (no checkpoint fits), and the run fails saying to start again."""
    disk = small_disk(3)
    run = disk / "run"
    probe = SaveInto(run / "checkpoints" / "step_0000001.ckpt")
    cfg, _ = compose_config([*SMALL, "trainer.steps=2", f"zoo_cache={zoo_cache}", f"run_dir={run}"])
    with pytest.raises(CheckpointNotSaved, match=r"checkpoint of step 2 not saved .* MB free; nothing of it is left "
                                                 r"on disk\. No checkpoint was saved before it.*overwrite=true"):
        train(cfg, extra_callbacks=[probe])
    assert probe.error is not None and "No space left on device" in str(probe.error)
    assert list((run / "checkpoints").iterdir()) == []  # neither the probe's partial nor the run's
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last_checkpoint"] is None
    assert shutil.disk_usage(disk).free > 2_500_000  # nothing is left that keeps the disk full


def test_a_distributed_checkpoint_that_runs_out_of_space_is_a_failed_write_not_a_crash(small_disk):
    """FSDP2's checkpoints are torch's distributed checkpoints, which raise `CheckpointException` on a full disk: a
    BaseException wrapping each rank's error, not an OSError. It escaped the clean `CheckpointNotSaved` path and
    left its `.partial` behind. Real DCP, one process, 8 MB into a 2 MB filesystem."""
    import torch
    import torch.distributed.checkpoint as dcp

    from torch.distributed.checkpoint.api import CheckpointException

    from hacrl_lightning.callbacks.checkpoint import _attempt, _reason

    disk = small_disk(2)
    error = _attempt(lambda: dcp.save({"w": torch.zeros(2_000_000)}, checkpoint_id=disk / "step_0000001.ckpt.partial"))
    assert isinstance(error, CheckpointException)  # returned, not raised past the caller
    reason = _reason(error)
    assert reason.startswith("rank 0: ") and "\n" not in reason and "Traceback" not in reason, reason
    shutil.rmtree(disk / "step_0000001.ckpt.partial")  # what save_atomically does next: the disk has room again
    assert _attempt(lambda: dcp.save({"w": torch.zeros(10)}, checkpoint_id=disk / "small")) is None


def test_a_stale_partial_of_another_step_is_removed_before_the_next_save(tmp_path):
    """A `.partial` left by a killed or failed write (a file, or a distributed checkpoint's directory) takes space
    the next save needs; it is removed before the space is measured, and complete checkpoints are kept."""
    from hacrl_lightning.callbacks.checkpoint import StepCheckpoint

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "step_0000001.ckpt").write_bytes(b"x" * 100)
    (directory / "step_0000002.ckpt.partial").write_bytes(b"x" * 50)
    (directory / "weights_step_0000002.ckpt.partial").mkdir()
    (directory / "weights_step_0000002.ckpt.partial" / "__0_0.distcp").write_bytes(b"x" * 50)
    keeper = StepCheckpoint(directory, every=1, steps=3)
    assert keeper._make_room(first_estimate=10**15) is None  # the estimate is the newest checkpoint's size
    assert sorted(p.name for p in directory.iterdir()) == ["step_0000001.ckpt"]
