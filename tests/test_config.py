"""Configuration: every YAML composes and validates; bad input gives one clear error listing every problem."""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

import pytest
import yaml

from hacrl_lightning.algorithms import CapabilityWindow, compute_advantages
from hacrl_lightning.algorithms.objective import SETTINGS, LossSettings, loss_settings
from hacrl_lightning.cli import (CONFIG_DIR, TRAIN_SETTINGS, agent_key, compose_config, group_options, help_topic,
                                 save_resolved, settings_text)
from hacrl_lightning.config import (ADVANTAGE_FIELDS, CAPABILITY_FIELDS, LOSS_FIELDS, LOSS_KEYWORDS, TRAINER_FIELDS,
                                    AgentConfig, AlgorithmConfig, DataConfig, EvaluateConfig, PairConfig, RolloutConfig,
                                    TrainConfig, TrainerConfig, field_docs, flat_values, implied_values, setting,
                                    setting_keys)
from hacrl_lightning.errors import UNKNOWN_KEY, ConfigError
from hacrl_lightning.preflight import validate
from hacrl_lightning.presets import PRESETS

REPO = Path(__file__).resolve().parents[1]

AGENT_FILES = sorted((REPO / "agents").glob("*.yaml"))


def problems_of(overrides):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    return info.value.problems


# --- every file composes (discovered by glob, so a new file is covered automatically) --------------


@pytest.mark.slow
@pytest.mark.parametrize("group", ["algorithm", "data", "rollout", "trainer", "experiment"])
def test_every_group_option_composes_and_validates(group):
    options = group_options(group)
    assert options, f"configs/{group}/ has no YAML files"
    for name in options:
        cfg, _ = compose_config([f"{group}={name}"])
        assert isinstance(cfg, TrainConfig)


@pytest.mark.slow
@pytest.mark.parametrize("path", AGENT_FILES, ids=[p.stem for p in AGENT_FILES])
def test_every_agent_preset_composes_and_validates(path):
    key = agent_key(path.stem)
    assert "." not in key
    cfg, _ = compose_config([f"agents=[{path.stem},tiny_a]" if key != "tiny_a" else "agents=[tiny_a,tiny_b]"])
    assert key in cfg.agents
    assert isinstance(cfg.agents[key], AgentConfig) and cfg.agents[key].model


def test_agents_dir_is_the_agents_group():
    assert (CONFIG_DIR / "agents").resolve() == (REPO / "agents").resolve()
    assert set(group_options("agents")) == {p.stem for p in AGENT_FILES}


@pytest.mark.slow
def test_algorithm_files_equal_registry_presets():
    assert set(group_options("algorithm")) == set(PRESETS)
    for name, preset in PRESETS.items():
        cfg, _ = compose_config([f"algorithm={name}", "agents=[tiny_a,tiny_b]"])
        assert cfg.algorithm == preset, name


def test_algorithm_files_hold_only_what_their_preset_changes():
    # one source each: AlgorithmConfig holds the defaults (hacpo.yaml sets only its name), presets.py the
    # presets; each file sets exactly the fields in which its preset differs from the file it starts from
    for name, preset in PRESETS.items():
        text = yaml.safe_load((CONFIG_DIR / "algorithm" / f"{name}.yaml").read_text())
        parents = [entry for entry in text.pop("defaults", []) if entry != "_self_"]
        parent = PRESETS[parents[0]] if parents else AlgorithmConfig()
        changed = {f.name: getattr(preset, f.name) for f in fields(AlgorithmConfig)
                   if f.name == "name" or getattr(preset, f.name) != getattr(parent, f.name)}
        assert text == changed, f"configs/algorithm/{name}.yaml: write {changed}, as presets.py defines {name}"


def test_every_algorithm_field_has_one_reader_and_the_loss_takes_each_loss_field():
    # the reader is a fact of the field (`setting(reader=...)`); the lists are derived from it
    assert {f.name: f.metadata.get("reader") for f in fields(AlgorithmConfig)
            if f.metadata.get("reader") not in ("loss", "advantage", "capability", "trainer")} == {}
    readers = LOSS_FIELDS + ADVANTAGE_FIELDS + CAPABILITY_FIELDS + TRAINER_FIELDS
    assert sorted(readers) == sorted(f.name for f in fields(AlgorithmConfig)), "each field in exactly one list"
    loss = {LOSS_KEYWORDS.get(key, key) for key in LOSS_FIELDS}
    assert loss == set(SETTINGS), (f"only in config.LOSS_FIELDS: {loss - set(SETTINGS)}; "
                                   f"only in LossSettings: {set(SETTINGS) - loss}")
    assert set(ADVANTAGE_FIELDS) <= set(inspect.signature(compute_advantages).parameters)
    assert set(AlgorithmConfig().capability_settings()) <= set(inspect.signature(CapabilityWindow).parameters)


def test_the_loss_has_no_defaults_of_its_own():
    # the algorithm's defaults live once, in AlgorithmConfig: a direct caller of hacpo_loss names its algorithm
    assert all(f.default is MISSING and f.default_factory is MISSING for f in fields(LossSettings))
    with pytest.raises(TypeError, match=r"missing setting\(s\) \['dual_clip_c'\].*AlgorithmConfig\(\)\.loss_settings"):
        loss_settings(**{key: value for key, value in AlgorithmConfig().loss_settings().items() if key != "dual_clip_c"})
    assert loss_settings(**AlgorithmConfig().loss_settings()).dual_clip_c == 3.0


CONFIG_CLASSES = (AgentConfig, AlgorithmConfig, PairConfig, RolloutConfig, DataConfig, TrainerConfig, TrainConfig,
                  EvaluateConfig)


def undocumented(*classes) -> list[str]:
    return [f"{cls.__name__}.{f.name}" for cls in classes for f in fields(cls) if f.name not in field_docs(cls)]


def test_every_setting_has_a_docstring_and_a_planted_one_without_fails():
    assert undocumented(*CONFIG_CLASSES) == []

    @dataclass
    class Planted:
        documented: int = 1
        """Says what it does."""
        bare: int = 2

    assert undocumented(Planted) == ["Planted.bare"]


def test_help_of_a_group_prints_every_setting_with_its_default_and_docstring():
    text = settings_text("trainer", TRAIN_SETTINGS)
    for f in fields(TrainerConfig):
        assert f"  trainer.{f.name} (" in text, f.name
    assert "trainer.steps (int, default 150)\n      Training steps" in text
    assert "agents.<key>.lr (float, default 1e-06)" in settings_text("agents", TRAIN_SETTINGS)
    with pytest.raises(ConfigError, match=r"--help: got 'traner'.*one of \['agents'"):
        settings_text("traner", TRAIN_SETTINGS)
    assert help_topic(["--help", "trainer"]) == "trainer" and help_topic(["--help", "trainer.steps=3"]) is None


@dataclass
class DemoTrainer(TrainerConfig):
    eval_warmup: int = setting(0, harmless=True, implied=0)
    """Steps before the first periodic evaluation (a demonstration: its reader would be the evaluation callback)."""


@dataclass
class DemoConfig(TrainConfig):
    trainer: DemoTrainer = field(default_factory=DemoTrainer)
    """The trainer section, with the demonstration's setting."""


def test_a_new_trainer_setting_needs_only_its_field_and_its_reader():
    """A demonstration: a trainer setting added as one field with its facts (no list edited anywhere) is
    documented, may change on resume, is implied for runs saved before it, and counts in the comparison hash."""
    from hacrl_lightning.experiments import config_hash
    from hacrl_lightning.resume import config_dict, resume_changes

    assert "trainer.eval_warmup" in setting_keys("harmless", DemoConfig)
    assert implied_values(DemoConfig)["trainer.eval_warmup"] == 0
    assert undocumented(DemoTrainer) == []
    agents = {"tiny_a": AgentConfig(model="zoo:tiny_a")}
    saved = config_dict(DemoConfig(agents=agents))
    changed = DemoConfig(agents=agents, trainer=DemoTrainer(eval_warmup=3))
    assert resume_changes(saved, changed, at_step=1, completed=False) == ([], {"trainer.eval_warmup": (0, 3)})
    del saved["trainer"]["eval_warmup"]  # a run saved before the setting existed resumes: it trained with 0
    assert resume_changes(saved, DemoConfig(agents=agents), at_step=1, completed=False) == ([], {})
    flat = flat_values(changed)
    assert config_hash(flat) != config_hash({**flat, "trainer.eval_warmup": 0})  # it counts in the hash


GROUP_SCHEMAS = {"trainer": TrainerConfig, "rollout": RolloutConfig, "data": DataConfig, "agents": AgentConfig}


def _defaults(cls) -> dict:
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(cls)}


def test_every_group_file_holds_only_what_it_changes():
    # the defaults are written once, in the dataclasses; a preset file writes only what differs from them
    # (`name` names the preset); the algorithm group is test_algorithm_files_hold_only_what_their_preset_changes
    for group, cls in GROUP_SCHEMAS.items():
        defaults = _defaults(cls)
        for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
            body = yaml.safe_load(path.read_text()) or {}
            body.pop("defaults", None)
            same = sorted(key for key, value in body.items() if key != "name" and defaults.get(key, MISSING) == value)
            assert not same, f"{path.relative_to(REPO)}: {same} repeat the defaults of {cls.__name__}: delete them"
    body = yaml.safe_load((CONFIG_DIR / "evaluate" / "evaluate.yaml").read_text())
    body.pop("defaults")
    same = sorted(key for key, value in body.items() if _defaults(EvaluateConfig).get(key, MISSING) == value)
    assert not same, f"configs/evaluate/evaluate.yaml: {same} repeat the defaults of EvaluateConfig: delete them"


def test_what_the_config_builds_takes_each_setting_without_a_default_of_its_own():
    """A setting's default is declared once, in `hacrl_lightning.config`. An object the run builds from it (the
    update's settings, the DataModule, the module) takes the value without a default of its own: a second default
    (`UpdateSettings.diagnostics_every` 0 against the config's 10, the DataModule's `mismatch_every` 1 against 10)
    is what a direct caller silently gets instead."""
    import inspect
    import typing

    from hacrl_lightning.config import DataConfig, RolloutConfig, TrainerConfig
    from hacrl_lightning.datamodule import RolloutDataModule
    from hacrl_lightning.module import HACRLModule, UpdateSettings

    settings = {f.name for cls in (TrainerConfig, RolloutConfig, DataConfig, TrainConfig) for f in fields(cls)}
    for built in (UpdateSettings, RolloutDataModule.__init__, HACRLModule.__init__):
        hints = typing.get_type_hints(built)
        for name, parameter in inspect.signature(built).parameters.items():
            if name in settings and hints.get(name) in (int, float, str, bool):
                assert parameter.default is inspect.Parameter.empty, (
                    f"{built.__qualname__}({name}={parameter.default!r}): a second default of a setting; "
                    "take it from the config only")


def test_an_evaluation_setting_takes_the_runs_default_or_says_why_not():
    """`EvaluateConfig` shares setting names with a run's (`reward_timeout_s`, `generation_batch_size`, ...): each
    has the run's default, or null for "each agent's own", or a reason in `EVALUATE_OWN_DEFAULTS`."""
    from hacrl_lightning.config import EVALUATE_OWN_DEFAULTS, AgentConfig, DataConfig, EvaluateConfig, RolloutConfig

    def default(f):
        return f.default if f.default is not MISSING else f.default_factory()

    own = {f.name: default(f) for f in fields(EvaluateConfig)}
    differing = {f.name for cls in (DataConfig, RolloutConfig, AgentConfig, TrainConfig) for f in fields(cls)
                 if f.name in own and own[f.name] is not None and own[f.name] != default(f)
                 and not (isinstance(default(f), dict) and not own[f.name])}
    assert differing == set(EVALUATE_OWN_DEFAULTS), (
        f"EvaluateConfig defaults that differ from a run's: {sorted(differing)}; reasons given for "
        f"{sorted(EVALUATE_OWN_DEFAULTS)}: take the run's default (e.g. `= DataConfig.<name>`) or give the reason")


def test_experiments_do_not_repeat_each_other():
    """A block two experiment files would both state (the recipe's seed, agent settings, KL, rollout and trainer
    sizes) lives once in configs/recipe/ and is included from there; each experiment keeps its own agents and its
    pair's Table 5 values (two pairs may have equal ones)."""
    import itertools

    bodies = {path.name: yaml.safe_load(path.read_text()) or {} for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml"))}
    for (a, body_a), (b, body_b) in itertools.combinations(bodies.items(), 2):
        repeated = sorted(key for key, value in body_a.items() if key not in ("defaults", "pair") and body_b.get(key) == value)
        assert not repeated, f"configs/experiment/{a} and {b} both state {repeated}: move them to a configs/recipe/ file"


@pytest.mark.slow  # over 1 s: out of make test-fast
def test_every_experiment_holds_only_what_it_changes():
    """An experiment's values differ from what its group choices compose to without them. Its per-agent
    values are left out: they state the recipe's settings for the agents of the list (a lab's own study,
    2026-11-26, makes them hold for any list)."""
    for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        choices = []
        for entry in body.pop("defaults", []):
            for key, value in (entry.items() if isinstance(entry, dict) else ()):
                key = key.replace("override /", "")
                choices.append(f"{key}=[{','.join(value)}]" if isinstance(value, list) else f"{key}={value}")
        base = flat_values(compose_config([*choices, "run_dir=/tmp/unused"], preflight=False)[0])
        same = sorted(key for key, value in flat_values(body).items()
                      if not key.startswith("agents.") and key != "run_dir" and base.get(key, MISSING) == value)
        assert not same, f"{path.relative_to(REPO)}: {same} repeat what {choices} compose to: delete them"


# --- selecting agents ----------------------------------------------------------------------------


def test_three_agents_under_three_keys_with_per_agent_override():
    cfg, _ = compose_config(["agents=[tiny_a,tiny_b,tiny_c]", "agents.tiny_b.lr=3e-4"])
    assert list(cfg.agents) == ["tiny_a", "tiny_b", "tiny_c"]
    assert cfg.agents["tiny_b"].lr == pytest.approx(3e-4)
    assert cfg.agents["tiny_a"].lr != pytest.approx(3e-4)
    assert cfg.agents["tiny_a"].model != cfg.agents["tiny_c"].model


def test_file_name_with_a_dot_lands_under_a_key_without_one():
    assert (REPO / "agents" / "qwen3_1.7b.yaml").exists()
    cfg, _ = compose_config(["agents=[qwen3_1.7b,tiny_a]", "agents.qwen3_1_7b.lr=2e-6"])
    assert set(cfg.agents) == {"qwen3_1_7b", "tiny_a"}
    assert cfg.agents["qwen3_1_7b"].lr == pytest.approx(2e-6)


def test_experiment_overrides_agents():
    cfg, _ = compose_config(["experiment=three_tiny"])
    assert list(cfg.agents) == ["tiny_a", "tiny_b", "tiny_c"]


# --- clear errors --------------------------------------------------------------------------------


def test_misspelt_keys_are_all_reported_with_a_suggestion():
    problems = problems_of(["agents.tiny_b.lrr=3e-4", "trainer.stepz=3"])
    assert [p.key for p in problems] == ["agents.tiny_b.lrr", "trainer.stepz"]
    assert all(p.value is UNKNOWN_KEY for p in problems)
    assert "did you mean 'lr'" in problems[0].allowed
    assert "did you mean 'steps'" in problems[1].allowed


def test_unknown_agent_lists_the_known_ones():
    (problem,) = problems_of(["agents=[tiny_a,tiny_x]"])
    assert problem.key == "agents" and problem.value == "tiny_x"
    for known in ("tiny_a", "tiny_b", "tiny_c"):
        assert known in problem.allowed


def test_wrong_types_are_reported_together():
    problems = problems_of(["trainer.steps=abc", "agents.tiny_a.lr=[1]", "trainer.export_agents=3"])
    assert {p.key: p.allowed for p in problems} == {
        "trainer.steps": "an integer",
        "agents.tiny_a.lr": "a number",
        "trainer.export_agents": "true or false",
    }


def test_override_of_an_unselected_agent_says_to_select_it():
    (problem,) = problems_of(["agents.tiny_c.lr=0.1"])
    assert problem.key == "agents.tiny_c"
    assert "agents=[" in problem.fix


def test_duplicate_agents_and_unknown_algorithm():
    (problem,) = problems_of(["agents=[tiny_a,tiny_a]"])
    assert "duplicate" in problem.fix
    (problem,) = problems_of(["algorithm=hacpox"])
    assert "did you mean 'hacpo'" in problem.allowed


def test_cross_field_errors_are_collected_in_one_error():
    problems = problems_of([
        "agents=[tiny_a]",  # one agent with a collaborative algorithm
        "rollout.group_size=1",
        "trainer.mini_batch_prompts=3",  # does not divide prompts_per_step=8
        "algorithm.delta=1.5",
        "algorithm.alpha=-1",
        "agents.tiny_a.lr=-0.1",
        "algorithm.capability_window=0",
        "algorithm.cross_samples_per_prompt=0",
    ])
    keys = [p.key for p in problems]
    assert keys == [
        "agents.tiny_a.lr", "algorithm.alpha", "algorithm.delta", "algorithm.capability_window",
        "algorithm.cross_samples_per_prompt", "agents", "rollout.group_size", "trainer.mini_batch_prompts",
    ]
    message = str(ConfigError(problems))
    assert message.startswith("8 configuration problem(s)")
    assert "algorithm=gspo" in message  # how to fix the one-agent case


def test_single_agent_algorithm_accepts_one_agent_and_gspo_x2_needs_even_mini_batches():
    cfg, _ = compose_config(["agents=[tiny_a]", "algorithm=gspo"])
    assert list(cfg.agents) == ["tiny_a"]
    problems = problems_of(["algorithm=gspo_x2", "trainer.mini_batch_prompts=1"])
    assert problems[0].key == "trainer.mini_batch_prompts" and "rollout_multiplier" in problems[0].allowed


def test_validate_is_a_pure_function_of_the_dataclasses():
    base = TrainConfig(agents={"a": AgentConfig(model="zoo:tiny_a"), "b": AgentConfig(model="zoo:tiny_b")})
    assert validate(base) is base
    with pytest.raises(ConfigError, match="algorithm.name"):
        validate(replace(base, algorithm=replace(base.algorithm, name="nope")))


# --- the script ----------------------------------------------------------------------------------


def run_train(args, cwd):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_train_script_reports_bad_config_without_traceback(tmp_path, script_main, capsys, monkeypatch):
    """The script's `main` in this process (an exception would fail the test, as a traceback would); the
    real `python scripts/train.py` runs below and in tests/test_bad_configs.py."""
    monkeypatch.chdir(tmp_path)
    status = script_main("train")(["agents=[tiny_a]", "trainer.stepz=1", f"run_dir={tmp_path / 'run'}"])
    stderr = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in stderr
    assert "trainer.stepz" in stderr and "did you mean 'steps'" in stderr
    assert not (tmp_path / "run").exists()  # nothing written for a bad config


@pytest.mark.slow
def test_train_script_from_another_directory_saves_resolved_config_and_shows_cfg(tmp_path):
    shown = run_train(["--cfg", "job", "agents=[tiny_a,tiny_b,tiny_c]"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "tiny_c:" in shown.stdout and "algorithm:" in shown.stdout and "${" not in shown.stdout


def test_resolved_config_is_saved_without_interpolations(tmp_path):
    cfg, dcfg = compose_config(["agents=[tiny_a,tiny_b]"])
    saved = save_resolved(dcfg, tmp_path / "run")
    text = saved.read_text()
    assert "${" not in text and "tiny_b:" in text
    assert cfg.run_dir.startswith("runs/")  # ${now:...} resolved


def test_unknown_task_and_reward_are_reported_together():
    problems = problems_of(["data.name=gsm", "data.reward=exakt"])
    assert [(p.key, p.value) for p in problems] == [("data.name", "gsm"), ("data.reward", "exakt")]
    assert "synthetic" in problems[0].allowed and "exact_match" in problems[1].allowed


def test_non_finite_numbers_and_bad_seeds_are_config_errors():
    """`lr=inf` used to train NaN weights into a checkpoint: every number must be finite, seeds in range,
    one problem per bad key."""
    with pytest.raises(ConfigError) as info:
        compose_config(["agents.tiny_a.lr=inf", "agents.tiny_b.lr=nan", "agents.tiny_a.grad_clip=nan",
                        "algorithm.delta=nan", "seed=-1", "data.seed=4294967296"])
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"agents.tiny_a.lr", "agents.tiny_b.lr", "agents.tiny_a.grad_clip", "algorithm.delta",
                             "seed", "data.seed"}
    assert problems["agents.tiny_a.lr"].allowed == "a finite number" and "finite" in problems["algorithm.delta"].fix
    assert "[0, 4294967295]" in problems["seed"].allowed
    compose_config(["seed=4294967295", "agents.tiny_a.lr=1e-3"])  # the edges are fine


# --- settings for every agent (agent_defaults) -----------------------------------------------------

PAPER_PRESETS = ["qwen3_4b_base", "llama3.2_3b_instruct", "qwen3_1.7b_base", "qwen3_8b_base"]


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_composes_with_lists_of_one_to_four_agents_and_its_shared_values_reach_each(
        experiment, tmp_path):
    # a user's agent file that sets only its model: every shared value of the experiment reaches it
    mine = tmp_path / "my_model.yaml"
    mine.write_text("model: zoo:tiny_a\n")
    shared = yaml.safe_load((CONFIG_DIR / "experiment" / f"{experiment}.yaml").read_text()).get("agent_defaults", {})
    for count in range(1, 5):
        listed = [*PAPER_PRESETS[: count - 1], str(mine)]
        single = ["algorithm=gspo"] if count == 1 else []  # HACPO needs two agents
        cfg, _ = compose_config([f"experiment={experiment}", f"agents=[{','.join(listed)}]", *single])
        assert len(cfg.agents) == count
        for key, value in shared.items():
            assert getattr(cfg.agents["my_model"], key) == value, (experiment, count, key)
            for name, agent in cfg.agents.items():  # the paper presets' own files agree with the recipe
                assert getattr(agent, key) == value or name in ("my_model",), (experiment, name, key)


def test_agent_defaults_sit_below_the_agents_file_and_below_its_explicit_settings(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: zoo:tiny_b\nlr: 3.0e-5\n")
    cfg, _ = compose_config([f"agents=[tiny_a,{mine}]", "agent_defaults.lr=1e-6", "agent_defaults.max_response_len=40",
                             "agents.tiny_a.max_response_len=30"])
    assert cfg.agents["tiny_a"].lr == 1e-4                    # tiny_a's file sets 1e-4: the file wins
    assert cfg.agents["mine"].lr == 3e-5                      # so does a user's file
    assert cfg.agents["mine"].max_response_len == 40          # a setting no file names comes from agent_defaults
    assert cfg.agents["tiny_a"].max_response_len == 30        # the command line's agents.<key>.* wins over both
    assert cfg.agents["tiny_a"].max_prompt_len == 96          # untouched settings keep the file's values


def test_per_agent_values_for_an_agent_not_in_the_list_and_unknown_shared_keys_are_named(tmp_path):
    (tmp_path / "experiment").mkdir()  # a lab's own experiment, keyed by the names of the agents it was written for
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nagents:\n  qwen3_4b:\n    lr: 1.0e-5\n  tiny_a:\n    lr: 2.0e-5\n")
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "experiment=mine", "agents=[tiny_a,tiny_b]"]
    (problem,) = problems_of(overrides)
    assert problem.key == "agents.qwen3_4b"
    assert "['tiny_a', 'tiny_b']" in problem.allowed and "agent_defaults" in problem.fix
    cfg, _ = compose_config([*overrides[:2], "agents=[tiny_a,qwen3_4b]"])
    assert cfg.agents["tiny_a"].lr == 2e-5 and cfg.agents["qwen3_4b"].lr == 1e-5  # with its list it composes
    (problem,) = problems_of(["agent_defaults.lrr=1e-6"])
    assert problem.key == "agent_defaults.lrr" and "lr" in problem.allowed
    (problem,) = problems_of(["agent_defaults.top_k=many"])  # checked where it lands (no default file sets top_k)
    assert problem.key.endswith("top_k") and "int" in problem.allowed.lower()


def test_agent_defaults_are_neither_compared_on_resume_nor_hashed():
    """What agent_defaults change lands in agents.*, which a resume compares and a comparison hashes: a run whose
    agent_defaults differ but whose agents do not resumes, and its hash does not move."""
    from hacrl_lightning.experiments import HASH_IGNORES
    from hacrl_lightning.resume import config_dict, resume_changes

    plain, _ = compose_config([])
    shared, _ = compose_config(["agent_defaults.lr=1e-6"])  # tiny_a and tiny_b set their own lr: nothing lands
    assert shared.agents == plain.agents
    problems, allowed = resume_changes(config_dict(plain), shared, at_step=1, completed=False)
    assert problems == [] and allowed == {"agent_defaults.lr": ("<absent>", 1e-6)}
    assert "agent_defaults.*" in HASH_IGNORES


def test_the_source_span_needs_sequence_level_ratios():
    (problem,) = problems_of(["algorithm=hacpo_paper_main", "algorithm.ratio_level=token"])
    assert problem.key == "algorithm.partner_advantage_span" and "ratio_level=sequence" in problem.fix


def test_an_agent_file_without_a_model_is_told_so_not_called_a_stray(tmp_path):
    mine = tmp_path / "nomodel.yaml"
    mine.write_text("lr: 1.0e-5\n")
    problems = problems_of([f"agents=[tiny_a,{mine}]"])
    assert any(p.key == "agents.nomodel.model" for p in problems), problems
