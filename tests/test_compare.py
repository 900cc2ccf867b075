"""scripts/compare.py and hacrl_lightning.experiments: statistics by hand, a quick real comparison, resume,
reuse only under the same resolved config."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from hacrl_lightning import experiments as ex
from hacrl_lightning.zoo import ensure_built

REPO = Path(__file__).resolve().parents[1]
QUICK = ["methods=[grpo,hacpo]", "seeds=[0,1]", "jobs=2", "trainer.steps=2", "trainer.eval_every=1",
         "data.eval_size=4", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "trainer.export_agents=false",
         "trainer.diagnostics_every=2"]


def test_mean_ci_matches_hand_computed_t_interval():
    # values 1, 2, 3: mean 2, sample sd 1, t_{0.975, 2} = 4.302653 -> half-width 4.302653 / sqrt(3)
    mean, half = ex.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert math.isnan(ex.mean_ci([0.5])[1])
    assert ex.mean_ci([0.25, 0.25, 0.25]) == (0.25, 0.0)


def _row(method, agent, seed, initial, final):
    return {"method": method, "agent": agent, "seed": seed, "initial_acc": initial, "final_acc": final,
            "rollouts_generated": 32, "responses_trained": 64, "optimizer_updates": 4, "wall_s": 1.0,
            "n_agents": 2, "steps": 2, "step_s": 0.5}


def test_summarize_and_paired_gaps_by_hand():
    rows = [_row("hacpo", "a", 0, 0.2, 0.5), _row("hacpo", "a", 1, 0.2, 0.7),
            _row("gspo", "a", 0, 0.2, 0.4), _row("gspo", "a", 1, 0.2, 0.4)]
    table = {(r["method"], r["agent"]): r for r in ex.summarize(rows)}
    assert table[("hacpo", "a")]["final_acc"] == pytest.approx(0.6)
    assert table[("hacpo", "a")]["gain"] == pytest.approx(0.4)
    assert table[("gspo", "a")]["final_ci"] == 0.0
    (gap,) = ex.paired_gaps(rows, reference="hacpo")
    # per-seed differences 0.1 and 0.3: mean 0.2, sd 0.1414, t_{0.975, 1} = 12.7062
    assert gap["method"] == "gspo" and gap["gap"] == pytest.approx(0.2)
    assert gap["gap_ci"] == pytest.approx(12.7062 * math.sqrt(0.02) / math.sqrt(2), rel=1e-4)


def test_plans_are_seed_major_and_scaling_arms_are_named_by_size():
    arms = ex.scaling_arms([["x", "y"], ["x", "y", "z"]], ["all", 2])
    assert [a.name for a in arms] == ["n2", "n2_cs2", "n3", "n3_cs2"]
    assert "agents=[x,y,z]" in arms[3].overrides and "algorithm.cross_samples_per_prompt=2" in arms[3].overrides
    specs = ex.plan_runs(ex.method_arms(["grpo", "hacpo"]), [0, 1], Path("/out"))
    assert [(s.arm.name, s.seed) for s in specs] == [("grpo", 0), ("hacpo", 0), ("grpo", 1), ("hacpo", 1)]
    assert specs[1].run_dir == Path("/out/runs/hacpo/seed0")
    with pytest.raises(ValueError, match="unique"):
        ex.plan_runs(ex.method_arms(["grpo", "grpo"]), [0], Path("/out"))


def _compare(args, env_cache):
    env = dict(os.environ, HACRL_ZOO_CACHE=str(env_cache))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "compare.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _study_rows(args, out, zoo_cache, agents):
    """Build `agents` here (not in racing subprocesses), run `python scripts/compare.py` into `out`, and return
    the rows of its results.csv."""
    for name in agents:
        ensure_built(name, cache_dir=zoo_cache)
    proc = _compare([*args, f"out={out}"], zoo_cache)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "results.csv").open() as handle:
        return list(csv.DictReader(handle))


def _no_process(*args, **kwargs):
    raise AssertionError(f"compare started a process: {args}")


def test_compare_rejects_unknown_method_before_running(tmp_path, script_main, capsys):
    """The script's `main` in this process (an exception would fail the test, as a traceback would); the
    real `python scripts/compare.py` runs in the next test."""
    out = tmp_path / "cmp"
    status = script_main("compare")(["methods=[grpo,hacpoo]", "seeds=[0]", f"out={out}", "trainer.stepz=3"])
    stderr = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in stderr
    assert "hacpoo" in stderr and "hacpo" in stderr and "trainer.stepz" in stderr
    assert not (out / "runs").exists()


@pytest.mark.parametrize("args, key", [(["methods=[hacpo,grpo,hacpo]"], "methods"),
                                       (["methods=[hacpo]", "ablations=[hacpo]"], "ablations"),
                                       (["study=scaling", "agent_sets=[[tiny_a,tiny_b],[tiny_c,tiny_d]]"], "agent_sets")])
def test_compare_refuses_an_arm_named_twice_before_running(tmp_path, script_main, capsys, args, key):
    """Two arms of one name would share one run directory: a config error naming the key, not a traceback."""
    out = tmp_path / "cmp"
    assert script_main("compare")([*args, "seeds=[0]", f"out={out}"]) == 2
    stderr = capsys.readouterr().err
    assert key in stderr and "each arm once" in stderr
    assert not out.exists()


@pytest.mark.parametrize("pairs", ["[[tiny_a]]", "[[tiny_a,tiny_a]]", "[[tiny_a,tiny_b,tiny_c]]", "[]"])
def test_capability_study_refuses_what_is_not_a_pair_of_two_agents(tmp_path, script_main, capsys, pairs):
    out = tmp_path / "cmp"
    assert script_main("compare")(["study=capability", f"pairs={pairs}", "seeds=[0]", f"out={out}"]) == 2
    stderr = capsys.readouterr().err
    assert "pairs" in stderr and "two different agents" in stderr and "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.slow
def test_resolved_values_hash_every_value_but_where_the_run_lives():
    from omegaconf import OmegaConf

    from hacrl_lightning.cli import compose_config

    def values(*overrides):
        return ex.resolved_values(OmegaConf.to_yaml(compose_config(list(overrides))[1], resolve=True))

    base = values("run_dir=/a")
    assert base["algorithm.name"] == "hacpo" and base["agents.tiny_a.lr"] > 0 and "run_dir" not in base
    assert ex.config_hash(base) == ex.config_hash(values("run_dir=/b", "overwrite=true", "zoo_cache=/z",
                                                                 "trainer.progress_every=5"))
    for change in ("trainer.steps=3", "agents.tiny_b.lr=3e-4", "algorithm=grpo", "data.eval_size=4", "seed=1"):
        assert ex.config_hash(values("run_dir=/a", change)) != ex.config_hash(base), change


@pytest.mark.slow
def test_a_finished_run_of_a_few_shot_comparison_is_recognised_by_its_fitted_lengths(tmp_path, script_main, capsys,
                                                                                      zoo_cache):
    """compare.py hashes each run's config after train.py's preflight, which fits tiny_a's lengths to
    `data.few_shot=2` (234 + 22): the hash is that of the config the run saves, so a finished run is kept, not
    re-run. The fitted line is said once for all runs."""
    import sys as _sys

    from omegaconf import OmegaConf

    from hacrl_lightning.cli import compose_config

    script_main("compare")  # loads the script's module
    compare = _sys.modules["scripts_compare"]
    training = ["data.few_shot=2", f"zoo_cache={zoo_cache}"]
    specs = ex.plan_runs([ex.Arm("hacpo", ("algorithm=hacpo",))], [0, 1], tmp_path)
    hashed, values = compare.check_runs(specs, training)
    out = capsys.readouterr().out
    assert out.count("agents.tiny_a: data.few_shot prompts take up to 234 tokens") == 1
    assert {v["agents.tiny_a.max_prompt_len"] for v in values.values()} == {234}
    _, saved = compose_config(hashed[0].overrides(training), preflight=True)  # what train.py saves
    assert ex.config_hash(ex.resolved_values(OmegaConf.to_yaml(saved, resolve=True))) == hashed[0].config_hash


@pytest.mark.slow
def test_quick_comparison_writes_csv_markdown_plots_and_resumes(tmp_path, zoo_cache, script_main, capsys,
                                                                 monkeypatch):
    out = tmp_path / "cmp"
    rows = _study_rows(QUICK, out, zoo_cache, ("tiny_a", "tiny_b"))
    assert tuple(rows[0]) == ex.RESULT_COLUMNS
    assert sorted((r["method"], r["agent"], r["seed"]) for r in rows) == sorted(
        (m, a, s) for m in ("grpo", "hacpo") for a in ("tiny_a", "tiny_b") for s in ("0", "1"))
    by = {(r["method"], r["agent"], r["seed"]): r for r in rows}
    # 2 steps x 4 prompts x G=4 generated by every agent; hacpo also trains on the partner's responses
    assert by[("grpo", "tiny_a", "0")]["rollouts_generated"] == "32"
    assert by[("grpo", "tiny_a", "0")]["responses_trained"] == "32"
    assert by[("hacpo", "tiny_a", "0")]["responses_trained"] == "64"
    # diagnostics: grpo has no partners' responses (nothing measured); hacpo has both
    assert by[("grpo", "tiny_a", "0")]["cross_grad_share"] == "nan"
    assert by[("grpo", "tiny_a", "0")]["cross_nograd_frac_wrong"] == "nan"
    for agent in ("tiny_a", "tiny_b"):
        hacpo = by[("hacpo", agent, "0")]
        assert 0.0 <= float(hacpo["cross_grad_share"]) <= 1.0 and 0.0 <= float(hacpo["cross_nograd_frac_wrong"]) <= 1.0
        assert float(hacpo["omega_mean"]) > 0

    report = (out / "results.md").read_text()
    assert "| hacpo | tiny_b | 2 of 2 |" in report and "## hacpo minus each method" in report
    assert "## Diagnostics" in report and "| cross grad share |" in report
    # what the two agents know together at the last evaluation: each run's figures on its rows, means in results.md
    for (method, agent, seed), row in by.items():
        partner = "tiny_b" if agent == "tiny_a" else "tiny_a"
        theirs = json.loads(by[(method, partner, seed)]["final_right_partner_wrong"])[agent]  # partner right, agent wrong
        assert float(row["final_union_acc"]) == pytest.approx(float(row["final_acc"]) + theirs)
        assert float(row["final_union_gain"]) == pytest.approx(
            float(row["final_union_acc"]) - max(float(by[(method, a, seed)]["final_acc"]) for a in ("tiny_a", "tiny_b")))
        assert 0.0 <= float(row["final_majority_acc"]) <= float(row["final_union_acc"])
    assert "## The agents together (held-out, last evaluation)" in report
    assert "| hacpo | 2 of 2 |" in report and "| grpo | tiny_a | tiny_b |" in report
    for name in ("accuracy_vs_rollouts.png", "final_accuracy.png"):
        with Image.open(out / name) as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 300

    assert (out / "runs" / "hacpo" / "seed0.log").read_text().startswith("$ ")  # the log beside the run dir
    # the record of the files it read, beside it too: the synthetic task and zoo agents read none by path
    assert json.loads((out / "runs" / "hacpo" / "seed0.inputs.json").read_text()) == {"files": {}}

    # the same command again (its `main` in this process): every run is reused, no process is started
    summaries = {(m, s): out / "runs" / m / f"seed{s}" / "summary.json" for m in ("grpo", "hacpo") for s in (0, 1)}
    stamps = {key: path.stat().st_mtime_ns for key, path in summaries.items()}

    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", _no_process)
        patch.setattr(sys, "argv", ["scripts/compare.py", *QUICK, f"out={out}"])
        assert script_main("compare")(sys.argv[1:]) == 0
    assert "4 runs (4 already finished)" in capsys.readouterr().out
    assert {key: path.stat().st_mtime_ns for key, path in summaries.items()} == stamps

    # another setting for one run (grpo, seed 1): that run is re-run, and its results are the new setting's
    changed = [arg for arg in QUICK if not arg.startswith(("methods=", "seeds=", "trainer.steps="))]
    assert script_main("compare")(["methods=[grpo]", "seeds=[1]", "trainer.steps=3", *changed, f"out={out}"]) == 0
    console = capsys.readouterr().out
    assert "1 runs (0 already finished)" in console and "stale  grpo seed=1" in console and "trainer.steps 2 -> 3" in console
    with (out / "results.csv").open() as handle:
        assert [(r["method"], r["seed"], r["steps"]) for r in csv.DictReader(handle)] == [("grpo", "1", "3")] * 2
    assert "Finished runs: 1 of 1" in (out / "results.md").read_text()

    # the first command again: only the run it no longer matches (grpo, seed 1) is re-run
    assert script_main("compare")([*QUICK, f"out={out}"]) == 0
    console = capsys.readouterr().out
    assert "4 runs (3 already finished)" in console and "trainer.steps 3 -> 2" in console
    assert [line.split()[1:3] for line in console.splitlines() if line.startswith("  start")] == [["grpo", "seed=1"]]
    assert {key: path.stat().st_mtime_ns for key, path in summaries.items() if key != ("grpo", 1)} == {
        key: stamp for key, stamp in stamps.items() if key != ("grpo", 1)}
    with (out / "results.csv").open() as handle:
        assert {r["steps"] for r in csv.DictReader(handle)} == {"2"}


# --- the capability-gap study --------------------------------------------------------------------------


def test_diagnostic_values_average_omega_over_partners_at_the_first_step_overall_and_at_the_last():
    values = ex.diagnostic_values({"cross_grad_share": 0.25, "omega": {"p": {"first": 0.2, "mean": 1.0, "last": 1.5},
                                                                        "q": {"first": 0.6, "mean": 2.0, "last": 2.5}}})
    assert values["cross_grad_share"] == 0.25 and math.isnan(values["grad_cos_self_cross"])
    assert (values["omega_first"], values["omega_mean"], values["omega_last"]) == pytest.approx((0.4, 1.5, 2.0))
    assert all(math.isnan(v) for k, v in ex.diagnostic_values({}).items())  # a run without diagnostics


def test_capability_arms_are_pairs_times_methods_and_gaps_stay_within_a_pair():
    arms = ex.capability_arms([["x", "y"], ["x", "z"]], ["gspo_x2", "hacpo"])
    assert [a.name for a in arms] == ["x+y/gspo_x2", "x+y/hacpo", "x+z/gspo_x2", "x+z/hacpo"]
    assert arms[3].overrides == ("algorithm=hacpo", "agents=[x,z]")
    assert ex.arm_group("x+z/hacpo") == ("x+z", "hacpo") and ex.arm_group("n3_cs2") == ("", "n3_cs2")
    assert ex.plan_runs(arms, [0], Path("/out"))[1].run_dir == Path("/out/runs/x+y/hacpo/seed0")
    rows = [_row("x+y/hacpo", "x", 0, 0.2, 0.5), _row("x+y/hacpo", "x", 1, 0.2, 0.6),
            _row("x+y/gspo_x2", "x", 0, 0.2, 0.4), _row("x+y/gspo_x2", "x", 1, 0.2, 0.4),
            _row("x+z/hacpo", "x", 0, 0.2, 0.3), _row("x+z/gspo_x2", "x", 0, 0.2, 0.35)]
    gaps = {g["method"]: g for g in ex.paired_gaps(rows, reference="hacpo")}
    assert set(gaps) == {"x+y/gspo_x2", "x+z/gspo_x2"}  # each against its own pair's hacpo, never across pairs
    assert gaps["x+y/gspo_x2"]["reference"] == "x+y/hacpo" and gaps["x+y/gspo_x2"]["gap"] == pytest.approx(0.15)
    assert gaps["x+z/gspo_x2"]["gap"] == pytest.approx(-0.05) and gaps["x+z/gspo_x2"]["seeds"] == 1
    report = ex.markdown_report(ex.summarize(rows), list(gaps.values()), title="t")
    assert "## each pair's hacpo minus each method" in report and "| x+y/hacpo | x+y/gspo_x2 | x | 2 | +0.150 |" in report


def _finished(run_dir: Path, history: list[tuple[int, float]]) -> None:
    """A run directory holding a completed run's summary.json whose eval_history is (rollouts generated, accuracy)
    of agent x."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "steps": 2, "steps_wanted": 2, "eval_history": [
        {"rollouts_generated": {"x": rollouts}, "scores": {"x": {"acc": acc}}} for rollouts, acc in history]}))


def test_equal_rollout_gaps_compare_the_reference_end_with_the_method_at_the_same_rollout_count(tmp_path):
    arms = ex.method_arms(["gspo_x2", "gspo", "hacpo"])
    specs = ex.plan_runs(arms, [0, 1], tmp_path)
    curves = {("hacpo", 0): [(0, 0.2), (32, 0.3), (64, 0.5)], ("hacpo", 1): [(0, 0.2), (32, 0.4), (64, 0.6)],
              ("gspo_x2", 0): [(0, 0.2), (64, 0.45), (128, 0.7)], ("gspo_x2", 1): [(0, 0.2), (64, 0.4), (128, 0.8)],
              ("gspo", 0): [(0, 0.2), (32, 0.3), (64, 0.1)], ("gspo", 1): [(0, 0.2), (32, 0.3), (64, 0.1)]}
    for spec in specs:
        _finished(spec.run_dir, curves[(spec.arm.name, spec.seed)])
    (gap,) = ex.equal_rollout_gaps(specs, reference="hacpo")  # gspo generates no more than hacpo: not compared
    # hacpo at 64 rollouts (0.5, 0.6) against gspo_x2 at its 64 (0.45, 0.4): differences 0.05 and 0.2
    assert (gap["method"], gap["agent"], gap["seeds"]) == ("gspo_x2", "x", 2)
    assert gap["gap"] == pytest.approx(0.125)
    assert gap["gap_ci"] == pytest.approx(12.7062 * math.sqrt(((0.05 - 0.125) ** 2 + (0.2 - 0.125) ** 2)) / math.sqrt(2),
                                          rel=1e-4)


CAPABILITY = ["study=capability", "pairs=[[tiny_a,tiny_b],[tiny_a,tiny_c]]", "methods=[gspo_x2,hacpo]", "seeds=[0]",
              "jobs=2", "trainer.steps=2", "trainer.eval_every=1", "data.eval_size=4", "data.prompts_per_step=4",
              "trainer.mini_batch_prompts=2", "trainer.export_agents=false", "trainer.diagnostics_every=0"]


@pytest.mark.slow
def test_quick_capability_study_compares_within_pairs_and_reruns_only_changed_arms(tmp_path, zoo_cache, script_main,
                                                                                   capsys, monkeypatch):
    out = tmp_path / "cap"
    rows = _study_rows(CAPABILITY, out, zoo_cache, ("tiny_a", "tiny_b", "tiny_c"))
    assert sorted({(r["method"], r["agent"]) for r in rows}) == sorted(
        (f"tiny_a+{p}/{m}", a) for p in ("tiny_b", "tiny_c") for m in ("gspo_x2", "hacpo") for a in ("tiny_a", p))
    report = (out / "results.md").read_text()
    assert "## each pair's hacpo minus each method (final" in report
    assert "| tiny_a+tiny_c/hacpo | tiny_a+tiny_c/gspo_x2 | tiny_c | 1 |" in report and "| 1 of 1 |" in report
    # GSPO×2 generates 32 rollouts per agent in step 1, as many as HACPO in its 2 steps: compared there too
    assert "minus each method at an equal number of rollouts generated" in report
    assert "| tiny_a+tiny_b/hacpo | tiny_a+tiny_b/gspo_x2 | tiny_b | 1 |" in report.split("equal number")[1]
    with Image.open(out / "gap_vs_capability.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 300

    with monkeypatch.context() as patch:  # the same study again: every run is reused
        patch.setattr(subprocess, "Popen", _no_process)
        assert script_main("compare")([*CAPABILITY, f"out={out}"]) == 0
    assert "4 runs (4 already finished)" in capsys.readouterr().out

    # one more method on the first pair: only its arm runs; the pair's finished runs are reused untouched
    kept = out / "runs" / "tiny_a+tiny_b" / "hacpo" / "seed0" / "summary.json"
    stamp = kept.stat().st_mtime_ns
    changed = [arg.replace(",[tiny_a,tiny_c]", "").replace("methods=[gspo_x2,hacpo]", "methods=[gspo_x2,hacpo,naive]")
               for arg in CAPABILITY]
    assert script_main("compare")([*changed, f"out={out}"]) == 0
    console = capsys.readouterr().out
    assert "3 runs (2 already finished)" in console
    assert [line.split()[1] for line in console.splitlines() if line.startswith("  start")] == ["tiny_a+tiny_b/naive"]
    assert kept.stat().st_mtime_ns == stamp


# --- interrupted, failed and partial runs; one compare.py per output directory ------------------------------


def test_a_mean_over_fewer_runs_than_planned_is_not_shown_unless_allowed():
    rows = [{**_row("hacpo", "a", 0, 0.2, 0.5), "arm_runs": 2, "arm_runs_planned": 2},
            {**_row("hacpo", "a", 1, 0.2, 0.7), "arm_runs": 2, "arm_runs_planned": 2},
            {**_row("gspo", "a", 0, 0.2, 0.4), "arm_runs": 1, "arm_runs_planned": 2}]
    table = {r["method"]: r for r in ex.summarize(rows)}
    assert (table["hacpo"]["runs"], table["hacpo"]["planned"], table["hacpo"]["partial"]) == (2, 2, False)
    assert table["hacpo"]["final_acc"] == pytest.approx(0.6)
    assert table["gspo"]["partial"] and math.isnan(table["gspo"]["final_acc"]) and math.isnan(table["gspo"]["gain"])
    report = ex.markdown_report(list(table.values()), [], title="t")
    assert "| hacpo | a | 2 of 2 | 0.200 |" in report
    assert "| gspo | a | 1 of 2 | – | no mean: 1 of 2 planned runs finished (allow_partial=true shows it) |" in report
    allowed = {r["method"]: r for r in ex.summarize(rows, allow_partial=True)}
    assert allowed["gspo"]["final_acc"] == pytest.approx(0.4) and allowed["gspo"]["partial"]
    assert "| gspo | a | 1 of 2 (partial) | 0.200 | 0.400 |" in ex.markdown_report(list(allowed.values()), [], title="t")


def _start_compare(args: list[str], zoo_cache: Path) -> subprocess.Popen:
    """`python scripts/compare.py args` in the background, with SIGINT at its default (see
    tests/test_run_lifecycle.py: a suite started in the background inherits it ignored)."""
    env = dict(os.environ, HACRL_ZOO_CACHE=str(zoo_cache))
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / "compare.py"), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_file_text(path: Path, text: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None, f"compare.py ended before {path} said {text!r}"
        assert time.monotonic() < deadline, f"{path} did not say {text!r} within 240 s"
        time.sleep(0.1)


ONE_RUN = ["methods=[grpo]", "seeds=[0]", "trainer.steps=3", "data.eval_size=4", "data.prompts_per_step=4",
           "trainer.mini_batch_prompts=2", "rollout.group_size=2", "trainer.micro_batch_size=8",
           "trainer.export_agents=false", "trainer.diagnostics_every=0"]


@pytest.mark.slow
def test_ctrl_c_stops_a_comparison_that_owns_its_directory_and_the_next_one_resumes_the_run(
        tmp_path, zoo_cache, script_main, capsys):
    out = tmp_path / "cmp"
    args = [*ONE_RUN, f"out={out}"]
    ensure_built("tiny_a", cache_dir=zoo_cache), ensure_built("tiny_b", cache_dir=zoo_cache)
    first = _start_compare(args, zoo_cache)
    log, run = out / "runs" / "grpo" / "seed0.log", out / "runs" / "grpo" / "seed0"
    try:
        _wait_for_file_text(log, "$ ", first)
        # a second compare.py on the same output directory: refused, naming the holder, writing nothing
        assert script_main("compare")(args) == 2
        err = capsys.readouterr().err
        assert f"out: got {str(out)!r}" in err and f"in use by pid {first.pid}" in err and "compare.py" in err
        _wait_for_file_text(log, "eval step 0", first)
        first.send_signal(signal.SIGINT)  # as Ctrl-C in a terminal, to compare.py alone
        stdout, stderr = first.communicate(timeout=240)
    finally:
        first.kill()
    assert first.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stdout + stderr
    assert "stopped by SIGINT" in stderr and "The same command resumes them" in stderr
    assert log.read_text().count("$ ") == 1  # only the first compare.py started a run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 1 <= summary["steps"] < 3
    assert "grpo seed=0 (interrupted)" in (out / "results.md").read_text()
    assert not (out / ".lock").exists()

    # the same command again resumes the interrupted run from its checkpoint (not "already finished")
    assert script_main("compare")(args) == 0
    console = capsys.readouterr().out
    assert "1 runs (0 already finished)" in console
    assert f"retry  grpo seed=0: interrupted at step {summary['steps']} of 3" in console
    assert log.read_text().split("$ ")[-1].split("\n")[0].endswith(f"resume={summary['last_checkpoint']}")
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["steps"] == 3 and resumed["sessions"] == 2
    with (out / "results.csv").open() as handle:
        assert {(r["steps"], r["arm_runs"], r["arm_runs_planned"]) for r in csv.DictReader(handle)} == {("3", "1", "1")}
    assert "| grpo | tiny_a | 1 of 1 |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_a_failed_run_is_no_result_and_the_next_comparison_retries_it(tmp_path, zoo_cache, script_main, capsys):
    """lr=1e38 (finite, far too large) fails inside the first update: a `failed` summary. The output directory's
    name holds a space, `=` and `,` (Hydra needs the run directories quoted)."""
    out = tmp_path / "cmp lr=1e38,grpo"
    args = [*ONE_RUN, "trainer.steps=1", "agents.tiny_a.lr=1e38", f"out={out}"]
    ensure_built("tiny_a", cache_dir=zoo_cache), ensure_built("tiny_b", cache_dir=zoo_cache)
    for attempt in range(2):
        assert script_main("compare")(args) == 1
        captured = capsys.readouterr()
        summary = json.loads((out / "runs" / "grpo" / "seed0" / "summary.json").read_text())
        assert summary["status"] == "failed", summary
        assert "1 runs (0 already finished)" in captured.out  # the second time: retried, not reused
        assert ("retry  grpo seed=0: failed" in captured.out) == (attempt == 1)
        assert "grpo seed=0: failed" in captured.out and "0.38->" not in captured.out
        assert "1 of 1 planned runs did not finish: grpo seed=0 (failed" in captured.err
        assert "allow_partial=true" in captured.err
        with (out / "results.csv").open() as handle:
            assert list(csv.DictReader(handle)) == []  # a failed run is no row
        assert "Finished runs: 0 of 1" in (out / "results.md").read_text()
        assert not (out / "final_accuracy.png").exists()


# --- results that are what they say: the key holds the files' contents and the run's real step count -------
# (the fourth round of hostile inputs, 2026-11-28)


def test_the_inputs_key_holds_the_contents_of_every_file_the_config_names(tmp_path, monkeypatch):
    """Data files, a code reward's file (by path and as `module:fn`), a local model folder: each is keyed by its
    SHA-256 (a folder by its files'), relative paths from where the runs start; names, numbers and `zoo:` are not
    paths. A file changed in place changes the key; one invocation reads each path once."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "reward.py").write_text("def fn(response, gold):\n    return 1.0\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "my_reward_mod.py").write_text("def fn(response, gold):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    values = {"data.train_files": ["data/train.jsonl"], "data.eval_files": [], "data.reward": "exact_match",
              "data.rewards": [{"reward": f"{tmp_path}/reward.py:fn", "weight": 1.0},
                               {"reward": "my_reward_mod:fn", "weight": 0.1}],
              "agents.tiny_a.model": "model", "agents.tiny_b.model": "zoo:tiny_b", "data.name": "synthetic",
              "trainer.steps": 3, "agents.tiny_a.tokenizer": None, "trainer.precision": "32-true"}
    paths = dict(ex.input_paths(values, tmp_path))
    assert paths == {"data.train_files.0": tmp_path / "data" / "train.jsonl",
                     "data.rewards.0.reward": tmp_path / "reward.py",
                     "data.rewards.1.reward": tmp_path / "my_reward_mod.py",
                     "agents.tiny_a.model": model}
    cache: dict = {}
    before = ex.run_inputs(values, tmp_path, cache)
    assert len(before) == 4 and all(value.startswith("sha256:") for _, value in before)
    assert ex.run_inputs(values, tmp_path, cache) == before and len(cache) == 4  # read once per invocation
    for changed in (tmp_path / "data" / "train.jsonl", tmp_path / "reward.py", model / "config.json",
                    tmp_path / "my_reward_mod.py"):
        text = changed.read_text()
        changed.write_text(text.replace("1", "7") if "1" in text else text + " ")
        after = dict(ex.run_inputs(values, tmp_path))
        assert [path for path, value in before if after[path] != value] == [
            str(changed if changed.parent != model else model)], changed
        changed.write_text(text)
    assert ex.run_inputs(values, tmp_path) == before
    hostile = {"agents.tiny_a.system_prompt": "a/b " * 5000, "agents.tiny_a.chat_template": "{{ x }}/~nobody_zz.txt",
               "x.y": "~nobody_zz/a.txt", "x.z": "a\x00/b.json", "data.reward": "https://example.org/r.py:fn"}
    assert ex.input_paths(hostile, tmp_path) == []  # texts that are no existing path: none, and no error


def _spec_with_run(tmp_path: Path, *, inputs, steps: int, ran_steps: int, record=None) -> ex.RunSpec:
    """A planned run (hash of a config text, `inputs`, `steps`) and a directory holding a completed run of that
    config that made `ran_steps` steps, with `record` as its inputs record (None: none written)."""
    config = "seed: 0\n"
    spec = ex.RunSpec(ex.Arm("hacpo", ()), 0, tmp_path / "runs" / "hacpo" / "seed0",
                      config_hash=ex.config_hash(ex.resolved_values(config)), inputs=inputs, steps=steps)
    spec.run_dir.mkdir(parents=True)
    spec.config_path.write_text(config)
    (spec.summary_path).write_text(json.dumps({"status": "completed", "steps": ran_steps, "steps_wanted": ran_steps}))
    if record is not None:
        spec.inputs_path.write_text(json.dumps({"files": record}))
    return spec


def test_a_run_is_reused_only_when_the_files_it_read_are_unchanged(tmp_path):
    now = (("/d/train.jsonl", "sha256:new"), ("/r.py", "sha256:same"))
    spec = _spec_with_run(tmp_path, inputs=now, steps=2, ran_steps=2, record=dict(now))
    assert spec.state == "finished" and spec.done
    spec.inputs_path.write_text(json.dumps({"files": {"/d/train.jsonl": "sha256:old", "/r.py": "sha256:same"}}))
    assert spec.state == "stale" and not spec.done
    assert spec.input_changes() == "/d/train.jsonl changed"
    spec.inputs_path.unlink()  # a run made before the record (or by hand): its inputs are unknown
    assert spec.state == "stale" and "no record of the files it read (seed0.inputs.json)" in spec.input_changes()
    spec.record_inputs()
    assert spec.recorded_inputs() == dict(now) and spec.done
    reads_nothing = _spec_with_run(tmp_path / "other", inputs=(), steps=2, ran_steps=2)
    assert reads_nothing.done  # nothing read, nothing to have changed


def test_a_run_continued_by_hand_past_the_plan_is_neither_reused_nor_overwritten(tmp_path, script_main):
    script_main("compare")
    import sys as _sys

    compare = _sys.modules["scripts_compare"]
    spec = _spec_with_run(tmp_path, inputs=(), steps=1, ran_steps=3, record={})
    assert spec.state == "extended" and not spec.done and spec.extended_to() == 3
    assert ex.planned_runs([spec]) == {"hacpo": (0, 1)} and ex.collect_rows([spec]) == []
    (problem,) = compare.extended_problems([spec])
    text = str(problem)
    assert text.startswith("trainer.steps: got 1;") and "\n" not in text
    assert f"hacpo seed=0 ({spec.run_dir}) was continued by hand to 3 steps" in text
    assert "trainer.steps=3" in text and f"mv {spec.run_dir} {spec.run_dir}_3steps" in text
    assert spec.state == "extended"  # untouched: still there to be moved


@pytest.mark.slow
def test_compare_refuses_an_extended_run_and_reruns_one_whose_reward_file_changed(tmp_path, zoo_cache, script_main,
                                                                                  capsys, monkeypatch):
    """Two planned runs (seeds 0 and 1) of a code reward named on the command line, their directories holding
    completed runs of the planned config: seed 0 continued by hand to 3 steps, seed 1 of 1 step whose reward
    file has since changed in place. compare.py refuses before anything runs (exit 2, one line naming the run,
    its steps and the fix; nothing written or deleted); with seed 0 moved aside, seed 1 is announced stale,
    naming the changed file, and its command starts afresh instead of resuming its checkpoint."""
    from omegaconf import OmegaConf

    from hacrl_lightning.cli import compose_config, hydra_value

    script_main("compare")
    import sys as _sys

    compare = _sys.modules["scripts_compare"]
    reward = tmp_path / "reward.py"
    reward.write_text("def fn(response, gold):\n    return float(gold in response)\n")
    out = tmp_path / "cmp"
    training = ["trainer.steps=1", f"data.reward={reward}:fn", f"zoo_cache={zoo_cache}"]
    args = ["methods=[grpo]", "seeds=[0,1]", *training, f"out={out}"]
    planned = ex.plan_runs(ex.method_arms(["grpo"]), [0, 1], out)
    for spec, steps in zip(planned, (3, 1)):
        _, saved = compose_config(spec.overrides(training, quote=hydra_value), preflight=True)
        spec.run_dir.mkdir(parents=True)
        spec.config_path.write_text(OmegaConf.to_yaml(saved, resolve=True))
        (spec.run_dir / "checkpoints").mkdir()
        spec.summary_path.write_text(json.dumps({"status": "completed", "steps": steps, "steps_wanted": steps}))
        spec.inputs_path.write_text(json.dumps({"files": {str(reward): ex.checksum(reward)}}))
    (out / "runs" / "grpo" / "seed0" / "summary.json").write_text(
        json.dumps({"status": "completed", "steps": 3, "steps_wanted": 3}))
    (out / compare.MARKER).write_text("")  # a comparison's folder
    reward.write_text("def fn(response, gold):\n    return 1.0\n")  # changed in place after seed 1 ran
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}

    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", _no_process)
        assert script_main("compare")(args) == 2
    err = capsys.readouterr().err
    assert "1 configuration problem(s):" in err and "Traceback" not in err
    assert f"grpo seed=0 ({planned[0].run_dir}) was continued by hand to 3 steps" in err and "trainer.steps=3" in err
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before  # nothing written, nothing deleted

    planned[0].run_dir.rename(planned[0].run_dir.with_name("seed0_3steps"))
    specs, wanted = compare.check_runs(planned, training)
    assert dict(specs[1].inputs) == {str(reward): ex.checksum(reward)} and specs[1].steps == 1
    assert [spec.state for spec in specs] == ["unfinished", "stale"]
    compare._announce(specs, [s for s in specs if not s.done], out, wanted)
    console = capsys.readouterr().out
    assert f"stale  grpo seed=1: read other file contents ({reward} changed); re-running it from the start" in console
    command = compare.command(specs[1], training)
    assert "overwrite=true" in command and not any(arg.startswith("resume=") for arg in command)
    specs[1].record_inputs()
    assert specs[1].recorded_inputs() == {str(reward): ex.checksum(reward)}


def test_the_accuracy_columns_are_the_verifiers_and_a_weighted_reward_has_its_own(tmp_path):
    """A run scored by two `data.rewards` terms at weight 1: its summary's `acc` (0.5, the verifier's) is the
    accuracy column, the weighted sum's mean (1.125) the reward column, in results.csv and results.md; a run of
    one unweighted reward has one figure, shown once."""
    spec = ex.RunSpec(ex.Arm("hacpo", ()), 0, tmp_path / "seed0")
    agent = {"initial": {"acc": 0.25, "reward": 0.5, "reward/math_verify": 0.25, "reward/fmt": 0.25},
             "final": {"acc": 0.5, "reward": 1.125, "reward/math_verify": 0.5, "reward/fmt": 0.625},
             "rollouts_generated": 8, "responses_trained": 8, "optimizer_updates": 1}
    summary = {"agents": {"x": agent}, "wall_s": 1.0, "steps": 1}
    (row,) = ex.result_rows(spec, summary)
    assert (row["initial_acc"], row["final_acc"], row["initial_reward"], row["final_reward"]) == (0.25, 0.5, 0.5, 1.125)
    with ex.write_csv([row], tmp_path / "results.csv").open() as handle:
        (written,) = list(csv.DictReader(handle))
    assert (written["final_acc"], written["final_reward"]) == ("0.5", "1.125")
    report = ex.markdown_report(ex.summarize([row]), [], title="t")
    assert "| initial acc | final acc | gain | final reward |" in report
    assert "| hacpo | x | 1 of 1 | 0.250 | 0.500 | 0.250 | 1.125 | 8 |" in report and "it may exceed 1" in report
    plain = {**agent, "initial": {"acc": 0.25}, "final": {"acc": 0.5}}
    (row,) = ex.result_rows(spec, {**summary, "agents": {"x": plain}})
    assert row["final_reward"] == row["final_acc"] == 0.5
    report = ex.markdown_report(ex.summarize([row]), [], title="t")
    assert "final reward" not in report and "| hacpo | x | 1 of 1 | 0.250 | 0.500 | 0.250 | 8 |" in report
