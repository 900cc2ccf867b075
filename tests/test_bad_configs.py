"""Bad configurations fail before any model is loaded, with ONE message listing every problem.

Most cases go in-process through the path `scripts/train.py` takes (`compose_config(...,
preflight=True)`: compose, validate, then the file/tokenizer preflight); a few run the real script
(its `main`, in-process; once as a subprocess) and check the exit status, the message on stderr, that
no traceback is shown and that nothing is written. Every in-process case also checks that no model
weights were loaded (`from_pretrained` of a causal LM is watched, not replaced).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only
from transformers import AutoModelForCausalLM

from conftest import agent_preset, save_lossy_wordpiece
from hacrl_lightning import zoo
from hacrl_lightning.cli import compose_config
from hacrl_lightning.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory, zoo_cache) -> dict[str, Path]:
    """A lossy (WordPiece) tokenizer dir, an empty dir, a missing path, tiny_b with its embedding padded
    to 320 rows (305 tokens), and the zoo cache in use (with the agents used here built, so that a cold
    cache's one-time build is not mistaken for a model load)."""
    built = {name: zoo.ensure_built(name, cache_dir=zoo_cache) for name in ("tiny_a", "tiny_b", "tiny_c", "tiny_qwen3")}
    root = tmp_path_factory.mktemp("bad_configs")
    save_lossy_wordpiece(root / "wordpiece", ["\\", "boxed", "{", "}", "what", "is", "?", "+"])
    (root / "empty").mkdir()
    padded = shutil.copytree(built["tiny_b"], root / "padded")
    model = AutoModelForCausalLM.from_pretrained(padded)
    model.resize_token_embeddings(320, mean_resizing=False)
    model.save_pretrained(padded)
    return {"lossy": root / "wordpiece", "empty": root / "empty", "missing": root / "no_such_model",
            "run": root / "run_without_checkpoints", "zoo": zoo_cache, "padded": Path(padded)}


# (case id, overrides (with {placeholders} from `files`), the key that must be reported)
CASES = [
    ("unknown_agent", ["agents=[tiny_a,tiny_zz]"], "agents"),
    ("duplicate_agent_keys", ["agents=[tiny_a,tiny_a]"], "agents"),
    ("group_size_below_2", ["rollout.group_size=1"], "rollout.group_size"),
    ("mini_batch_not_dividing_batch", ["data.prompts_per_step=6", "trainer.mini_batch_prompts=4"],
     "trainer.mini_batch_prompts"),
    ("delta_above_1", ["algorithm.delta=1.5"], "algorithm.delta"),
    ("delta_below_0", ["algorithm.delta=-0.1"], "algorithm.delta"),
    ("alpha_negative", ["algorithm.alpha=-0.5"], "algorithm.alpha"),
    ("negative_lr", ["agents.tiny_b.lr=-1e-4"], "agents.tiny_b.lr"),
    ("keep_at_end_unknown", ["trainer.keep_at_end=weights_only"], "trainer.keep_at_end"),
    ("keep_at_end_exports_without_exports", ["trainer.keep_at_end=exports", "trainer.export_agents=false"],
     "trainer.keep_at_end"),
    ("few_shot_negative", ["data.few_shot=-1"], "data.few_shot"),
    ("no_signal_steps_negative", ["trainer.no_signal_steps=-2"], "trainer.no_signal_steps"),
    ("lora_rank_negative", ["agents.tiny_a.lora.rank=-4"], "agents.tiny_a.lora.rank"),
    ("lora_alpha_zero", ["agents.tiny_a.lora.rank=8", "agents.tiny_a.lora.alpha=0"], "agents.tiny_a.lora.alpha"),
    ("lora_dropout", ["agents.tiny_a.lora.rank=8", "agents.tiny_a.lora.dropout=0.05"], "agents.tiny_a.lora.dropout"),
    ("lora_engine_unknown", ["agents.tiny_b.lora.rank=8", "agents.tiny_b.lora.engine=delta"],
     "agents.tiny_b.lora.engine"),
    ("lora_no_targets", ["agents.tiny_b.lora.rank=8", "agents.tiny_b.lora.target_modules=[]"],
     "agents.tiny_b.lora.target_modules"),
    ("window_k_zero", ["algorithm.capability_window=0"], "algorithm.capability_window"),
    ("collaborative_with_one_agent", ["agents=[tiny_a]", "algorithm=hacpo"], "agents"),
    ("max_prompt_len_too_small", ["agents.tiny_a.max_prompt_len=8"], "agents.tiny_a.max_prompt_len"),
    ("max_response_len_too_small", ["agents.tiny_b.max_response_len=2"], "agents.tiny_b.max_response_len"),
    ("missing_local_model_dir", ["agents.tiny_a.model={missing}"], "agents.tiny_a.model"),
    ("model_dir_without_config", ["agents.tiny_a.model={empty}"], "agents.tiny_a.model"),
    ("unknown_zoo_preset", ["agents.tiny_a.model=zoo:tiny_zz"], "agents.tiny_a.model"),
    ("lossy_tokenizer", ["agents.tiny_b.tokenizer={lossy}"], "agents.tiny_b.tokenizer"),
    ("another_agents_larger_tokenizer", ["agents.tiny_a.tokenizer=zoo:tiny_qwen3"], "agents.tiny_a.tokenizer"),
    ("another_agents_tokenizer_a_bit_larger", ["agents.tiny_b.tokenizer=zoo:tiny_c"], "agents.tiny_b.tokenizer"),
    ("another_agents_smaller_tokenizer", ["agents=[tiny_a,tiny_c]", "agents.tiny_c.tokenizer=zoo:tiny_b"],
     "agents.tiny_c.tokenizer"),
    ("unknown_reward", ["data.reward=exakt"], "data.reward"),
    ("unknown_task", ["data.name=gsm9k"], "data.name"),
    ("unknown_data_file", ["data.train_files=[{missing}.jsonl]"], "data.train_files[0]"),
    ("unknown_key", ["trainer.stepz=3"], "trainer.stepz"),
    ("wrong_type", ["trainer.steps=many"], "trainer.steps"),
    ("unknown_algorithm", ["algorithm=hacpoo"], "algorithm"),
    ("negative_fault_budget", ["trainer.max_nonfinite_skips=-1"], "trainer.max_nonfinite_skips"),
    ("override_undoes_the_ablation", ["algorithm=hacpo_alpha0", "algorithm.alpha=3"], "algorithm.alpha"),
    ("pair_value_for_a_baseline", ["agents=[tiny_a]", "algorithm=grpo", "pair.alpha=3"], "pair.alpha"),
    ("resume_without_checkpoint", ["resume={run}"], "resume"),
    ("response_past_the_models_positions", ["agents.tiny_a.max_response_len=100000000"], "agents.tiny_a.max_response_len"),
    ("prompt_past_the_models_positions", ["agents.tiny_b.max_prompt_len=300"], "agents.tiny_b.max_prompt_len"),
    ("split_on_one_device", ["trainer.placement=split"], "trainer.placement"),
    ("split_three_agents_on_two_ranks", ["agents=[tiny_a,tiny_b,tiny_c]", "trainer=fsdp", "trainer.devices=2",
                                         "trainer.placement=split"], "trainer.devices"),
    ("split_sizes_that_do_not_sum", ["trainer=fsdp", "trainer.devices=4", "trainer.placement=split",
                                     "agents.tiny_a.ranks=1", "agents.tiny_b.ranks=2"], "agents.tiny_a.ranks"),
    ("split_group_not_dividing_the_prompts", ["trainer=fsdp", "trainer.devices=4", "trainer.placement=split",
                                              "agents.tiny_a.ranks=3", "agents.tiny_b.ranks=1",
                                              "data.prompts_per_step=8", "trainer.mini_batch_prompts=4"],
     "data.prompts_per_step"),
    ("several_devices_without_fsdp", ["trainer.accelerator=cpu", "trainer.devices=2"], "trainer.devices"),
    ("several_nodes_without_fsdp", ["trainer.accelerator=cpu", "trainer.num_nodes=2"], "trainer.num_nodes"),
    ("several_devices_single_strategy", ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=single"],
     "trainer.devices"),
    ("engine_sleep_with_transformers", ["rollout.sleep=true"], "rollout.sleep"),
    ("placement_unknown", ["trainer.placement=spread"], "trainer.placement"),
    ("weight_sync_unknown", ["rollout.weight_sync=nccl"], "rollout.weight_sync"),
    ("weight_sync_bucket_not_positive", ["rollout.weight_sync_mb=0"], "rollout.weight_sync_mb"),
]


def overrides_for(overrides: list[str], files: dict[str, Path]) -> list[str]:
    return [o.format(**files) for o in overrides] + [f"zoo_cache={files['zoo']}"]


def problems_of(overrides: list[str]):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides, preflight=True)
    return info.value


@pytest.mark.slow
@pytest.mark.parametrize("overrides, key", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_fails_before_any_model_with_key_value_allowed_and_fix(overrides, key, files, model_loads):
    error = problems_of(overrides_for(overrides, files))
    keys = [p.key for p in error.problems]
    assert key in keys, str(error)
    for problem in error.problems:
        assert problem.allowed and problem.fix and str(problem).startswith(f"{problem.key}: got ")
    assert str(error).splitlines()[0] == f"{len(error.problems)} configuration problem(s):"
    assert model_loads == []


def test_the_good_default_passes_the_preflight(files, model_loads):
    cfg, _ = compose_config(overrides_for(["agents=[tiny_a,tiny_b]"], files), preflight=True)
    assert list(cfg.agents) == ["tiny_a", "tiny_b"] and model_loads == []


def test_every_problem_of_every_kind_is_in_one_error(files, model_loads):
    """Value problems (validate) and file/tokenizer problems (preflight) come back together, in order."""
    error = problems_of(overrides_for([
        "rollout.group_size=1", "algorithm.delta=1.5", "agents.tiny_a.max_prompt_len=8",
        "agents.tiny_b.tokenizer={lossy}", "agents.tiny_b.lr=-1.0"], files))
    assert [p.key for p in error.problems] == [
        "agents.tiny_b.lr", "algorithm.delta", "rollout.group_size", "agents.tiny_a.max_prompt_len",
        "agents.tiny_b.tokenizer"]
    by_key = {p.key: p for p in error.problems}
    assert by_key["agents.tiny_a.max_prompt_len"].value == 8
    tokenizer = by_key["agents.tiny_b.tokenizer"]
    assert "lossless" in tokenizer.allowed and "WordPiece" in tokenizer.fix
    assert model_loads == []


@pytest.mark.slow
def test_another_agents_tokenizer_names_both_sizes_and_the_fix(files, model_loads):
    """On main these trained: tiny_a's model with tiny_qwen3's tokenizer died in the first forward
    (IndexError), tiny_c's model with tiny_b's (smaller) tokenizer trained at accuracy 0.000, exit 0."""
    larger = problems_of(overrides_for(["agents.tiny_a.tokenizer=zoo:tiny_qwen3"], files)).problems
    assert [(p.key, p.value) for p in larger] == [("agents.tiny_a.tokenizer", "zoo:tiny_qwen3")]
    assert "(356 rows)" in larger[0].allowed and "151,669 tokens" in larger[0].fix
    assert "drop agents.tiny_a.tokenizer" in larger[0].fix
    smaller = problems_of(overrides_for(["agents=[tiny_a,tiny_c]", "agents.tiny_c.tokenizer=zoo:tiny_b"], files))
    (problem,) = smaller.problems
    assert problem.key == "agents.tiny_c.tokenizer" and "same ids" in problem.allowed
    assert "What is" in problem.fix and "drop agents.tiny_c.tokenizer" in problem.fix
    assert model_loads == []


def test_a_tokenizer_smaller_than_the_embedding_is_the_models_own(files, model_loads):
    """Padded vocabularies (Qwen's 151,669 tokens in 151,936 rows) are normal: accepted, and loaded."""
    cfg, _ = compose_config(overrides_for(["agents.tiny_b.model={padded}"], files), preflight=True)
    assert model_loads == []
    from hacrl_lightning.agents import Agent

    agent = Agent.load("tiny_b", cfg.agents["tiny_b"])
    assert agent.model.get_input_embeddings().num_embeddings == 320 and len(agent.tokenizer) == 305


def test_prompt_limit_names_the_length_that_fits(files):
    """The fix for a too-small max_prompt_len is a number that passes (hand-checked round trip)."""
    error = problems_of(overrides_for(["agents.tiny_a.max_prompt_len=8"], files))
    fix = next(p for p in error.problems if p.key == "agents.tiny_a.max_prompt_len").fix
    needed = int(fix.split("max_prompt_len=")[1].split()[0])
    assert needed > 8
    compose_config(overrides_for([f"agents.tiny_a.max_prompt_len={needed}"], files), preflight=True)
    problems = problems_of(overrides_for([f"agents.tiny_a.max_prompt_len={needed - 1}"], files)).problems
    assert [p.key for p in problems] == ["agents.tiny_a.max_prompt_len"]


@pytest.mark.slow
def test_few_shot_prompts_get_room_where_the_command_line_left_the_lengths_to_the_presets(files, model_loads, capsys,
                                                                                          monkeypatch):
    """`data.few_shot=2` puts two worked examples before every question: tiny_a's preset limit (96, bare questions)
    holds none of them. Left to the presets, each agent's max_prompt_len becomes its longest sampled prompt, and
    tiny_a's response gets what its 256 positions leave (234 + 22); said (by rank 0 only), and saved as what runs. A length the
    command line sets is the user's: kept, and refused if it cannot hold the prompts."""
    cfg, dcfg = compose_config(overrides_for(["agents=[tiny_a,tiny_b]", "data.few_shot=2"], files), preflight=True)
    lengths = {name: (a.max_prompt_len, a.max_response_len) for name, a in cfg.agents.items()}
    assert lengths == {"tiny_a": (234, 22), "tiny_b": (112, 24)}
    assert {name: (a.max_prompt_len, a.max_response_len) for name, a in dcfg.agents.items()} == lengths
    out = capsys.readouterr().out
    assert "agents.tiny_a: data.few_shot prompts take up to 234 tokens" in out and "24 -> 22" in out
    assert "max_prompt_len 96 -> 112." in out and model_loads == []
    with monkeypatch.context() as patch:  # another rank of the run: the same fit, said by rank 0 alone
        patch.setattr(rank_zero_only, "rank", 1)
        other, _ = compose_config(overrides_for(["agents=[tiny_a,tiny_b]", "data.few_shot=2"], files), preflight=True)
    assert {name: (a.max_prompt_len, a.max_response_len) for name, a in other.agents.items()} == lengths
    assert "data.few_shot prompts" not in capsys.readouterr().out
    plain, _ = compose_config(overrides_for(["agents=[tiny_a,tiny_b]"], files), preflight=True)
    assert plain.agents["tiny_a"].max_prompt_len == 96  # without examples nothing changes
    for chosen in ("agents.tiny_a.max_prompt_len=96", "agents.tiny_a.max_response_len=40"):
        problems = problems_of(overrides_for(["agents=[tiny_a,tiny_b]", "data.few_shot=2", chosen], files)).problems
        assert [p.key for p in problems] == ["agents.tiny_a.max_prompt_len"], chosen
        assert "234 to keep them all" in problems[0].fix


def test_the_fit_measures_every_prompt_and_counts_those_the_positions_cannot_hold(files):
    """The fit reads every prompt of both splits, not the preflight's sample of 64 (a longer prompt outside the
    sample would be dropped at load without anyone having chosen the limit): the longest that leaves tiny_a's 256
    positions room for the answer sets max_prompt_len, and one too long for any response is counted, not fitted."""
    from hacrl_lightning.agents.agent import encode_chat_prompts
    from hacrl_lightning.preflight import FreeLengths, _load_tokenizer, _model_config, fit_few_shot_lengths

    model = str(zoo.ensure_built("tiny_a", cache_dir=files["zoo"]))
    cfg = agent_preset("tiny_a")
    tokenizer, config = _load_tokenizer(model, cfg), _model_config(model, cfg)
    prompts = ["What is 1 + 2?", "What is 12 + 34? " + "Think. " * 20, "What is 5 + 6? " + "Think. " * 40]
    measured = [len(ids) for ids in encode_chat_prompts(tokenizer, cfg, prompts)]
    assert measured[0] < 96 < measured[1] < 256 - 24 < measured[2]  # past the preset, and past any answer's room
    line = fit_few_shot_lengths("agents.tiny_a", config, tokenizer, cfg, prompts, ["\\boxed{46}"],
                                FreeLengths(prompt=True, response=True))
    assert (cfg.max_prompt_len, cfg.max_response_len) == (measured[1], 24)
    assert f"max_prompt_len 96 -> {measured[1]}" in line and "1 of 3 prompts are longer than the model's positions leave" in line


@pytest.mark.slow
def test_the_fit_reads_past_the_preflights_sample_of_64_prompts(files, tmp_path):
    """Wired through the preflight: a GSM8K-layout train file whose longest question is its 68th row (outside the
    64 prompts the other checks sample) sets tiny_qwen3's fitted max_prompt_len, so no prompt is dropped at load."""
    from hacrl_lightning.agents.agent import encode_chat_prompts
    from hacrl_lightning.data.tasks import load_task
    from hacrl_lightning.preflight import _load_tokenizer

    rows = [{"question": f"Sam has {i} apples and buys 3 more. How many apples does he have?",
             "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"} for i in range(70)]
    rows[67]["question"] += " Count them carefully, one by one." * 8
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg, _ = compose_config(overrides_for(["agents=[tiny_qwen3]", "algorithm=gspo", "data.name=gsm8k",
                                           f"data.train_files=[{data}]", f"data.eval_files=[{data}]",
                                           "data.eval_size=8", "data.few_shot=1"], files), preflight=True)
    agent = agent_preset("tiny_qwen3")
    tokenizer = _load_tokenizer(str(zoo.ensure_built("tiny_qwen3", cache_dir=files["zoo"])), agent)
    train, held_out = load_task(cfg.data)
    every = [len(ids) for ids in encode_chat_prompts(tokenizer, agent, [ex.prompt for ex in [*train, *held_out]])]
    sampled = every[:64] + every[len(train):len(train) + 64]
    assert max(sampled) < max(every) == cfg.agents["tiny_qwen3"].max_prompt_len


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_lengths_given_through_agent_defaults_are_chosen_not_fitted(files, tmp_path):
    """`agent_defaults.max_prompt_len=...` (the command line's or an experiment's) gives an agent whose own file sets
    no length that value: a choice, kept as a command-line length is (200 holds no two-example prompt: refused, not
    raised to 234). An agent file given by path that sets its own lengths keeps them (agent_defaults never overrides
    a file), so they are fitted as a preset's are."""
    plain, sized = tmp_path / "plain_a.yaml", tmp_path / "sized_a.yaml"
    plain.write_text("model: zoo:tiny_a\n")
    sized.write_text("model: zoo:tiny_a\nmax_prompt_len: 96\nmax_response_len: 24\n")
    shared = ["data.few_shot=2", "agent_defaults.max_prompt_len=200", "agent_defaults.max_response_len=16"]
    problems = problems_of(overrides_for([f"agents=[{plain},tiny_b]", *shared], files)).problems
    assert [p.key for p in problems] == ["agents.plain_a.max_prompt_len"]
    cfg, _ = compose_config(overrides_for([f"agents=[{sized},tiny_b]", *shared], files), preflight=True)
    assert {name: (a.max_prompt_len, a.max_response_len) for name, a in cfg.agents.items()} == \
        {"sized_a": (234, 22), "tiny_b": (112, 24)}


def test_lengths_past_the_models_positions_name_both_numbers_and_a_fix_that_passes(files, tmp_path, train_main,
                                                                                   model_loads):
    """On main `agents.tiny_a.max_response_len=100000000` (tiny_a has 256 positions) was accepted and the run
    crawled; now the script refuses it before any weights load, and the limit it names is the one that passes."""
    run = tmp_path / "run"
    result = train_main(overrides_for(["agents.tiny_a.max_response_len=100000000", "trainer.steps=1", "data.eval_size=4",
                                       "data.prompts_per_step=4", f"run_dir={run}"], files))  # small, were it to run
    assert_user_error(result, run, "agents.tiny_a.max_response_len: got 100000000",
                      "max_prompt_len + max_response_len <= 256 (`max_position_embeddings` in the config.json",
                      "96 + 100,000,000 = 100,000,096 positions", "agents.tiny_a.max_response_len=160 or less")
    compose_config(overrides_for(["agents.tiny_a.max_response_len=160"], files), preflight=True)
    (problem,) = problems_of(overrides_for(["agents.tiny_a.max_response_len=161"], files)).problems
    assert problem.key == "agents.tiny_a.max_response_len" and "96 + 161 = 257" in problem.fix
    assert model_loads == []


# --- the real script --------------------------------------------------------------------------------


def run_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture
def train_main(script_main, capsys, monkeypatch, tmp_path):
    """`train_main(args)`: scripts/train.py's `main(args)` in this process, from `tmp_path` as `run_train`
    runs it, as a CompletedProcess (exit status, stdout, stderr)."""

    def run(args: list[str]) -> subprocess.CompletedProcess:
        monkeypatch.chdir(tmp_path)
        status = script_main("train")(args)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["scripts/train.py", *args], status, out, err)

    return run


def assert_user_error(result: subprocess.CompletedProcess, run: Path, *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert "run directory:" not in result.stdout and not run.exists()  # nothing built, nothing written


def test_script_missing_model_dir(files, tmp_path, train_main, model_loads):
    run = tmp_path / "run"
    result = train_main(overrides_for(["agents.tiny_a.model={missing}", f"run_dir={run}"], files))
    assert_user_error(result, run, "1 configuration problem(s)", "agents.tiny_a.model", str(files["missing"]))
    assert model_loads == []


def test_script_reports_several_problems_in_one_message(files, tmp_path, train_main, model_loads):
    run = tmp_path / "run"
    result = train_main(overrides_for([
        "rollout.group_size=1", "algorithm.delta=1.5", "agents.tiny_b.tokenizer={lossy}",
        "data.train_files=[{missing}.jsonl]", "agents.tiny_a.max_prompt_len=8", f"run_dir={run}"], files))
    assert_user_error(result, run, "5 configuration problem(s)", "rollout.group_size: got 1",
                      "algorithm.delta: got 1.5", "agents.tiny_b.tokenizer", "data.train_files[0]",
                      "agents.tiny_a.max_prompt_len: got 8")
    assert result.stderr.count("\n  - ") == 5
    assert model_loads == []


@pytest.mark.slow
def test_script_unknown_key_and_wrong_type_together(files, tmp_path):
    """The real `python scripts/train.py` (a subprocess): its exit status is main's."""
    run = tmp_path / "run"
    result = run_train(overrides_for(["trainer.stepz=3", "rollout.group_size=two", f"run_dir={run}"], files), tmp_path)
    assert_user_error(result, run, "2 configuration problem(s)", "did you mean 'steps'", "rollout.group_size")


SPLIT_HF = ["agents=[tiny_c,tiny_a]", "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
            "trainer.placement=split", "agents.tiny_a.max_prompt_len=64"]


@pytest.mark.slow
def test_split_with_transformers_refuses_a_learned_position_table_the_partners_responses_overrun(files, model_loads):
    """`split` + `rollout=hf`: transformers generates in lockstep over every rank (`synced_gpus`), so tiny_c (GPT-2,
    a learned table of 256 positions) keeps stepping until tiny_a's 192-token responses end: 96 + 192 > 256, an
    IndexError mid-generation (measured with two gloo ranks). Each agent's own lengths fit its positions, so only
    the lockstep check speaks; tiny_a (rotary) is not limited by it, and vLLM (no lockstep) is not refused."""
    overrides = overrides_for([*SPLIT_HF, "agents.tiny_a.max_response_len=192"], files)
    error = problems_of(overrides)
    (problem,) = [p for p in error.problems if p.key == "agents.tiny_a.max_response_len"]
    assert "at most 160" in problem.allowed and "tiny_c has learned positions (`max_position_embeddings` 256" in problem.allowed
    assert "agents.tiny_a.max_response_len=160" in problem.fix and "agents.tiny_c.max_prompt_len=64" in problem.fix
    compose_config(overrides_for([*SPLIT_HF, "agents.tiny_a.max_response_len=160"], files), preflight=True)
    assert model_loads == []


# -- composition messages: full key, value, what is allowed, a concrete fix (the fourth round of hostile inputs,
# 2026-11-28; each was "fix: see the message", a key without its `data.rewards[0].` prefix, or another key's name)

COMPOSITION_CASES = [  # (id, overrides, the key, words the fix holds)
    ("term_weight_not_a_number", ["data.rewards=[{reward: exact_match, weight: abc}]"], "data.rewards[0].weight",
     "data.rewards.0.weight=0.5"),
    ("term_key_misspelt", ["data.rewards=[{reward: exact_match, wieght: 1}]"], "data.rewards[0].wieght",
     "spelling of 'wieght' in term 0"),
    ("term_without_reward", ["data.rewards=[{weight: 1}]"], "data.rewards[0].reward", "add reward: <value>"),
    ("term_not_a_mapping", ["data.rewards=[exact_match]"], "data.rewards[0]", "{reward: <name>, weight: <number>}"),
    ("rewards_not_a_list", ["data.rewards=exact_match"], "data.rewards", "write a list in brackets"),
    ("term_reward_a_list", ["data.rewards=[{reward: [1,2], weight: 1}]"], "data.rewards[0].reward",
     "a single reward"),
    ("index_past_the_list", ["data.rewards.0.weight=2"], "data.rewards[0]", "data.rewards=[{reward: exact_match"),
    ("index_not_a_number", ["data.rewards.first.weight=2"], "data.rewards.first", "data.rewards.0.<setting>="),
    ("index_weight_not_a_number", ["data.rewards=[{reward: exact_match}]", "data.rewards.0.weight=abc"],
     "data.rewards.0.weight", "data.rewards.0.weight=0.5"),
    ("shared_lr_not_a_number", ["agent_defaults.lr=abc"], "agent_defaults.lr", "give agent_defaults.lr a float"),
    ("shared_lora_rank_not_a_number", ["agent_defaults.lora.rank=abc"], "agent_defaults.lora.rank", "an integer"),
    ("shared_lora_not_a_mapping", ["agent_defaults.lora=abc"], "agent_defaults.lora",
     "agent_defaults.lora.<setting>=<value>"),
    ("shared_lora_key_misspelt", ["agent_defaults.lora.rnk=3"], "agent_defaults.lora.rnk",
     "spelling of agent_defaults.lora.rnk"),
    ("shared_not_a_mapping", ["agent_defaults=abc"], "agent_defaults", "agent_defaults.<name>=<value>"),
    ("shared_betas_not_a_list", ["agent_defaults.betas=abc"], "agent_defaults.betas", "agent_defaults.betas=[a,b]"),
    ("shared_flag_not_a_bool", ["agent_defaults.gradient_checkpointing=maybe"], "agent_defaults.gradient_checkpointing",
     "agent_defaults.gradient_checkpointing=true"),
]


@pytest.mark.parametrize("overrides, key, fix", [c[1:] for c in COMPOSITION_CASES], ids=[c[0] for c in COMPOSITION_CASES])
def test_composition_messages_name_the_full_key_the_value_and_a_concrete_fix(overrides, key, fix):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    (problem,) = info.value.problems
    assert problem.key == key and fix in problem.fix, str(problem)
    assert "see the message" not in str(problem) and "Error merging" not in str(problem)
    assert len(str(info.value).splitlines()) == 2  # the count, and one line


def test_a_setting_for_every_agent_reaches_a_nested_section_and_an_experiments_bad_value_names_its_file(tmp_path):
    cfg, _ = compose_config(["agent_defaults.lora.rank=8"])  # was: "dict is not a subclass of LoraConfig"
    assert {name: agent.lora.rank for name, agent in cfg.agents.items()} == {"tiny_a": 8, "tiny_b": 8}
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndata:\n  rewards: [{reward: exact_match, wieght: 1}]\n")
    with pytest.raises(ConfigError) as info:
        compose_config([f"hydra.searchpath=[file://{tmp_path}]", "experiment=mine"])
    (problem,) = info.value.problems
    assert problem.key == "data.rewards[0].wieght" and str(tmp_path / "experiment" / "mine.yaml") in problem.fix
    (tmp_path / "experiment" / "shared.yaml").write_text("# @package _global_\nagent_defaults: {lr: fast}\n")
    with pytest.raises(ConfigError) as info:
        compose_config([f"hydra.searchpath=[file://{tmp_path}]", "experiment=shared"])
    (problem,) = info.value.problems
    assert problem.key == "agent_defaults.lr" and str(tmp_path / "experiment" / "shared.yaml") in problem.fix


def test_an_evaluations_few_shot_task_is_a_task_named_as_its_own_key(tmp_path):
    from hacrl_lightning.cli import compose_evaluate

    with pytest.raises(ConfigError) as info:
        compose_evaluate(["agents=[zoo:tiny_a]", "benchmarks=[synthetic]", "few_shot=2", "few_shot_task=math500",
                          f"output_dir={tmp_path / 'out'}"])
    (problem,) = info.value.problems  # was: accepted, then reported as data.name when the examples were loaded
    assert problem.key == "few_shot_task" and "did you mean 'math'" in problem.allowed
    assert "few_shot_task=synthetic" in problem.fix


@pytest.mark.slow
def test_few_shot_prompts_no_limit_can_hold_name_data_few_shot_and_a_count_that_passes(files, model_loads):
    """Eight worked examples make tiny_a's shortest prompt 749 tokens, its model has 256 positions: the lengths'
    own fixes traded one limit for the other (max_prompt_len=749, then max_response_len below zero). Now one line
    names data.few_shot, the figures and the largest count that fits, and that count passes."""
    for chosen in ([], ["agents.tiny_a.max_response_len=200"], ["agents.tiny_a.max_prompt_len=230"]):
        problems = problems_of(overrides_for(["agents=[tiny_a,tiny_b]", "data.few_shot=8", *chosen], files)).problems
        (problem,) = [p for p in problems if p.key.startswith(("data.few_shot", "agents.tiny_a"))]
        assert problem.key == "data.few_shot" and problem.value == 8, chosen
        assert "256 positions" in problem.allowed and "749 tokens" in problem.allowed
        assert "data.few_shot=2 or fewer" in problem.fix and "no agents.tiny_a.max_prompt_len can help" in problem.fix
    compose_config(overrides_for(["agents=[tiny_a,tiny_b]", "data.few_shot=2"], files), preflight=True)
    assert model_loads == []
