"""Nothing is lost or refused after the fact at a run's end and in its checkpoints (the fourth round of hostile
inputs, 2026-11-28): the summary is written before `trainer.keep_at_end` deletes anything, an out-of-range `TZ`
never fails a finished run, checkpoints are written where they live (not first in a small `$TMPDIR`), an unwritable
`checkpoints/` is refused before a step is trained, a file size limit is told from a full disk, and a run_dir
name too long for the filesystem is one line.

One run is shared (module-scoped, in process): the tiny zoo pair, 2 steps, `keep_at_end=exports`, `$TMPDIR` on a
real 1 MB tmpfs (a checkpoint of the pair is 5.3 MB) and `TZ=UTC+24:30`, with its summary's write made to fail
once; the tests then resume it, and refuse it with a read-only `checkpoints/`.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from hacrl_lightning import training
from hacrl_lightning.callbacks.checkpoint import LocalCheckpointIO, _cause, damage, not_saved_message, \
    size_limit_shortfall
from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError, RunFailed
from hacrl_lightning.run_dir import claim_run_dir
from hacrl_lightning.training import _iso, checkpoints_problem, train

from test_full_disk import SMALL, _mount

BAD_TZ = "UTC+24:30"


def _set_tz(value: str | None) -> None:
    if value is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = value
    time.tzset()


def test_an_out_of_range_tz_is_written_in_utc_not_a_failure():
    """`datetime` refuses an offset of 24 h or more; the summary's times fall back to UTC with their offset."""
    before = os.environ.get("TZ")
    try:
        _set_tz(BAD_TZ)
        stamp = _iso(1_800_000_000.0)
    finally:
        _set_tz(before)
    assert stamp == "2027-01-15T08:00:00+00:00"
    assert _iso(1_800_000_000.0).startswith("2027-01-15T")  # a usable zone still writes its own offset


@pytest.fixture(scope="module")
def hostile_end(tmp_path_factory, zoo_cache):
    """The shared run (module docstring). Yields (run dir, compose args, the RunFailed of the first session)."""
    root = tmp_path_factory.mktemp("run_end")
    small_tmp = root / "tmp"
    small_tmp.mkdir()
    failure = _mount(small_tmp, 1)
    if failure:
        pytest.skip(f"no small filesystem could be mounted here (tried {failure})")
    run = root / "run"
    args = [*SMALL, "trainer.steps=2", "trainer.checkpoint_every=1", "trainer.keep_at_end=exports",
            "trainer.export_agents=true", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    saved = tempfile.tempdir, os.environ.get("TZ"), os.environ.get("TMPDIR"), training._write_summary
    calls = []

    def summary_fails_once(trainer, run_dir, summary):
        calls.append(summary)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error", str(run_dir / "summary.json"))
        return saved[3](trainer, run_dir, summary)

    try:
        tempfile.tempdir, os.environ["TMPDIR"] = str(small_tmp), str(small_tmp)
        _set_tz(BAD_TZ)
        training._write_summary = summary_fails_once
        cfg, _ = compose_config(args)
        with pytest.raises(RunFailed) as first:
            train(cfg)
        yield run, args, first.value
    finally:
        tempfile.tempdir = saved[0]
        training._write_summary = saved[3]
        _set_tz(saved[1])
        if saved[2] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[2]
        if subprocess.run(["umount", str(small_tmp)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(small_tmp)], capture_output=True)


@pytest.mark.slow
def test_a_read_only_checkpoints_folder_is_refused_before_a_step_is_trained(hostile_end):
    """Found after a step was trained, with the full-disk advice, before; now one line before training, naming the
    folder and the fix (a read-only bind mount: root writes through permission bits). Runs before the resume below,
    while the shared run's step-1 checkpoint is there to resume from."""
    run, args, _ = hostile_end
    folder = run / "checkpoints"
    before = (run / "summary.json").read_bytes() if (run / "summary.json").exists() else None
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True, capture_output=True)
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
            pytest.skip("a read-only bind mount is not allowed here")
        assert checkpoints_problem(run) is not None
        cfg, _ = compose_config([*args, f"resume={run}"])
        with pytest.raises(ConfigError) as refused:
            train(cfg)
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)
    (problem,) = refused.value.problems
    assert problem.key == "run_dir" and f"cannot write {folder} (Read-only file system)" in problem.fix
    assert "nothing was trained" in problem.fix and "chmod u+w" in problem.fix
    assert [p.name for p in folder.iterdir()] == ["step_0000001.ckpt"]
    after = (run / "summary.json").read_bytes() if (run / "summary.json").exists() else None
    assert after == before


@pytest.mark.slow
def test_a_summary_that_cannot_be_written_deletes_no_checkpoint_and_resume_finishes(hostile_end):
    """keep_at_end=exports used to delete the checkpoints before the summary: a failure in between left neither.
    Now the step-1 checkpoint (written with `$TMPDIR` far smaller than it) is kept, the one line names the cause
    and `resume=`, and that resume finishes the run: summary first (UTC times), then the checkpoints go."""
    run, args, error = hostile_end
    message = str(error)
    assert message.startswith(f"summary.json not written in {run} (OSError: ") and "Input/output error" in message
    assert "checkpoints are kept" in message and f"resume={run}" in message
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001.ckpt"]
    assert damage(run / "checkpoints" / "step_0000001.ckpt") is None
    assert not (run / "summary.json").exists()

    cfg, _ = compose_config([*args, f"resume={run}"])
    saved = tempfile.tempdir, os.environ.get("TZ")
    try:
        tempfile.tempdir = str(run.parent / "tmp")  # still the 1 MB tmpfs
        _set_tz(BAD_TZ)
        summary = train(cfg)
    finally:
        tempfile.tempdir = saved[0]
        _set_tz(saved[1])
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["resumed_from"] == str(run / "checkpoints" / "step_0000001.ckpt")
    assert summary["started_at"].endswith("+00:00") and summary["ended_at"].endswith("+00:00")
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["last_checkpoint"] is None
    assert list((run / "checkpoints").iterdir()) == []  # deleted only after the summary was written
    assert sorted(p.name for p in (run / "exports").iterdir()) == ["tiny_a", "tiny_b"]


def test_a_writable_or_missing_checkpoints_folder_is_no_problem(tmp_path):
    assert checkpoints_problem(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    assert checkpoints_problem(tmp_path) is None and list((tmp_path / "checkpoints").iterdir()) == []
    (tmp_path / "checkpoints").rmdir()
    (tmp_path / "checkpoints").write_text("a file, not a folder")
    problem = checkpoints_problem(tmp_path)
    assert problem is not None and f"cannot write {tmp_path / 'checkpoints'}" in problem.fix


def test_a_file_size_limit_is_told_from_a_full_disk(tmp_path):
    """`ulimit -f` killed the trainer (SIGXFSZ) or read as a full disk. With the limit set, the trainer ignores
    SIGXFSZ so the write fails with EFBIG; the check before a save and the failed write both name the limit and
    `ulimit -f unlimited`. A real limit, in this process, restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.getsignal(signal.SIGXFSZ)
    path = tmp_path / "checkpoints" / "step_0000001.ckpt.partial"
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
        training._file_size_limit_raises()
        assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
        with pytest.raises(OSError) as failed:
            LocalCheckpointIO().save_checkpoint({"w": torch.zeros(1_000_000)}, path)
        shortfall = size_limit_shortfall(4_000_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert failed.value.errno == errno.EFBIG and _cause(failed.value) == "limit"
    assert shortfall == ("it needs about 4.2 MB in one file and this process's file size limit (ulimit -f, "
                         "RLIMIT_FSIZE) is 0.2 MB")
    message = not_saved_message(path.with_name("step_0000001.ckpt"), "the write failed (File too large)", cause="limit")
    assert "not a full disk" in message and "ulimit -f unlimited" in message and "free space" not in message
    assert size_limit_shortfall(4_000_000) is None  # no limit: nothing to say
    assert _cause(OSError(errno.ENOSPC, "No space left on device")) == "space"
    assert _cause(OSError(errno.EROFS, "Read-only file system")) == "access"


def test_a_checkpoint_is_written_at_its_path_not_in_tmpdir(tmp_path, monkeypatch):
    """Lightning's save wrote the whole checkpoint into `$TMPDIR` first; `LocalCheckpointIO` writes only the path it
    is given (a `$TMPDIR` that does not exist is never touched)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no_such_tmp"))
    path = tmp_path / "checkpoints" / "step_0000001.ckpt.partial"
    LocalCheckpointIO().save_checkpoint({"w": torch.arange(10)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(10))
    assert not (tmp_path / "no_such_tmp").exists()


def test_a_run_dir_name_too_long_for_the_filesystem_is_one_line(tmp_path):
    long_name = "r" * 260
    with pytest.raises(ConfigError) as refused:
        claim_run_dir(tmp_path / long_name, resuming=False, overwrite=False)
    (problem,) = refused.value.problems
    assert problem.key == "run_dir" and "at most 255 bytes" in problem.allowed
    assert "is 260 bytes, too long for the filesystem; nothing was made: choose a run_dir with a shorter name" \
        in problem.fix
    assert list(tmp_path.iterdir()) == []
