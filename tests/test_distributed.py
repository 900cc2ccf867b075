"""Distributed equivalence: one step on 2 gloo ranks (FSDP2) makes the update one rank makes on the same global batch.

hacpo, gspo_x2, grpo and hacpo with a LoRA agent each train one step in fp32 on 1 process and on 2 processes
(`tests/dist_equivalence.py`: the 2-rank run replays the 1-rank run's sampled token ids, everything
else is the real path). Compared: optimizer updates and responses per learner, the m of each
update, the capability window, every logged rate, and the weights.

Tolerances. What legitimately differs is the order of fp32 sums (micro-batches of 2 vs 3 rows, gradients
averaged by FSDP's reduce-scatter), and how much that changes depends on the CPU's kernels (FMA or not,
vector width); so the bounds come from what is compared, not from one machine's figure.
The weights are not compared element by element: AdamW moves an element by lr * m/(sqrt(v)+eps), and
where a gradient is near zero that step's sensitivity to the gradient is up to lr/eps = 1e4, so a
last-bit difference of a near-zero gradient becomes a difference of up to about one update (lr, 1e-4) in
that weight (measured 2.6e-6 on one machine with an older zoo, 6.9e-5 here with today's). Instead, with
AdamW's normalisation accounted for:
- Each run's final weights are AdamW applied to its own recorded gradients, replayed in float64 from its
  initial weights (`adamw_replay`): agreement to `REPLAY_ATOL` = 1e-6, the fp32 rounding of 4
  updates to weights below 2 in size (at most 1.2e-7 each; measured 1.7e-7); a missing, extra or differently applied update is off by ~lr.
- The two runs' gradients agree, update by update: the 2-rank gradient of the whole agent differs from
  the 1-rank one by at most `GRAD_RTOL` = 1e-3 of its norm. Reordered fp32 sums change it by ~1e-7
  relative to the terms summed; measured here: 1e-7 to 1e-6 at the first update (same weights), at most
  1e-5 at later ones (which start from weights that differ as above), so 1e-3 leaves a factor 100 for
  another CPU. One tensor alone is no measure: a small gradient made of large cancelling terms moved by
  3.4e-3 of its own norm. A different mini-batch, advantage or loss term changes the gradient by O(1):
  two consecutive updates of one run differ by 0.99-4.3 of its norm (`test_the_gradient_bound_has_power`).
"""


from __future__ import annotations

import math
import subprocess
import sys
from itertools import groupby
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "tests" / "dist_equivalence.py")
GRAD_RTOL = 1e-3
REPLAY_ATOL = 1e-6


def adamw_replay(initial: dict, updates: list[dict]) -> dict:
    """torch.optim.AdamW's update rule in float64 over recorded `updates` ({"grads", "hparams"}), from
    `initial` weights: m, v moving averages with bias correction, decoupled weight decay."""
    weights = {k: w.double() for k, w in initial.items()}
    m = {k: torch.zeros_like(w) for k, w in weights.items()}
    v = {k: torch.zeros_like(w) for k, w in weights.items()}
    for t, update in enumerate(updates, start=1):
        h = update["hparams"]
        (b1, b2), lr = h["betas"], float(h["lr"])
        for key, grad in update["grads"].items():
            g = grad.double()
            m[key] = b1 * m[key] + (1 - b1) * g
            v[key] = b2 * v[key] + (1 - b2) * g * g
            step = (m[key] / (1 - b1**t)) / ((v[key] / (1 - b2**t)).sqrt() + h["eps"])
            weights[key] = weights[key] * (1 - lr * h["weight_decay"]) - lr * step
    return weights


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.double().flatten() for _, g in sorted(grads.items())])


@pytest.fixture(scope="module")
def recorded(equivalence_record):
    """The 1-process runs of every case, and their generations for the replays (one record per session)."""
    return equivalence_record


def replay(out: Path, zoo_cache, mode: str, ranks: int) -> list[dict]:
    """Every rank's results of `mode` on `ranks` gloo processes (torch's launcher)."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                          SCRIPT, mode, str(out), str(zoo_cache)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("EQUIVALENCE-DONE") == ranks  # every rank ran every case
    return [torch.load(out / (f"{mode}.pt" if rank == 0 else f"{mode}_rank{rank}.pt"), weights_only=False)
            for rank in range(ranks)]


@pytest.fixture(scope="module")
def runs(recorded, zoo_cache):
    load = lambda name: torch.load(recorded / name, weights_only=False)  # noqa: E731
    return (load("record.pt"), *replay(recorded, zoo_cache, "replay", 2))


def merged(shares: list[dict]) -> dict:
    """`trainer.placement=split`: each agent's weights, gradients and m from the first rank of its group; the
    step's figures (every agent's, gathered) from rank 0; what each rank held, in rank order."""
    out = {}
    for case in shares[0]:
        result = dict(shares[0][case])
        for key in ("initial_weights", "weights", "grads", "m"):
            result[key] = {}
            for share in reversed(shares):  # the lowest rank of a group wins
                result[key].update(share[case][key])
        result["held"] = [share[case]["held"] for share in shares]
        out[case] = result
    return out


@pytest.fixture(scope="module")
def split_runs(recorded, zoo_cache):
    """The same cases under `trainer.placement=split`: 2 agents on 2 ranks (one each), and on 4 ranks (two
    each, FSDP2 over each group's own mesh)."""
    return {"two_ranks": merged(replay(recorded, zoo_cache, "replay-split", 2)),
            "four_ranks": merged(replay(recorded, zoo_cache, "replay-split4", 4)),
            "unequal": merged(replay(recorded, zoo_cache, "replay-split3", 3))}


def updates_m(calls: list[int]) -> list[int]:
    """The m of each update: one entry per mini-batch (consecutive loss calls of one mini-batch share it)."""
    return [m for m, _ in groupby(calls)]


def assert_same_update(one: dict, two: dict, case: str, updates: int) -> None:
    """`two` made `one`'s update: the same updates, m, capability window, and gradients within GRAD_RTOL."""
    # docs/spec.md §7: n·P/mini_batch_prompts = 4 (hacpo: 2·6/3; gspo_x2: 2G responses, half-size
    # mini-batches: 2·4/2), P/mini_batch_prompts = 2 for grpo; today's main made half as many on 2 ranks
    assert one["updates"] == two["updates"] == {"tiny_a": updates, "tiny_b": updates}
    assert one["responses"] == two["responses"]
    for name in ("tiny_a", "tiny_b"):
        assert updates_m(one["m"][name]) == updates_m(two["m"][name]) == list(range(updates))
    assert one["capability"] == two["capability"]  # the window holds global-batch accuracies
    for name in ("tiny_a", "tiny_b"):
        assert len(one["grads"][name]) == len(two["grads"][name]) == updates
        for u, (theirs, mine) in enumerate(zip(one["grads"][name], two["grads"][name])):
            assert mine["grads"].keys() == theirs["grads"].keys() and mine["hparams"] == theirs["hparams"]
            reference = flat(theirs["grads"])
            if reference.norm() == 0:  # a mini-batch whose advantages are all zero
                assert flat(mine["grads"]).norm() == 0, f"{case}: {name} update {u}"
                continue
            difference = (flat(mine["grads"]) - reference).norm() / reference.norm()
            assert difference <= GRAD_RTOL, f"{case}: {name} update {u}: gradients differ by {difference:.2e} of their norm"


@pytest.mark.slow
@pytest.mark.parametrize("case, updates", [("hacpo", 4), ("gspo_x2", 4), ("grpo", 2), ("hacpo_lora", 4)])
def test_two_ranks_make_the_one_rank_update(runs, case, updates):
    assert_same_update(runs[0][case], runs[1][case], case, updates)


@pytest.mark.slow
@pytest.mark.parametrize("run", [0, 1], ids=["one_rank", "two_ranks"])
def test_a_lora_agent_under_fsdp2_moves_only_its_adapter_by_adamw(runs, run):
    """tiny_a with a LoRA adapter, FSDP2-sharded over 2 ranks (frozen base shards, adapter gradients reduced):
    every base weight bitwise as it started, every adapter weight AdamW applied to its recorded gradients."""
    result = runs[run]["hacpo_lora"]
    initial, final, grads = (result[key]["tiny_a"] for key in ("initial_weights", "weights", "grads"))
    adapters = {key for key in initial if ".lora_A." in key or ".lora_B." in key}
    assert adapters and set(grads[0]["grads"]) == adapters
    for key in initial.keys() - adapters:
        assert torch.equal(initial[key], final[key]), key
    replayed = adamw_replay(initial, grads)
    for key in adapters:
        assert not torch.equal(initial[key], final[key]), key
        torch.testing.assert_close(final[key].double(), replayed[key], atol=REPLAY_ATOL, rtol=0, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["two_ranks", "four_ranks", "unequal"])
@pytest.mark.parametrize("case, updates", [("hacpo", 4), ("gspo_x2", 4), ("grpo", 2), ("hacpo_lora", 4)])
def test_split_placement_makes_the_one_rank_update(runs, split_runs, layout, case, updates):
    """Each agent trained on its own group of ranks makes the update of the 1-process run: the rewards, the
    capability window and omega (the logged rates) are the global ones, and so are its gradients. `unequal`:
    tiny_a on 2 ranks, tiny_b on 1 (each group answers all prompts, in halves or whole)."""
    split = split_runs[layout][case]
    assert_same_update(runs[0][case], split, case, updates)
    assert_rates_equal(runs[0][case]["metrics"], split["metrics"])
    assert_same_cross_ratios(runs[0][case]["cross_ratios"], split["cross_ratios"])
    for name in ("tiny_a", "tiny_b"):
        replayed = adamw_replay(split["initial_weights"][name], split["grads"][name])
        for key in split["grads"][name][0]["grads"]:
            torch.testing.assert_close(split["weights"][name][key].double(), replayed[key], atol=REPLAY_ATOL, rtol=0)


@pytest.mark.slow
def test_under_split_each_rank_holds_only_its_own_agent(split_runs):
    """No weight, reference or buffer of another agent on a rank: groups are contiguous, in agent order."""
    for case in ("hacpo", "gspo_x2", "grpo"):
        assert split_runs["two_ranks"][case]["held"] == [["tiny_a"], ["tiny_b"]]
        assert split_runs["four_ranks"][case]["held"] == [["tiny_a"], ["tiny_a"], ["tiny_b"], ["tiny_b"]]
        assert split_runs["unequal"][case]["held"] == [["tiny_a"], ["tiny_a"], ["tiny_b"]]


@pytest.mark.parametrize("case", ["hacpo", "gspo_x2", "grpo"])
@pytest.mark.parametrize("run", [0, 1], ids=["one_rank", "two_ranks"])
def test_the_weights_are_adamw_applied_to_the_recorded_gradients(runs, case, run):
    result = runs[run][case]
    for name in ("tiny_a", "tiny_b"):
        replayed = adamw_replay(result["initial_weights"][name], result["grads"][name])
        parameters = result["grads"][name][0]["grads"].keys()  # a tied lm_head is embed_tokens, listed once
        assert len(parameters) >= len(result["weights"][name]) - 1
        for key in parameters:
            torch.testing.assert_close(result["weights"][name][key].double(), replayed[key], atol=REPLAY_ATOL,
                                       rtol=0, msg=f"{case}: {name}.{key}")


def test_the_gradient_bound_has_power(runs):
    """Two consecutive non-zero updates of one run (different mini-batches, moved weights) differ by far
    more than GRAD_RTOL: a different mini-batch on 2 ranks would not pass."""
    seen = 0
    for case in ("hacpo", "gspo_x2", "grpo"):
        for name in ("tiny_a", "tiny_b"):
            nonzero = [flat(u["grads"]) for u in runs[0][case]["grads"][name] if flat(u["grads"]).norm() > 0]
            for first, second in zip(nonzero, nonzero[1:]):
                assert (second - first).norm() / first.norm() > 100 * GRAD_RTOL
                seen += 1
    assert seen >= 3


@pytest.mark.parametrize("case", ["hacpo", "gspo_x2", "grpo"])
def test_every_logged_rate_is_the_global_one(runs, case):
    assert_rates_equal(runs[0][case]["metrics"], runs[1][case]["metrics"])
    # partners' cross ratios (cross_ratios.py): every rank's rows, gathered; none without partners' rows
    assert_same_cross_ratios(runs[0][case]["cross_ratios"], runs[1][case]["cross_ratios"])
    assert_same_cross_ratios(runs[0][case]["cross_ratios"], runs[2][case]["cross_ratios"])
    assert bool(runs[0][case]["cross_ratios"]) == (case == "hacpo")
    # the gradient share (global gradient norms under FSDP) where learners train on partners' rows
    assert any("/diag/cross_grad_share" in k for k in runs[1][case]["metrics"]) == (case == "hacpo")


def assert_same_cross_ratios(one: dict, two: dict) -> None:
    """The diagnostics step's partner rows of each learner (`cross_ratios.RatioRecords`): the same rows, sources,
    bounds and answers, and log ratios equal to 1e-4, as the logged rates (the weights after a first update differ
    as the gradients do)."""
    assert one.keys() == two.keys()
    for learner in one:
        a, b = one[learner], two[learner]
        for key in ("row", "source", "lower", "correct"):
            assert torch.equal(getattr(a, key), getattr(b, key)), (learner, key)
        torch.testing.assert_close(b.log_ratio, a.log_ratio, atol=1e-4, rtol=0, msg=learner)


def assert_rates_equal(one: dict, two: dict) -> None:
    """Every logged figure but times: the same keys, equal to 1e-4 relative (sums in another order). The padding
    fractions are logged on both but not compared: they describe the passes, and each rank's passes hold its share
    of the rows, so another rank count pads otherwise (the update itself is the same: assert_same_update)."""
    rates = {k for k in one if not k.startswith(("time/", "throughput/"))}
    assert rates == {k for k in two if not k.startswith(("time/", "throughput/"))}
    assert any("/clip/" in k for k in rates) and any("/loss/" in k for k in rates)
    assert any("/perf/padding_frac/" in k for k in rates)
    for key in sorted(k for k in rates if "/perf/padding_frac/" not in k):
        if math.isnan(one[key]):
            assert math.isnan(two[key]), key
        else:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key


def test_logged_accuracy_is_the_global_mean_not_rank_zeros(runs):
    """Each rank generates and scores its half of the prompts; the logged `{agent}/acc` (and the
    capability window it feeds) is the accuracy over the whole batch: the mean of the two halves,
    the 1-rank figure, and not what rank 0 saw alone."""
    differs = False
    for case in ("hacpo", "gspo_x2", "grpo"):
        one, rank0, rank1 = runs[0][case], runs[1][case], runs[2][case]
        for name in ("tiny_a", "tiny_b"):
            halves = (rank0["local_acc"][name] + rank1["local_acc"][name]) / 2  # equal halves of the prompts
            assert rank0["metrics"][f"{name}/acc"] == pytest.approx(halves, abs=1e-6)
            assert rank1["metrics"][f"{name}/acc"] == rank0["metrics"][f"{name}/acc"]
            assert one["metrics"][f"{name}/acc"] == pytest.approx(halves, abs=1e-6)
            differs |= rank0["local_acc"][name] != halves
    assert differs  # the halves disagree somewhere, so rank 0's own figure would have been caught
