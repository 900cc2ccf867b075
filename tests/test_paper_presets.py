"""The paper's experiment presets compose with Hydra and validate, with the agents and the Table 5 values
of each pair (HACPO, arXiv 2603.02604, App. A and Table 5); `experiment=X algorithm=Y` runs Y (the pair's
values reach the HACPO family only and never undo an ablation), what cannot be honoured is refused, and
the printed and saved config is what runs. Composition only: no model is built."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import agent_preset
from hacrl_lightning import cli
from hacrl_lightning.cli import compose_config, save_resolved
from hacrl_lightning.config import TrainConfig
from hacrl_lightning.errors import ConfigError
from hacrl_lightning.presets import get_preset, preset_names
from hacrl_lightning.rewards import reward_names

REPO = Path(__file__).resolve().parents[1]

# preset -> (agent keys, alpha, delta (printed "δ" = 1 - delta), delta_step)
PAIRS = {
    "paper_state": (["qwen3_4b", "qwen3_4b_instruct_2507"], 3.0, 0.2, 0.01),
    "paper_size": (["qwen3_1_7b_base", "qwen3_4b_base"], 1.0, 0.2, 0.025),
    "paper_model": (["qwen3_4b_base", "llama3_2_3b_instruct"], 1.0, 0.2, 0.025),
    "paper_size_qwen3_4b_8b": (["qwen3_4b_base", "qwen3_8b_base"], 3.0, 0.2, 0.025),
    "paper_size_llama3_1b_3b": (["llama3_2_1b_instruct", "llama3_2_3b_instruct"], 1.0, 0.1, 0.01),
    "paper_model_qwen3_1_7b_llama3_1b": (["qwen3_1_7b_base", "llama3_2_1b_instruct"], 1.0, 0.2, 0.025),
}
STAND_INS = {"paper_smoke": (["tiny_qwen3", "tiny_llama32"], 1.0, 0.2, 0.025)}
"""CPU stand-ins of a pair (tests/test_paper_smoke.py): in the composition matrix, not hub presets."""
MATRIX = {**PAIRS, **STAND_INS}


def compose_validated(overrides: list[str]) -> TrainConfig:
    """Compose, resolve and validate, as `scripts/train.py` does (less the file/tokenizer preflight)."""
    assert "math_verify" in reward_names()
    cfg, _ = compose_config(overrides)
    return cfg


def refusal(overrides: list[str]):
    """The one Problem a composition that cannot be honoured is refused with."""
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    assert len(info.value.problems) == 1, str(info.value)
    return info.value.problems[0]


def test_every_paper_preset_file_is_listed_here():
    assert {p.stem for p in (REPO / "configs" / "experiment").glob("paper_*.yaml")} == set(MATRIX)


def test_hub_agent_presets_take_verls_weight_decay():
    # the authors' runs inherit verl's AdamW weight decay 0.01 (verl/trainer/config/optim/fsdp.yaml)
    hub = sorted(p.stem for p in (REPO / "agents").glob("*.yaml")
                 if not p.stem.startswith("tiny_") and "model: pypi:" not in p.read_text())
    assert len(hub) == 9 and {name: agent_preset(name).weight_decay for name in hub} == dict.fromkeys(hub, 0.01)


@pytest.mark.parametrize("preset", sorted(PAIRS))
def test_paper_preset_composes_validates_and_has_table5_values(preset):
    keys, alpha, delta, delta_step = PAIRS[preset]
    cfg = compose_validated([f"experiment={preset}"])
    assert list(cfg.agents) == keys
    for agent in cfg.agents.values():
        assert (agent.lr, agent.max_prompt_len, agent.max_response_len) == (1e-6, 1024, 4096)
        assert agent.weight_decay == 0.01  # verl's AdamW default, inherited by the authors' runs
        assert agent.dtype == "bfloat16" and not agent.model.startswith("zoo:")
    assert (cfg.pair.alpha, cfg.pair.delta, cfg.pair.delta_step) == (alpha, delta, delta_step)
    alg = cfg.algorithm
    assert alg.name == "hacpo" and alg.share_rollouts and alg.advantage == "hacpo"
    assert (alg.alpha, alg.delta, alg.delta_step) == (alpha, delta, delta_step)
    assert (alg.clip_low, alg.clip_high, alg.capability_window) == (3e-4, 4e-4, 5)
    assert (alg.kl_coef, alg.kl_estimator) == (0.001, "k3")
    assert cfg.rollout.group_size == 8
    assert (cfg.data.name, cfg.data.reward, cfg.data.prompts_per_step) == ("math", "math_verify", 128)
    assert (cfg.trainer.mini_batch_prompts, cfg.trainer.devices, cfg.trainer.strategy) == (64, 8, "fsdp")
    assert cfg.trainer.steps == 7500 // 128  # one epoch of MATH's training problems
    assert cfg.seed == 42


@pytest.mark.parametrize("preset", sorted(PAIRS))
def test_paper_preset_header_gives_the_8_gpu_launch_command(preset):
    text = (REPO / "configs" / "experiment" / f"{preset}.yaml").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert f"#   python scripts/train.py experiment={preset} run_dir=runs/{preset}" in header
    assert any("8 GPUs" in line for line in header)


def test_a_preset_takes_local_models_and_verl_files_on_the_command_line():
    cfg = compose_validated(["experiment=paper_size", "agents.qwen3_4b_base.model=/models/Qwen3-4B-Base",
                             "data.train_files=[/data/math/train.parquet]", "trainer.devices=4"])
    assert cfg.agents["qwen3_4b_base"].model == "/models/Qwen3-4B-Base"
    assert cfg.data.train_files == ["/data/math/train.parquet"]
    assert cfg.trainer.devices == 4 and cfg.algorithm.delta_step == 0.025


# --- experiment=X algorithm=Y runs Y (docs/algorithms.md, "Experiment presets and algorithms") -----

# Written out by hand rather than derived from the registry's helpers, so that the rule is checked, not restated.
HACPO_FAMILY = {"hacpo", "hacpo_no_adv", "hacpo_no_omega", "hacpo_alpha0", "hacpo_no_stepwise", "hacpo_no_clip",
                "hacpo_paper_main"}
ABLATED = {"hacpo_alpha0": {"alpha"}, "hacpo_no_stepwise": {"delta_step"}}  # pair fields an ablation switches off
SHARED_KL = dict(kl_coef=0.001, kl_estimator="k3")  # the experiments' shared KL (App. A), every algorithm


def expected_algorithm(preset: str, algorithm: str):
    """The preset's own values, the experiment's shared KL, and the pair's Table 5 values where they fit."""
    _, alpha, delta, delta_step = MATRIX[preset]
    pair = {"alpha": alpha, "delta": delta, "delta_step": delta_step}
    if algorithm in HACPO_FAMILY:
        pair = {key: value for key, value in pair.items() if key not in ABLATED.get(algorithm, set())}
    else:
        pair = {}
    return replace(get_preset(algorithm), **SHARED_KL, **pair)


def test_the_matrix_covers_every_algorithm_preset():
    assert preset_names() == sorted(HACPO_FAMILY | {"naive", "gspo", "gspo_x2", "grpo"})


@pytest.fixture(scope="module")
def experiment_pairs() -> dict:
    """Each experiment's composed `pair` (one composition per experiment)."""
    return {preset: compose_validated([f"experiment={preset}"]).pair for preset in sorted(MATRIX)}


@pytest.mark.parametrize("algorithm", preset_names())
@pytest.mark.parametrize("preset", sorted(MATRIX))
def test_experiment_with_an_algorithm_runs_that_algorithm(preset, algorithm, experiment_pairs):
    """Every cell of experiments x algorithms on the rule itself (`presets.resolve_algorithm`, what `cli` calls
    after composing: the algorithm preset with the experiment's shared `algorithm:` block, and the pair); the
    composition path is checked against it below, each experiment and each algorithm composed once."""
    from hacrl_lightning.cli import explicit_keys
    from hacrl_lightning.presets import resolve_algorithm

    composed = replace(get_preset(algorithm), **SHARED_KL)
    alg = resolve_algorithm(composed, experiment_pairs[preset],
                            explicit_keys([f"experiment={preset}", f"algorithm={algorithm}"]))
    assert alg == expected_algorithm(preset, algorithm)
    # the defining values, spelled out
    if algorithm == "grpo":
        assert (alg.share_rollouts, alg.ratio_level, alg.loss_agg_mode) == (False, "token", "token-mean")
        assert (alg.clip_low, alg.clip_high) == (0.2, 0.28)
    if algorithm in ("gspo", "gspo_x2", "grpo"):
        assert not alg.share_rollouts and alg.advantage == "group"  # no cross term at all
        assert (alg.alpha, alg.delta, alg.delta_step) == (1.0, 0.2, 0.025)  # hacpo.yaml's, unused
    if algorithm == "naive":
        assert (alg.cross_loss, alg.alpha, alg.delta_step, alg.omega_factor, alg.capability_baseline) == (
            "self", 0.0, 0.0, False, False)
    if algorithm == "hacpo_alpha0":
        assert alg.alpha == 0.0
    if algorithm == "hacpo_no_stepwise":
        assert alg.delta_step == 0.0
    if algorithm == "hacpo_no_clip":
        assert alg.cross_clip is False
    if algorithm in HACPO_FAMILY - {"hacpo_alpha0"}:
        assert alg.alpha == MATRIX[preset][1]


COMPOSED_CELLS = sorted({(preset, "hacpo") for preset in MATRIX}
                        | {(sorted(MATRIX)[i % len(MATRIX)], algorithm) for i, algorithm in enumerate(preset_names())})
"""Every experiment and every algorithm preset at least once: 7 + 11 compositions cover what the 77 cells share."""


@pytest.mark.slow
@pytest.mark.parametrize("preset,algorithm", COMPOSED_CELLS)
def test_the_composed_algorithm_is_the_rules(preset, algorithm):
    alg = compose_validated([f"experiment={preset}", f"algorithm={algorithm}"]).algorithm
    assert alg == expected_algorithm(preset, algorithm)


def test_an_explicit_algorithm_value_wins_over_the_pair():
    alg = compose_validated(["experiment=paper_state", "algorithm.alpha=2.0"]).algorithm
    assert (alg.name, alg.alpha, alg.delta_step) == ("hacpo", 2.0, 0.01)
    alg = compose_validated(["experiment=paper_state", "algorithm=hacpo_no_omega", "algorithm.delta_step=0.02"]).algorithm
    assert (alg.alpha, alg.delta_step, alg.omega_factor) == (3.0, 0.02, False)
    alg = compose_validated(["experiment=paper_state", "pair.alpha=2.0"]).algorithm  # a pair value of one's own
    assert alg.alpha == 2.0


def test_outside_experiments_tuning_still_works():
    assert compose_validated(["algorithm=hacpo", "algorithm.alpha=2"]).algorithm.alpha == 2.0
    assert compose_validated(["algorithm=hacpo_alpha0", "algorithm.alpha=0"]).algorithm.alpha == 0.0
    grpo = compose_validated(["algorithm=grpo", "algorithm.clip_high=0.3"]).algorithm  # a baseline's own numbers
    assert (grpo.ratio_level, grpo.clip_low, grpo.clip_high) == ("token", 0.2, 0.3)


# (case id, overrides, the key reported, words its fix must contain)
REFUSALS = [
    ("alpha_undoes_alpha0", ["experiment=paper_state", "algorithm=hacpo_alpha0", "algorithm.alpha=3"],
     "algorithm.alpha", ["drop algorithm.alpha=3.0", "algorithm=hacpo algorithm.alpha=3.0"]),
    ("alpha_undoes_alpha0_without_experiment", ["algorithm=hacpo_alpha0", "algorithm.alpha=3"],
     "algorithm.alpha", ["drop algorithm.alpha=3.0", "algorithm=hacpo"]),
    ("delta_step_undoes_no_stepwise", ["experiment=paper_size", "algorithm=hacpo_no_stepwise", "algorithm.delta_step=0.01"],
     "algorithm.delta_step", ["drop algorithm.delta_step=0.01", "algorithm=hacpo"]),
    ("cross_clip_undoes_no_clip", ["experiment=paper_size", "algorithm=hacpo_no_clip", "algorithm.cross_clip=true"],
     "algorithm.cross_clip", ["drop algorithm.cross_clip=True", "algorithm=hacpo"]),
    ("alpha_undoes_naive", ["experiment=paper_model", "algorithm=naive", "algorithm.alpha=1"],
     "algorithm.alpha", ["drop algorithm.alpha=1.0"]),
    ("sequence_ratio_undoes_grpo", ["algorithm=grpo", "algorithm.ratio_level=sequence"],
     "algorithm.ratio_level", ["drop algorithm.ratio_level=sequence", "algorithm=gspo"]),
    ("one_rollout_undoes_gspo_x2", ["experiment=paper_state", "algorithm=gspo_x2", "algorithm.rollout_multiplier=1"],
     "algorithm.rollout_multiplier", ["drop algorithm.rollout_multiplier=1", "algorithm=gspo"]),
    ("pair_alpha_for_grpo", ["experiment=paper_state", "algorithm=grpo", "pair.alpha=2.0"],
     "pair.alpha", ["grpo has no HACPO cross term", "drop pair.alpha=2.0"]),
    ("pair_alpha_without_experiment_for_gspo", ["algorithm=gspo", "agents=[tiny_a]", "pair.alpha=3.0"],
     "pair.alpha", ["gspo has no HACPO cross term", "drop pair.alpha=3.0"]),
    ("pair_alpha_for_naive", ["experiment=paper_state", "algorithm=naive", "pair.alpha=2.0"],
     "pair.alpha", ["naive has no HACPO cross term", "drop pair.alpha=2.0"]),
    ("pair_alpha_for_alpha0", ["experiment=paper_state", "algorithm=hacpo_alpha0", "pair.alpha=2.0"],
     "pair.alpha", ["hacpo_alpha0 fixes alpha = 0.0", "drop pair.alpha=2.0"]),
    ("pair_delta_step_for_no_stepwise", ["experiment=paper_state", "algorithm=hacpo_no_stepwise", "pair.delta_step=0.02"],
     "pair.delta_step", ["hacpo_no_stepwise fixes delta_step = 0.0", "drop pair.delta_step=0.02"]),
    ("pair_and_algorithm_disagree", ["experiment=paper_state", "pair.alpha=2.0", "algorithm.alpha=1.0"],
     "pair.alpha", ["algorithm.alpha=1.0 is given too", "keep only one"]),
    ("name_set_directly", ["experiment=paper_state", "algorithm.name=hacpo_alpha0"],
     "algorithm.name", ["algorithm=hacpo_alpha0"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, key, fix_words", [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_a_composition_that_cannot_be_honoured_is_refused_naming_key_and_fix(overrides, key, fix_words):
    problem = refusal(overrides)
    assert problem.key == key, problem
    assert problem.allowed and problem.value is not None
    for words in fix_words:
        assert words in problem.fix, problem


def test_a_pair_value_out_of_range_is_reported_where_it_is_set():
    with pytest.raises(ConfigError) as info:
        compose_config(["experiment=paper_state", "pair.delta=1.5"])
    assert {p.key for p in info.value.problems} == {"pair.delta", "algorithm.delta"}  # taken by hacpo
    (problem,) = [p for p in info.value.problems if p.key == "pair.delta"]
    assert "1 - delta" in problem.fix
    assert refusal(["experiment=paper_state", "algorithm=gspo", "pair.delta_step=-1"]).key == "pair.delta_step"


def test_refusals_are_reported_with_the_other_problems():
    with pytest.raises(ConfigError) as info:
        compose_config(["algorithm=hacpo_alpha0", "algorithm.alpha=3", "rollout.group_size=1"], preflight=True)
    assert [p.key for p in info.value.problems] == ["algorithm.alpha", "rollout.group_size"]


@pytest.fixture
def config_dir_with(tmp_path, monkeypatch):
    """A copy of configs/ (agents included) with extra experiment files, used by compose_config."""
    root = tmp_path / "configs"
    shutil.copytree(REPO / "configs", root, symlinks=False)

    def add(name: str, text: str) -> None:
        (root / "experiment" / f"{name}.yaml").write_text(text)
        monkeypatch.setattr(cli, "CONFIG_DIR", root)

    return add


# the `algorithm:` block every paper preset had before `pair:` (Table 5 values for every algorithm)
OLD_STYLE = """# @package _global_
algorithm:
  alpha: 3.0
  delta: 0.2
  delta_step: 0.01
  clip_low: 3.0e-4
  clip_high: 4.0e-4
  capability_window: 5
  kl_coef: 0.001
  kl_estimator: k3
"""


def test_an_experiment_file_may_not_change_what_defines_the_algorithm(config_dir_with):
    config_dir_with("old_style", OLD_STYLE)
    with pytest.raises(ConfigError) as info:
        compose_config(["experiment=old_style", "algorithm=grpo"])
    assert [p.key for p in info.value.problems] == ["algorithm.clip_low", "algorithm.clip_high"]
    assert "which defines algorithm=grpo" in info.value.problems[0].allowed
    assert "sets algorithm.clip_low for every algorithm" in info.value.problems[0].fix
    problem = refusal(["experiment=old_style", "algorithm=hacpo_alpha0"])
    assert problem.key == "algorithm.alpha" and "under `pair:`" in problem.fix
    # a value no preset defines (the shared KL) is fine, for every algorithm
    assert compose_validated(["experiment=old_style", "algorithm=hacpo_no_omega"]).algorithm.alpha == 3.0


# --- what runs is what is shown and saved ----------------------------------------------------------


def reload(text: str) -> TrainConfig:
    """A printed or saved config read back as scripts/evaluate.py reads a run's config.yaml."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.create(text)))


@pytest.mark.parametrize("algorithm", ["grpo", "hacpo_alpha0"])
def test_the_saved_config_is_what_runs(tmp_path, algorithm):
    cfg, dcfg = compose_config(["experiment=paper_state", f"algorithm={algorithm}"])
    saved = reload(save_resolved(dcfg, tmp_path / "run").read_text())
    assert saved.algorithm == cfg.algorithm == expected_algorithm("paper_state", algorithm)
    assert saved.pair == cfg.pair  # the experiment's values stay on record, beside what ran


@pytest.mark.slow
def test_the_printed_config_is_what_runs(tmp_path):
    shown = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), "experiment=paper_state",
                            "algorithm=grpo", "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    algorithm = yaml.safe_load(shown.stdout)["algorithm"]
    assert (algorithm["name"], algorithm["ratio_level"], algorithm["clip_low"], algorithm["clip_high"]) == (
        "grpo", "token", 0.2, 0.28)
    assert reload(shown.stdout).algorithm == expected_algorithm("paper_state", "grpo")
