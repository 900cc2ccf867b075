"""An export under `trainer.placement=split` gathers every weight on every rank of the agent's group, in the same
order: the ranks decided which gathers to enter by their local storage, which an empty shard lacks, so a rank whose
shards of two weights were both empty skipped a gather the others entered, and the processes aborted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_an_export_gathers_weights_whose_shards_are_empty_on_a_rank_and_keeps_ties():
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
                          str(REPO / "tests" / "split_export.py")], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("SPLIT-EXPORT-DONE") == 3
    # the case the test is for: rank 1 holds empty shards of both one-row weights
    assert "SPLIT-EXPORT rank=1 empty=first,second" in run.stdout, run.stdout
