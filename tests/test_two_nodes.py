"""Two nodes rehearsed on this machine: `trainer.num_nodes=2 trainer.devices=1` makes the one-rank update.

Each "node" is a process of its own, started as a cluster without a scheduler starts one per machine:
`python tests/dist_equivalence.py replay-nodes ...` with the environment Lightning reads (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, NODE_RANK; Lightning's default cluster environment), so the two join one
gloo world of 2 through `trainer.num_nodes`, not through `trainer.devices`. The comparison is
tests/test_distributed.py's: one HACPO step recorded on one process, replayed with its sampled token ids
on the two nodes; the gradients of every update agree within GRAD_RTOL of their norm, and each run's
weights are AdamW applied to its own recorded gradients. docs/training.md#several-nodes shows the same
launch under SLURM.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_distributed import GRAD_RTOL, REPLAY_ATOL, adamw_replay, flat, updates_m

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "tests" / "dist_equivalence.py")
CASE = "hacpo"  # 9-response mini-batches split 5/4 over the two nodes: node 1 pads with a dummy pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(equivalence_record, zoo_cache):
    out = equivalence_record  # the session's one-process record of every case (tests/conftest.py)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    # NODE_RANK alone, as Lightning's plain environment has it: the run directory is claimed before Lightning
    # starts, by the rank `placement.launch_rank` derives from it (with RANK read first, both nodes took
    # themselves for rank 0 and, on one filesystem, the second was refused the run directory's lock)
    nodes = [subprocess.Popen([sys.executable, SCRIPT, "replay-nodes", str(out), str(zoo_cache), CASE], cwd=REPO,
                              env={**env, "NODE_RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:  # one node failing leaves the other waiting for it at the rendezvous
            if node.poll() is None:
                node.kill()
    for node, (stdout, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
        assert "EQUIVALENCE-DONE" in stdout
    load = lambda name: torch.load(out / name, weights_only=False)[CASE]  # noqa: E731
    return load("record.pt"), load("replay-nodes.pt"), load("replay-nodes_rank1.pt")


@pytest.mark.slow
def test_the_two_processes_are_two_nodes_of_one_world(runs):
    _, node0, node1 = runs
    assert node0["layout"] == {"num_nodes": 2, "node_rank": 0, "world_size": 2, "global_rank": 0}
    assert node1["layout"] == {"num_nodes": 2, "node_rank": 1, "world_size": 2, "global_rank": 1}


def test_two_nodes_make_the_one_rank_update(runs):
    one, two, _ = runs
    assert one["updates"] == two["updates"] == {"tiny_a": 4, "tiny_b": 4}
    assert one["responses"] == two["responses"]
    assert one["capability"] == two["capability"]
    for name in ("tiny_a", "tiny_b"):
        assert updates_m(one["m"][name]) == updates_m(two["m"][name]) == [0, 1, 2, 3]
        for u, (theirs, mine) in enumerate(zip(one["grads"][name], two["grads"][name], strict=True)):
            assert mine["grads"].keys() == theirs["grads"].keys() and mine["hparams"] == theirs["hparams"]
            reference = flat(theirs["grads"])
            if reference.norm() == 0:
                assert flat(mine["grads"]).norm() == 0, f"{name} update {u}"
                continue
            difference = (flat(mine["grads"]) - reference).norm() / reference.norm()
            assert difference <= GRAD_RTOL, f"{name} update {u}: gradients differ by {difference:.2e} of their norm"


@pytest.mark.parametrize("run", [0, 1], ids=["one_rank", "two_nodes"])
def test_the_weights_are_adamw_applied_to_the_recorded_gradients(runs, run):
    result = runs[run]
    for name in ("tiny_a", "tiny_b"):
        replayed = adamw_replay(result["initial_weights"][name], result["grads"][name])
        for key in result["grads"][name][0]["grads"]:
            torch.testing.assert_close(result["weights"][name][key].double(), replayed[key], atol=REPLAY_ATOL, rtol=0,
                                       msg=f"{name}.{key}")
