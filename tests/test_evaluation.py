"""Evaluation: unbiased pass@k and avg@k against hand-computed values, the paper's protocol, agents from
exports and checkpoints, and scripts/evaluate.py as a real subprocess on two exported tiny agents."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from hacrl_lightning.agents.agent import AgentLoadError
from hacrl_lightning.data.benchmarks import load_benchmark
from hacrl_lightning.data.synthetic import synthetic_examples
from hacrl_lightning.config import DataConfig
from hacrl_lightning.evaluation import (
    EvalPlan,
    avg_at_k,
    build_engines,
    format_table,
    load_eval_agents,
    pass_at_k,
    plan_benchmarks,
    score_correct,
    unbiased_pass_at_k,
    write_results,
)
from hacrl_lightning.rewards import exact_match_reward

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "math"


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic (the reference for the float estimator)."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


# --- pass@k and avg@k --------------------------------------------------------------------------


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 2, 0.7),                  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 1 - 21 / 252),        # 1 - C(7,5)/C(10,5)
    (4, 1, 1, 0.25),                 # pass@1 = c / n
    (30, 1, 30, 1.0),                # best@30 with one correct answer among 30
    (30, 0, 30, 0.0),
    (8, 0, 3, 0.0),                  # c = 0: never
    (8, 8, 3, 1.0),                  # c = n: always
    (6, 4, 3, 1.0),                  # n - c < k: every draw of k holds a correct one
])
def test_unbiased_pass_at_k_hand_computed(n, c, k, expected):
    assert unbiased_pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_overflow_floats():
    # C(1000, 500) ~ 2.7e299 and C(2000, 1000) overflows a float; the product form does not
    for n, c, k in [(1000, 10, 500), (2000, 3, 1000), (200, 100, 50)]:
        assert unbiased_pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-9)
    assert unbiased_pass_at_k(1000, 1, 1) == pytest.approx(0.001, rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(3, 1, 4), (5, 6, 2), (5, 1, 0)])
def test_pass_at_k_rejects_k_above_n_and_bad_counts(n, c, k):
    with pytest.raises(ValueError, match="1 <= k <= n"):
        unbiased_pass_at_k(n, c, k)


def test_benchmark_pass_at_k_and_avg_at_k_over_problems():
    correct = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)  # c = 2, 0, 4 of n = 4
    # pass@2 per problem: 1 - C(2,2)/C(4,2) = 5/6, 0, 1
    assert float(pass_at_k(correct, 2)) == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert float(pass_at_k(correct, 1)) == pytest.approx((0.5 + 0 + 1) / 3)
    assert float(avg_at_k(correct)) == pytest.approx(6 / 12)
    with pytest.raises(ValueError, match="k must lie in"):
        pass_at_k(correct, 5)
    assert score_correct(correct, (1, 4)) == pytest.approx({"avg@4": 0.5, "pass@1": 0.5, "pass@4": 2 / 3})


def test_partial_rewards_count_in_avg_but_any_positive_reward_passes():
    rewards = torch.tensor([[0.5, 0.0]], dtype=torch.float64)
    assert score_correct(rewards, (2,)) == pytest.approx({"avg@2": 0.25, "pass@2": 1.0})


# --- protocols -----------------------------------------------------------------------------------


def test_paper_protocol_is_avg1_everywhere_and_best30_on_aime25():
    plans = plan_benchmarks(["math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiadbench"])
    assert {p.benchmark: (p.samples, p.headline, p.pass_k) for p in plans} == {
        "math500": (1, "avg@1", ()), "math": (1, "avg@1", ()), "gsm8k": (1, "avg@1", ()),
        "aime2025": (30, "pass@30", (30,)), "amc23": (1, "avg@1", ()), "minerva": (1, "avg@1", ()),
        "olympiadbench": (1, "avg@1", ()),
    }


def test_custom_protocol_and_its_errors():
    assert plan_benchmarks(["amc23"], protocol="custom", samples=8, pass_k=[8, 1, 1]) == \
        [EvalPlan("amc23", 8, "avg@8", (1, 8))]
    with pytest.raises(ValueError, match=r"every k must lie in \[1, samples=4\]"):
        plan_benchmarks(["amc23"], protocol="custom", samples=4, pass_k=[8])
    with pytest.raises(ValueError, match="protocol='best'"):
        plan_benchmarks(["amc23"], protocol="best")
    with pytest.raises(KeyError, match="did you mean 'amc23'"):
        plan_benchmarks(["amc24"], protocol="custom")


def test_table_and_files_round_trip(tmp_path):
    results = {
        "protocol": "paper",
        "benchmarks": {"math500": {"title": "MATH-500", "samples": 1, "headline": "avg@1", "problems": 2},
                       "aime2025": {"title": "AIME25", "samples": 30, "headline": "pass@30", "problems": 1}},
        "agents": {"a": {"source": "/x/a", "average": 0.5,
                         "scores": {"math500": {"headline": 0.5}, "aime2025": {"headline": 0.5}}},
                   "bb": {"source": "/x/bb", "average": 0.25,
                          "scores": {"math500": {"headline": 0.0}, "aime2025": {"headline": 0.5}}}},
    }
    table = format_table(results).splitlines()
    assert table[0] == "| agent | MATH-500 avg@1 | AIME25 pass@30 | AVG   |"
    assert table[2] == "| a     | 0.500          | 0.500          | 0.500 |"
    assert table[3] == "| bb    | 0.000          | 0.500          | 0.250 |"
    json_path, md_path = write_results(results, tmp_path / "out")
    assert json.loads(json_path.read_text()) == results
    assert format_table(results) in md_path.read_text()


# --- agents from exports and checkpoints -------------------------------------------------------


@pytest.fixture(scope="module")
def exports(zoo_agents, tmp_path_factory) -> dict[str, Path]:
    """tiny_a and tiny_b exported as runs/<run>/exports/<agent> would be."""
    root = tmp_path_factory.mktemp("run") / "exports"
    return {name: zoo_agents[name].export(root / name) for name in ("tiny_a", "tiny_b")}


@pytest.fixture(scope="module")
def arithmetic_benchmark(tmp_path_factory) -> Path:
    """Held-out synthetic problems in verl's schema: the tiny agents get some of them right."""
    path = tmp_path_factory.mktemp("bench") / "arith.jsonl"
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": ex.prompt}],
             "reward_model": {"style": "rule", "ground_truth": ex.gold}}
            for ex in synthetic_examples(DataConfig(), "eval", 16)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.slow
def test_checkpoint_agents_get_the_checkpoints_weights(zoo_agents, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from hacrl_lightning.cli import compose_config

    from hacrl_lightning.training import train

    run_dir = tmp_path / "run"
    cfg, dcfg = compose_config(["agents=[tiny_a,tiny_b]", "trainer.steps=1", "data.prompts_per_step=4",
                                "trainer.mini_batch_prompts=2", "rollout.group_size=4", "trainer.eval_every=0",
                                "data.eval_size=2", f"run_dir={run_dir}"])
    train(cfg, config_yaml=OmegaConf.to_yaml(dcfg, resolve=True))  # one real HACPO step: a Lightning checkpoint and the exports hold the trained weights
    checkpoint = run_dir / "checkpoints" / "step_0000001.ckpt"
    assert checkpoint.exists()

    for entry in (run_dir, checkpoint):
        agents, sources, checkpoints = load_eval_agents([str(entry)])
        assert list(agents) == ["tiny_a", "tiny_b"]
        for name, agent in agents.items():
            assert sources[name] == f"checkpoint {checkpoint}"  # the file, also when a run dir was given
            assert checkpoints[name] == {"file": str(checkpoint), "step": 1, "steps_wanted": 1, "run": "completed"}
            exported = AutoModelForCausalLM.from_pretrained(run_dir / "exports" / name).state_dict()
            loaded = agent.model.state_dict()
            assert loaded.keys() == exported.keys()
            assert all(torch.equal(loaded[key], exported[key]) for key in loaded)
            untrained = zoo_agents[name].model.state_dict()
            assert any(not torch.equal(loaded[key], untrained[key]) for key in loaded)  # the step moved weights

    (run_dir / "config.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="no config.yaml"):
        load_eval_agents([str(run_dir)])


def test_exported_dirs_restore_their_settings(exports, zoo_agents):
    agents, sources, checkpoints = load_eval_agents([str(exports["tiny_a"]), str(exports["tiny_a"])])
    assert list(agents) == ["tiny_a", "tiny_a-2"] and checkpoints == {}
    assert agents["tiny_a"].max_response_len == zoo_agents["tiny_a"].max_response_len
    assert sources["tiny_a"] == str(exports["tiny_a"])
    run_dir = exports["tiny_a"].parents[1]  # a run dir without checkpoints: its exports
    agents, sources, _ = load_eval_agents([str(run_dir)])
    assert sources == {"tiny_a": str(exports["tiny_a"]), "tiny_b": str(exports["tiny_b"])}
    for entry in (str(exports["tiny_a"].parent / "no_such_agent"), "runs/missing/exports/tiny_a"):
        with pytest.raises(AgentLoadError, match="neither an agent directory"):
            load_eval_agents([entry])
    with pytest.raises(AgentLoadError, match="no config.json in it"):
        load_eval_agents([str(exports["tiny_a"].parent)])


KILL_IN_EXPORT = """
import os, runpy, signal, sys
import hacrl_lightning.agents.agent as agent
agent.save_tokenizer = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # weights written, tokenizer not
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""`python -c KILL_IN_EXPORT scripts/train.py ...`: the real script, killed by SIGKILL half-way through its first export."""

ONE_STEP = ["agents=[tiny_a,tiny_b]", "data.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.group_size=2",
            "trainer.eval_every=0", "data.eval_size=2"]


@pytest.mark.slow
def test_an_export_cut_short_never_looks_complete_and_resume_exports_again(tmp_path, zoo_cache, script_main, capsys):
    run, out = tmp_path / "run", tmp_path / "eval"
    args = [*ONE_STEP, "trainer.steps=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    killed = subprocess.run([sys.executable, "-c", KILL_IN_EXPORT, str(REPO / "scripts" / "train.py"), *args],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    exports = run / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["tiny_a.partial"]  # no tiny_a that looks complete
    assert (exports / "tiny_a.partial" / "model.safetensors").is_file()

    for entry in (exports / "tiny_a", exports / "tiny_a.partial"):
        status = _script().main([f"agents=[{entry}]", "benchmarks=[synthetic]", "limit=2", f"output_dir={out}"])
        err = capsys.readouterr().err
        assert status == 2
        assert f"{exports / 'tiny_a.partial'} is an incomplete export" in err, err
        assert f"resume={run}" in err and f"agents=[{run}]" in err  # how to redo it, or what to score instead
        assert "sentencepiece" not in err and "chat template" not in err
    assert not out.exists()

    assert script_main("train")([*args, f"resume={run}"]) == 0  # the run trains nothing more and exports again
    assert sorted(p.name for p in exports.iterdir()) == ["tiny_a", "tiny_b"]
    agents, sources, _ = load_eval_agents([str(exports / "tiny_a")])
    assert sources == {"tiny_a": str(exports / "tiny_a")}

    half = tmp_path / "half"  # a directory cut short by other means: its tokenizer files missing
    shutil.copytree(exports / "tiny_a", half)
    (half / "tokenizer.json").unlink()
    (half / "tokenizer_config.json").unlink()
    with pytest.raises(AgentLoadError, match=r"incomplete export \(no tokenizer files \(tokenizer.json or "
                                             r"tokenizer_config.json\) in it\). Fix: write the directory again"):
        load_eval_agents([str(half)])


def test_an_older_export_beside_a_newer_one_cut_short_is_refused(exports, tmp_path):
    older = tmp_path / "exports" / "tiny_a"
    shutil.copytree(exports["tiny_a"], older)  # complete, from an earlier step of an extended run
    assert load_eval_agents([str(older)])[1] == {"tiny_a": str(older)}
    (tmp_path / "exports" / "tiny_a.partial").mkdir()  # the extension's export, killed
    with pytest.raises(AgentLoadError, match=r"incomplete export \(a newer export into it was cut short "
                                             r"\(tiny_a.partial is beside it\)"):
        load_eval_agents([str(older)])


def test_an_export_replaces_the_previous_one_whole_and_refuses_a_users_directory(zoo_agents, tmp_path):
    target = tmp_path / "tiny_a"
    target.mkdir()
    (target / "pytorch_model.bin").write_text("an older export's weights")
    (target / "config.json").write_text("{}")
    zoo_agents["tiny_a"].export(target)
    assert "pytorch_model.bin" not in {p.name for p in target.iterdir()}  # no stale file beside the new export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_a"]      # no .partial or .old left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds other files than a model directory's"):
        zoo_agents["tiny_a"].export(mine)
    assert (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_evaluate_on_a_run_still_training_names_the_checkpoint_it_scored(tmp_path, zoo_cache, capsys):
    run, out = tmp_path / "run", tmp_path / "eval"
    args = [*ONE_STEP, "trainer.steps=1000", "trainer.checkpoint_every=1", f"zoo_cache={zoo_cache}", f"run_dir={run}"]
    training = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard, not a timing
        while not list((run / "checkpoints").glob("step_*.ckpt")):
            assert training.poll() is None, training.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        status = _script().main([f"agents=[{run}]", "benchmarks=[synthetic]", "limit=2", f"output_dir={out}",
                                 "reward_workers=0"])
        still_training = training.poll() is None
    finally:
        training.send_signal(signal.SIGTERM)
        _, training_err = training.communicate(timeout=300)
    printed = capsys.readouterr()
    assert status == 0 and still_training, (printed.err + training_err)[-3000:]
    printed = printed.out
    results = json.loads((out / "results.json").read_text())
    for name in ("tiny_a", "tiny_b"):
        info = results["agents"][name]["checkpoint"]
        checkpoint = Path(info["file"])
        assert checkpoint.parent == run / "checkpoints" and checkpoint.name == f"step_{info['step']:07d}.ckpt"
        assert info["step"] >= 1 and info["steps_wanted"] == 1000 and info["run"] == "training"
        assert results["agents"][name]["source"] == f"checkpoint {checkpoint}"
    table = format_table(results)
    assert f"| step {info['step']} of 1000, {checkpoint.name}, run still training |" in table
    assert table in printed and table in (out / "results.md").read_text()
    assert f"note: tiny_a's run is still training: scored at its newest checkpoint, step {info['step']} of 1000" in printed


# --- scripts/evaluate.py ------------------------------------------------------------------------


def _script():
    spec = importlib.util.spec_from_file_location("evaluate_script", REPO / "scripts" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evaluate_reports_every_config_problem_at_once(capsys):
    status = _script().main(["agents=[]", "benchmarks=[math5000,aime2025]", "protocol=custom", "samples=2",
                             "pass_k=[3]", "reward=exact_matc", "files.gsm8k=x.jsonl"])
    err = capsys.readouterr().err
    assert status == 2
    for words in ("agents: got []", "benchmarks: got 'math5000'", "did you mean 'math500'", "pass_k: got [3]",
                  "reward: got 'exact_matc'", "files.gsm8k: got 'x.jsonl'"):
        assert words in err, words


def test_greedy_decoding_cannot_draw_several_answers(capsys):
    status = _script().main(["agents=[x]", "benchmarks=[math500,aime2025]", "temperature=0", "reward=exact_match"])
    assert status == 2
    assert "temperature: got 0; allowed: > 0 where several answers per problem are drawn (['aime2025'])" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_on_two_exported_agents_writes_table_and_files(exports, arithmetic_benchmark, tmp_path):
    out = tmp_path / "eval"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "scripts" / "evaluate.py"),
           f"agents=[{exports['tiny_a']},{exports['tiny_b']}]", "benchmarks=[gsm8k,aime2025]",
           f"files.gsm8k={arithmetic_benchmark}", f"files.aime2025={FIXTURES / 'aime2025.parquet'}",
           "reward=exact_match", "protocol=paper", f"output_dir={out}", "max_prompt_len=176",  # the AIME prompts whole
           "reward_workers=0"]  # scored in the script's process: worker processes are tests/test_reward_pool.py's
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    assert format_table(results) in proc.stdout          # the table on screen ...
    assert format_table(results) in (out / "results.md").read_text()  # ... and in the markdown file
    assert (out / "evaluate.yaml").exists()
    assert results["protocol"] == "paper"
    assert results["benchmarks"]["gsm8k"] == {"title": "GSM8K", "samples": 1, "headline": "avg@1", "problems": 16}
    assert results["benchmarks"]["aime2025"] == {"title": "AIME25", "samples": 30, "headline": "pass@30", "problems": 3}
    assert list(results["agents"]) == ["tiny_a", "tiny_b"]
    for name, row in results["agents"].items():
        greedy, aime = row["scores"]["gsm8k"], row["scores"]["aime2025"]
        assert greedy["avg@1"] == greedy["headline"] == pytest.approx(sum(greedy["correct"]) / 16)
        assert aime["pass@30"] == pytest.approx(sum(unbiased_pass_at_k(30, c, 30) for c in aime["correct"]) / 3)
        assert aime["avg@30"] == pytest.approx(sum(aime["correct"]) / 90)
        assert row["average"] == pytest.approx((greedy["headline"] + aime["headline"]) / 2)

    # the greedy scores are what the agents really answer: recompute them in this process
    agents, _, _ = load_eval_agents([str(exports["tiny_a"]), str(exports["tiny_b"])])
    engines = build_engines(agents)
    examples = list(load_benchmark("gsm8k", [arithmetic_benchmark]))
    from hacrl_lightning.rollout.engine import SamplingSettings

    for name, agent in agents.items():
        generations = engines[name].generate(agent.encode_prompts([ex.prompt for ex in examples]),
                                             SamplingSettings(max_new_tokens=agent.max_response_len, temperature=0.0))
        correct = [int(exact_match_reward(agent.decode_response(g.token_ids), ex.gold))
                   for g, ex in zip(generations, examples)]
        assert results["agents"][name]["scores"]["gsm8k"]["correct"] == correct
    assert any(sum(r["scores"]["gsm8k"]["correct"]) > 0 for r in results["agents"].values())

    # the two agents together, from the answers already scored (one greedy answer per GSM8K problem: by hand)
    a, b = (results["agents"][name]["scores"]["gsm8k"]["correct"] for name in ("tiny_a", "tiny_b"))
    together = results["collective"]["gsm8k"]
    assert together["agents"] == ["tiny_a", "tiny_b"] and together["problems"] == 16
    assert together["union_acc"] == pytest.approx(sum(max(x, y) for x, y in zip(a, b)) / 16)
    assert together["best_single_acc"] == pytest.approx(max(sum(a), sum(b)) / 16)
    assert together["union_gain"] == pytest.approx(together["union_acc"] - together["best_single_acc"])
    assert together["right_wrong"]["tiny_a"]["tiny_b"] == pytest.approx(sum(x > y for x, y in zip(a, b)) / 16)
    assert together["right_wrong"]["tiny_b"]["tiny_a"] == pytest.approx(sum(y > x for x, y in zip(a, b)) / 16)
    assert 0.0 <= together["majority_acc"] <= together["union_acc"]
    assert results["collective"]["aime2025"]["problems"] == 3  # from each agent's first of its 30 answers
    assert "## The agents together" in (out / "results.md").read_text()
    assert f"GSM8K together: union {together['union_acc']:.3f}" in proc.stdout


def test_save_responses_writes_every_answer_with_its_prompt_boxed_answer_and_reward(script_main, capsys, tmp_path,
                                                                                     zoo_cache):
    """`save_responses=true`: one JSON line per answer; its rewards are the ones the table counts, and each reward
    is exact match of its `boxed` field with the gold answer (the synthetic task's reward)."""
    out = tmp_path / "eval"
    status = script_main("evaluate")(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=16", "reward_workers=0",
                                      "save_responses=true", f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    assert status == 0, capsys.readouterr()
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    results = json.loads((out / "results.json").read_text())
    row = results["agents"]["tiny_b"]["scores"]["synthetic"]
    assert len(records) == 16 and [r["prompt_id"] for r in records] == row["prompt_ids"]
    assert [int(r["reward"] > 0) for r in records] == row["correct"] and 0 < sum(row["correct"]) < 16
    for r in records:
        assert r["agent"] == "tiny_b" and r["benchmark"] == "synthetic" and r["sample"] == 0
        assert r["question"] in r["prompt"] and r["prompt"] != r["question"]  # the chat template around it
        assert r["reward"] == float(r["boxed"] is not None and r["boxed"].strip() == r["gold"].strip())
    assert "responses.jsonl" in capsys.readouterr().out


def test_few_shot_evaluates_on_the_prompts_a_few_shot_run_trains_on(script_main, capsys, tmp_path, zoo_cache):
    """`few_shot=2`: each question after the same two worked examples of the synthetic train split that
    `data.few_shot=2` gives a run (its held-out prompts, exactly)."""
    from hacrl_lightning.config import DataConfig
    from hacrl_lightning.data.tasks import load_task

    out = tmp_path / "eval"
    status = script_main("evaluate")(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=4", "reward_workers=0",
                                      "few_shot=2", "max_prompt_len=256", "save_responses=true", f"output_dir={out}",
                                      f"zoo_cache={zoo_cache}"])
    assert status == 0, capsys.readouterr()
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    _, held_out = load_task(DataConfig(few_shot=2))
    assert [r["question"] for r in records] == [ex.prompt for ex in list(held_out)[:4]]
    assert all(r["question"].count("\\boxed{") == 5 for r in records)  # 2 x (a question's ask, its answer) + its own ask


# -- evaluate.py as strict as train.py: the fourth round of hostile inputs (2026-11-28) --------------------------


@pytest.fixture(scope="module")
def earlier_evaluation(tmp_path_factory, zoo_cache) -> Path:
    """One evaluation of tiny_b with its responses, in a folder of its own (shared by the output-folder tests)."""
    out = tmp_path_factory.mktemp("earlier") / "eval"
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=4", "reward_workers=0",
                             "save_responses=true", f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    assert status == 0
    return out


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("responses", [True, False], ids=["save_responses", "plain"])
def test_a_second_evaluation_into_its_own_folder_is_refused_naming_it(earlier_evaluation, zoo_cache, capsys,
                                                                      responses):
    before = _contents(earlier_evaluation)
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=2", "reward_workers=0",
                             *(["save_responses=true"] if responses else []), f"output_dir={earlier_evaluation}",
                             f"zoo_cache={zoo_cache}"])
    err = capsys.readouterr().err
    assert status == 2 and _contents(earlier_evaluation) == before  # nothing replaced
    assert f"output_dir: got '{earlier_evaluation}'" in err and "an earlier evaluation of tiny_b" in err
    assert "responses.jsonl" in err and "results.json" in err and "overwrite=true" in err


@pytest.mark.slow
def test_overwrite_replaces_every_file_of_the_earlier_evaluation(earlier_evaluation, zoo_cache, tmp_path, capsys):
    out = tmp_path / "eval"
    shutil.copytree(earlier_evaluation, out)
    (out / "engine_dirs").mkdir()
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=2", "reward_workers=0",
                             "overwrite=true", f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    said = capsys.readouterr().out
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == ["evaluate.yaml", "results.json", "results.md"]  # no stale file
    assert json.loads((out / "results.json").read_text())["benchmarks"]["synthetic"]["problems"] == 2  # the new one
    assert "deleted the earlier evaluation's evaluate.yaml, results.json, results.md, responses.jsonl" in said


@pytest.mark.slow
def test_a_reward_failing_on_every_answer_stops_evaluate_with_one_line(tmp_path, zoo_cache, capsys):
    code = tmp_path / "broken.py"
    code.write_text("def fn(response, gold):\n    raise ZeroDivisionError('boom')\n")
    out = tmp_path / "eval"
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=2", "reward_workers=0",
                             f"reward={code}:fn", f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert status == 1 and not out.exists()
    assert errors == [f"error: tiny_b on synthetic: reward '{code}:fn' failed on all 2 answers it was given (the "
                      "first raised ZeroDivisionError: boom); no results were written. Fix: correct the reward and "
                      "try it on one answer first, or score with another: reward=<name>"]


def test_a_few_failed_answers_still_score_zero_and_are_counted(tmp_path):
    from hacrl_lightning.evaluation import RewardFailedEverywhere, strict_scorer
    from hacrl_lightning.rewards import Reward, RewardPool

    code = tmp_path / "picky.py"
    code.write_text("def fn(response, gold):\n    return 1.0 / (gold != 'x')\n")
    with RewardPool(Reward.of(f"{code}:fn"), workers=0, timeout_s=5) as pool:
        score = strict_scorer(pool, f"{code}:fn")
        assert score(["a", "b", "c"], ["1", "x", "2"]) == [1.0, 0.0, 1.0]
        assert pool.stats["term_failures"] == 1
        with pytest.raises(RewardFailedEverywhere, match=r"failed on all 2 answers .*ZeroDivisionError"):
            score(["a", "b"], ["x", "x"])
    with RewardPool(Reward.of("exact_match", [{"reward": "exact_match", "weight": 1.0},
                                              {"reward": f"{code}:fn", "weight": 0.5}]), workers=0, timeout_s=5) as pool:
        with pytest.raises(RewardFailedEverywhere, match=r"its term 'fn'\) failed on all 1 answers"):
            strict_scorer(pool, "data.rewards")(["\\boxed{x}"], ["x"])


@pytest.mark.slow
def test_few_shot_prompts_longer_than_the_model_are_refused_before_anything_is_written(tmp_path, zoo_cache, capsys):
    out = tmp_path / "eval"
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=2", "few_shot=30",
                             f"output_dir={out}", f"zoo_cache={zoo_cache}"])
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert "max_prompt_len (agent tiny_b): got 96" in err and "none of 2 synthetic prompts fits" in err
    assert "more than the 256 positions of tiny_b's model" in err and "fewer worked examples than few_shot=30" in err


def test_a_checkpoint_the_weights_only_reader_cannot_parse_is_one_line(tmp_path, capsys):
    from hacrl_lightning.safe_load import UnreadableCheckpoint, load_checkpoint_file

    bad = tmp_path / "step_0000001.ckpt"
    bad.write_bytes(b"\x80\x02\xff")  # pickle protocol 2, then an opcode that does not exist
    with pytest.raises(UnreadableCheckpoint, match=r"step_0000001.ckpt: not readable as a checkpoint: .*'Unsupported "
                       r"operand 255'; nothing of it was run\. Fix: give a checkpoint written by this project"):
        load_checkpoint_file(bad)
    status = _script().main(["agents=[" + str(bad) + "]", "benchmarks=[synthetic]", "limit=1",
                             f"output_dir={tmp_path / 'eval'}"])
    err = capsys.readouterr().err
    assert status == 2 and "not readable as a checkpoint" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_reward_workers_that_cannot_score_stop_evaluate_with_one_line(tmp_path, zoo_cache, capsys):
    """A reward whose workers end in their warm-up (`os._exit`): evaluate.py ends with one line and status 1, as
    train.py does, and leaves no folder (was: a `RewardWorkersFailed` traceback)."""
    out = tmp_path / "eval"
    code = tmp_path / "warm_exit.py"  # its own file: tests/reward_faults.py registers a reward when imported
    code.write_text("import os\n\ndef warm_up_exits(response, gold):\n"
                    "    if response == '\\\\boxed{1}' and gold == '1':  # the pool's warm-up item\n"
                    "        os._exit(0)\n    return float(response == gold)\n")
    status = _script().main(["agents=[zoo:tiny_b]", "benchmarks=[synthetic]", "limit=2", "reward_workers=1",
                             "reward_timeout_s=2", f"reward={code}:warm_up_exits", f"output_dir={out}",
                             f"zoo_cache={zoo_cache}"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1 and not out.exists() and "Traceback" not in err
    assert len(errors) == 1 and "warm_up_exits" in errors[0], err[-2000:]
