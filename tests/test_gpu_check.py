"""The prepared GPU check (`scripts/gpu_check.py`, docs/GPU.md) run here with `--tiny`: the same parts on the
CPU with shrunk dimensions (same architectures, real tokenizers), so its code is tested before a GPU's minutes
are spent on it. Its figures are checked for existence and consistency, never for speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_lightning.bench import gpu_check
from hacrl_lightning.bench.gpu_check import AGENTS, FSDP_STEPS, PROFILE_STEPS, TINY, figures

REPO = Path(__file__).resolve().parents[1]


def check(tmp_path: Path, zoo_cache: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--tiny", "--out", str(out),
                           "--work", str(tmp_path / "work"), "--zoo-cache", str(zoo_cache), *extra],
                          capture_output=True, text=True, timeout=900, cwd=str(REPO))
    report = json.loads((out / "gpu_check.json").read_text())
    return proc, report, (out / "gpu_check.md").read_text()


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory, zoo_cache):
    return check(tmp_path_factory.mktemp("gpu_check"), zoo_cache)


@pytest.mark.slow
def test_every_part_runs_and_the_reports_say_so(tiny_check):
    proc, report, md = tiny_check
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(report["parts"]) == list(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert part["status"] == "ok", (name, part.get("output_tail"))
        assert f"| {name} | ok |" in md
    assert report["parts"]["offload"]["plan_gib"]["offload_idle"] is True
    built = report["parts"]["build"]
    assert {built[k]["architecture"] for k in ("qwen3_1_7b", "llama3_2_1b_instruct")} == \
        {"Qwen/Qwen3-1.7B", "meta-llama/Llama-3.2-1B-Instruct"}


@pytest.mark.parametrize("part, steps", [("single", TINY.steps), ("tuned", gpu_check.TUNED_STEPS),
                                         ("offload", FSDP_STEPS), ("fsdp", FSDP_STEPS), ("lora", FSDP_STEPS),
                                         ("profile", PROFILE_STEPS)])
def test_training_parts_do_the_planned_work(tiny_check, part, steps):
    _, report, _ = tiny_check
    result = report["parts"][part]
    assert len(result["steps"]) == steps
    agents = ("qwen3_1_7b", "llama3_2_1b_instruct")
    for row in result["steps"]:
        # fixed-length sampling: every response exactly response_len tokens, from each of the 2 agents
        assert row["rollout_tokens"] == 2 * TINY.prompts * TINY.group * TINY.response_len
        for name in agents:  # each learner reads every row (own and partner), prompts included
            assert row[f"update_tokens/{name}"] > row[f"old_logprob_tokens/{name}"] > 0
    fig = result["figures"]
    assert fig["step_s"] > 0 and fig["generation_tokens_per_s"] > 0 and fig["update_tflops"] > 0
    assert set(fig["phases_s"]) == {"rollout", "reward", "exchange", "old_logprobs", "update", "weight_sync",
                                    "logging"}
    assert "memory_gib" not in fig  # CUDA memory only where CUDA is
    assert result["plan_gib"]["fits"] is True and result["plan_gib"]["phases"]["update"] > 0


def test_the_bf16_drift_is_measured_for_each_learner(tiny_check):
    _, report, md = tiny_check
    drifts = report["parts"]["single"]["drift"]
    assert set(drifts) == {"qwen3_1_7b", "llama3_2_1b_instruct"}
    for name, d in drifts.items():
        assert "error" not in d, d
        # own rows carry the pass's own old log-probs: ratio 1 in both precisions, the same loss value
        assert d["loss_bf16"] == pytest.approx(d["loss_fp32"], rel=1e-6)
        # bf16 keeps 8 bits of mantissa (relative rounding 2^-9 = 2e-3 per operation); over two blocks and an
        # fp32-accumulated loss the gradient moves by ~1e-3..1e-2 (H100, real sizes: 3-4e-2), never its direction
        assert 0 < d["grad_rel"] < 0.1 and d["grad_cos"] > 0.99
        assert d["ratio_noise_fp32"]["max"] < 1e-4  # fp32: rounding only (H100: 1e-6)
        assert f"drift {name}" in md
    # mini-batch 0 of every step: the own rows' ratio is exactly 1 (their old log-probs are the pass's own)
    first = report["parts"]["single"]["own_clipped_at_first_mini_batch"]
    assert set(first) == set(drifts)
    for name, row in first.items():
        assert row["own_rows"] > 0 and row["clipped_rows"] == 0 and row["max_ratio_dev"] == 0.0, (name, row)
        assert f"own rows at mini-batch 0 (all steps), {name}: {row['own_rows']}, clipped 0" in md


def test_the_bare_loop_does_a_learners_work_and_the_report_compares_the_update_with_it(tiny_check):
    """`bare`: per built agent, the rows a learner trains in a step (P·n·G, in mini-batches of the part's), rows
    of 32 + response_len tokens; `single`'s update TFLOP/s over the bare loop's is in the report."""
    _, report, md = tiny_check
    bare = report["parts"]["bare"]
    n = len(AGENTS)
    assert bare["rows_per_step"] == TINY.prompts * n * TINY.group and bare["row_tokens"] == 32 + TINY.response_len
    for key, row in bare["agents"].items():
        assert row["tokens"] == bare["rows_per_step"] * bare["row_tokens"] and row["tflops"] > 0, key
    assert report["update_over_bare"] == pytest.approx(
        report["parts"]["single"]["figures"]["update_tflops"] / bare["update_tflops"], rel=1e-2)
    assert "**bare**" in md and "`single`'s update / bare:" in md


def test_the_varied_part_cuts_responses_and_every_training_part_reports_its_padding(tiny_check):
    """`varied`: responses cut to seeded lengths in [L/4, L] (here L = 8: 2..8 tokens), so fewer tokens than the
    fixed-length parts and, the rows unequal, padding in the update's passes; every training part reports the
    padding fraction of each agent's passes."""
    _, report, md = tiny_check
    varied = report["parts"]["varied"]
    full = 2 * TINY.prompts * TINY.group * TINY.response_len
    for row in varied["steps"]:
        assert 2 * TINY.prompts * TINY.group * 2 <= row["rollout_tokens"] < full
    for part in ("single", "varied"):
        padding = report["parts"][part]["figures"]["padding_frac"]
        assert {f"{key}/perf/padding_frac/{phase}" for key, _, _ in AGENTS.values()
                for phase in ("update", "old_logprobs")} == set(padding), part
        assert all(0.0 <= v < 1.0 for v in padding.values())
    assert any(v > 0 for v in report["parts"]["varied"]["figures"]["padding_frac"].values())
    assert md.count("padding of the passes:") >= 2


def test_the_lora_and_profile_parts(tiny_check):
    """`lora`: both agents with a rank-16 adapter (the plan's figures for it); `profile`: the first steps under
    torch.profiler, their top entries in the report."""
    _, report, md = tiny_check
    lora = report["parts"]["lora"]
    assert all(f"agents.{key}.lora.rank=16" in lora["config"] for key, _, _ in AGENTS.values())
    profiles = report["parts"]["profile"]["profile"]
    assert [row["step"] for row in profiles] == list(range(PROFILE_STEPS))
    for row in profiles:
        assert row["seconds"] > 0 and len(row["top"]) > 3 and all(e["self_s"] >= 0 and e["calls"] > 0 for e in row["top"])
    assert "profile of step 0" in md and "profile of step 1" in md


def test_the_compile_part_compares_eager_and_compiled(tiny_check):
    """`compile` (`part_compile`): the same agent's micro-batch eager, then compiled in place; --tiny compiles with
    dynamo alone (`backend="eager"`), whose graphs run eager's operations: in fp32 the loss and gradient then move
    only by the rows' padding to 64 columns (sdpa's softmax over more, masked, keys: a few ulp)."""
    _, report, md = tiny_check
    comp = report["parts"]["compile"]
    eager, compiled = comp["eager"], comp["compiled"]
    assert compiled["backend"] == "eager" and compiled["blocks"] == gpu_check.TINY_DIMS["num_hidden_layers"]
    assert compiled["graphs"] > 0 and compiled["compile_s"] > 0
    assert comp["tokens"] == TINY.micro_batch * (TINY.prompt_len + TINY.response_len)
    for mode in (eager, compiled):
        assert mode["update_s"] > 0 and mode["old_logprobs_s"] > 0 and mode["update_tflops"] > 0
    assert comp["loss_rel"] < 1e-5 and comp["grad_rel"] < 1e-4 and comp["grad_cos"] > 0.9999
    assert "**compile**" in md


@pytest.mark.slow
def test_a_failing_part_is_reported_and_the_check_goes_on(tmp_path, zoo_cache):
    proc, report, md = check(tmp_path, zoo_cache, "--parts", "single,env")  # no build: no agent directories
    assert proc.returncode == 1
    single = report["parts"]["single"]
    assert single["status"].startswith("failed")
    assert "AgentLoadError" in single["output_tail"] or "does not exist" in single["output_tail"]
    assert report["parts"]["env"]["status"] == "ok"
    assert "**single** failed" in md


def test_figures_by_hand():
    result = {
        "device": "NVIDIA H100 80GB HBM3",
        "parameters": {"a": 1_000_000_000, "b": 500_000_000},
        "steps": [
            {"step_s": 9.0, "rollout": 5.0, "update": 3.0, "old_logprobs": 1.0, "rollout_tokens": 10,
             "update_tokens/a": 1, "update_tokens/b": 1, "old_logprob_tokens/a": 1, "old_logprob_tokens/b": 1},
            {"step_s": 4.0, "rollout": 2.0, "update": 1.5, "old_logprobs": 0.5, "rollout_tokens": 4000,
             "update_tokens/a": 1000, "update_tokens/b": 2000, "old_logprob_tokens/a": 500,
             "old_logprob_tokens/b": 1000},
        ],
        "memory_gib_by_step": [{"setup": 10.0}, {"rollout": 99.0, "update": 99.0},
                               {"rollout": 30.0, "old_logprobs": 20.0, "update": 50.0}],
        "plan_gib": {"phases": {"rollout": 40.0, "old_logprobs": 40.0, "update": 40.0}},
    }
    fig = figures(result, tflops=500.0)
    assert fig["step_s"] == 4.0 and fig["first_step_s"] == 9.0  # the first step is left out of the medians
    assert fig["generation_tokens_per_s"] == 2000.0
    assert fig["update_tokens_per_s"] == 2000.0
    # 6 N T: (6 * 1e9 * 1000 + 6 * 5e8 * 2000) / 1.5 s = 8e12 FLOP/s
    assert fig["update_tflops"] == 8.0
    assert fig["update_mfu_vs_measured_matmul"] == pytest.approx(8.0 / 500.0)
    assert fig["update_mfu_vs_datasheet"] == pytest.approx(round(8.0 / 989.4, 4))
    # 2 N T: (2 * 1e9 * 500 + 2 * 5e8 * 1000) / 0.5 s = 4e12
    assert fig["old_logprobs_tflops"] == 4.0
    assert fig["memory_gib"] == {"rollout": 30.0, "old_logprobs": 20.0, "update": 50.0}  # the warm-up's 99 left out
    assert fig["memory_over_plan"] == {"rollout": 0.75, "old_logprobs": 0.5, "update": 1.25}


@pytest.mark.gpu
@pytest.mark.slow
def test_the_real_check_on_a_gpu(tmp_path, zoo_cache):
    """Where CUDA is (skipped elsewhere): the real sizes, one training step on one device, the drift measured."""
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--out", str(out), "--work",
                           str(tmp_path / "work"), "--zoo-cache", str(zoo_cache), "--parts", "env,build,single",
                           "--steps", "1", "--budget-s", "500"], capture_output=True, text=True, timeout=600,
                          cwd=str(REPO))
    report = json.loads((out / "gpu_check.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:]
    single = report["parts"]["single"]
    assert single["figures"]["update_tflops"] > 0 and single["peak_memory_gib"] > 0
    for d in single["drift"].values():  # bf16 on real sizes: a few percent, never the direction (docs/GPU.md)
        assert d["grad_cos"] > 0.99


def test_the_sync_part_checks_each_transport_on_this_machine(tiny_check):
    """`sync` with the stand-in engine in its own process: here (no CUDA) the host shared-memory buckets and the
    file; with 0.05 MiB buckets the embedding and head cross in row ranges, and the engine then holds the
    trainer's weights cast to bf16 and answers as its twin. (`cuda_ipc` runs on a lent GPU, docs/GPU.md.)"""
    _, report, md = tiny_check
    sync = report["parts"]["sync"]
    assert set(sync["transports"]) == {"host", "file"}
    for name, row in sync["transports"].items():
        assert row["weights_equal"] and row["greedy_equal"], (name, row)
        assert not row["mismatched"] and not row["not_loaded"]
    assert sync["transports"]["host"]["transport"] == "host" and sync["transports"]["host"]["buckets"] > 2
    assert "| host |" in md and "| file |" in md


def test_the_tuned_part_runs_the_plan_s_larger_passes_and_reads_the_first_step_without_its_compile(tiny_check):
    """`tuned`: from passes of one row, the plan proposes a whole mini-batch's rows (2 prompts x G 2 = 4) and the
    part trains with them; each step's compile seconds are kept (0 here: --tiny stays eager) and the first step is
    read without them."""
    _, report, md = tiny_check
    tuned = report["parts"]["tuned"]
    assert tuned["tuned"]["compile"] is False  # --tiny: eager
    assert tuned["tuned"]["passes"]["overrides"] == [f"trainer.micro_batch_size={TINY.mini_batch_prompts * TINY.group}"]
    assert "trainer.micro_batch_size=4" in tuned["config"] and len(tuned["steps"]) == gpu_check.TUNED_STEPS
    assert tuned["compile_s_by_step"] == [0.0] * gpu_check.TUNED_STEPS
    fig = tuned["figures"]
    assert fig["first_step_over_later_without_compile"] == pytest.approx(fig["first_step_s"] / fig["step_s"], rel=2e-2)
    assert "tuned: trainer.compile false, passes trainer.micro_batch_size=4" in md
