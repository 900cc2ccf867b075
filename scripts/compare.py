"""Compare methods (or ablations, or agent counts) over several seeds: results.csv, results.md, plots.

    python scripts/compare.py                                   # grpo gspo gspo_x2 naive hacpo, seeds 0-4
    python scripts/compare.py methods=[gspo_x2,hacpo] seeds=[0,1,2] trainer.steps=100
    python scripts/compare.py methods=[hacpo] ablations=[hacpo_no_adv,hacpo_no_omega]
    python scripts/compare.py study=scaling seeds=[0,1,2]        # n = 2, 3, 4 zoo agents, all vs 2 partner samples
    python scripts/compare.py study=capability methods=[gspo_x2,naive,hacpo]   # pairs close / apart in skill
    python scripts/compare.py out=runs/compare/mine jobs=2 agents=[tiny_a,tiny_c]

Keys of this script (`CompareConfig` below) are taken from the command line; every other
`key=value` is a training override given to each run, exactly as to `scripts/train.py`. Every run
is composed and validated before the first one starts (all problems at once, exit status 2). Each
run is a `scripts/train.py` subprocess in `<out>/runs/<method>/seed<k>` with its log beside it.
Re-running the same command skips finished runs whose saved config hashes to the same resolved
settings (any other run is re-run with `overwrite=true`) and resumes an interrupted run from its newest checkpoint, so a comparison survives interruptions. The outputs
are rewritten from all finished runs after each run: `results.csv`, `results.md` (with each method and
agent's diagnostics, docs/training.md#diagnostics),
`accuracy_vs_rollouts.png`, `final_accuracy.png` (and `step_time.png` for the scaling study, `gap_vs_capability.png`
for the capability study).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hacrl_lightning import experiments as ex
from hacrl_lightning.cli import SCRIPTS_DIR, WORK_DIR, compose_config
from hacrl_lightning.errors import ConfigError, Problem

METHODS = ["grpo", "gspo", "gspo_x2", "naive", "hacpo"]
ABLATIONS = ["hacpo_no_adv", "hacpo_no_omega", "hacpo_alpha0", "hacpo_no_stepwise", "hacpo_no_clip"]
ZOO_SETS = [["tiny_a", "tiny_b"], ["tiny_a", "tiny_b", "tiny_c"], ["tiny_a", "tiny_b", "tiny_c", "tiny_d"]]
ZOO_PAIRS = [["tiny_a", "tiny_b"], ["tiny_a", "tiny_c"], ["tiny_a", "tiny_e"]]
"""tiny_a (0.215 held-out) with a partner close to it (0.266), moderately apart (0.387) and far apart (0.582)."""
STUDIES = ("methods", "scaling", "capability")


@dataclass
class CompareConfig:
    study: str = "methods"
    """`methods`: one arm per entry of `methods` + `ablations`; `scaling`: agent sets x partner samples;
    `capability`: agent pairs x `methods`, each method compared with `reference` within its pair."""
    methods: List[str] = field(default_factory=lambda: list(METHODS))
    ablations: List[str] = field(default_factory=list)
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    reference: str = "hacpo"
    """Method the others are compared with, seed by seed, in results.md (the scaling study: its first arm, n2)."""
    pairs: List[List[str]] = field(default_factory=lambda: [list(p) for p in ZOO_PAIRS])
    """Capability study: the agent pairs, the first agent the same in each (the x axis of the gap plot is the
    partner's starting accuracy minus the first agent's)."""
    agent_sets: List[List[str]] = field(default_factory=lambda: [list(s) for s in ZOO_SETS])
    """Scaling study: the agent sets (n = 2, 3, 4 by default)."""
    cross_samples: List[Any] = field(default_factory=lambda: ["all", 2])
    """Scaling study: values of algorithm.cross_samples_per_prompt."""
    out: Optional[str] = None
    """Output directory; default runs/compare/<study>. Re-running with the same `out` resumes."""
    jobs: int = 1
    """Runs at once (each gets cores/jobs torch threads)."""


def parse_args(argv: list[str]) -> tuple[CompareConfig, list[str]]:
    """Split this script's keys from the training overrides and type-check them."""
    own_keys = {f.name for f in fields(CompareConfig)}
    own, training = [], []
    for arg in argv:
        (own if arg.split("=", 1)[0] in own_keys else training).append(arg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(CompareConfig), OmegaConf.from_dotlist(own))
    except OmegaConfBaseException as err:
        raise ConfigError([Problem(str(getattr(err, "full_key", "") or "compare"), own, "see scripts/compare.py --help",
                                   str(err).splitlines()[0])]) from None
    cfg: CompareConfig = OmegaConf.to_object(merged)
    problems = []
    if cfg.study not in STUDIES:
        problems.append(Problem("study", cfg.study, " | ".join(STUDIES), "set study=methods, scaling or capability"))
    if cfg.study == "capability" and (not cfg.pairs or any(len(p) != 2 or p[0] == p[1] for p in cfg.pairs)):
        problems.append(Problem("pairs", cfg.pairs, "a non-empty list of pairs of two different agents",
                                "e.g. pairs=[[tiny_a,tiny_b],[tiny_a,tiny_e]]"))
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        problems.append(Problem("seeds", cfg.seeds, "a non-empty list of distinct integers", "e.g. seeds=[0,1,2]"))
    if cfg.jobs < 1:
        problems.append(Problem("jobs", cfg.jobs, "an integer >= 1", "e.g. jobs=2"))
    if problems:
        raise ConfigError(problems)
    return cfg, training


def plan(cfg: CompareConfig) -> tuple[list[ex.Arm], Path]:
    """The arms and the output directory; an arm named twice (it would share one run directory) is refused."""
    if cfg.study == "scaling":
        arms = ex.scaling_arms(cfg.agent_sets, cfg.cross_samples)
        key, fix = "agent_sets / cross_samples", ("arms are named by agent count and partner samples (n2, n2_cs2): "
                                                  "give one agent set per size and each cross_samples value once")
    elif cfg.study == "capability":
        arms = ex.capability_arms(cfg.pairs, [*cfg.methods, *cfg.ablations])
        key, fix = "pairs / methods", "name each pair and each method once"
    else:
        arms = ex.method_arms([*cfg.methods, *cfg.ablations])
        key, fix = "methods / ablations", "name each method once, in methods or in ablations"
    duplicates = ex.duplicate_names(arms)
    if duplicates:
        raise ConfigError([Problem(key, duplicates, "each arm once", fix)])
    out = Path(cfg.out or WORK_DIR / "runs" / "compare" / cfg.study).resolve()
    return arms, out


def check_runs(specs: list[ex.RunSpec], training: list[str]) -> tuple[list[ex.RunSpec], dict[Path, dict]]:
    """Compose and validate every run before the first starts; raise one ConfigError with all problems.
    Returns the specs with the hash of their resolved config, and each run directory's resolved values."""
    problems: list[Problem] = []
    seen: set[str] = set()
    hashed, values = [], {}
    for spec in specs:
        try:
            _, dcfg = compose_config(spec.overrides(training))
            values[spec.run_dir] = ex.resolved_values(OmegaConf.to_yaml(dcfg, resolve=True))  # as train.py saves it
            hashed.append(replace(spec, config_hash=ex.config_hash(values[spec.run_dir])))
        except ConfigError as err:
            for problem in err.problems:
                text = f"[{spec.arm.name}] {problem}"
                if text not in seen:
                    seen.add(text)
                    problems.append(Problem(f"{spec.arm.name}: {problem.key}", problem.value, problem.allowed, problem.fix))
    if problems:
        raise ConfigError(problems)
    return hashed, values


def command(spec: ex.RunSpec, training: list[str]) -> list[str]:
    """The `scripts/train.py` command of an unfinished run: an interrupted run of the same config resumes
    from its newest checkpoint; any other run in its directory (another config, or failed before its first
    checkpoint) is overwritten, its stale `summary.json` removed first so a failed re-run never reads as done."""
    from hacrl_lightning.callbacks.checkpoint import latest_checkpoint  # Lightning: loaded once a run starts

    args = spec.overrides(training)
    if spec.same_config and (spec.run_dir / "checkpoints").is_dir():
        try:
            return [sys.executable, str(SCRIPTS_DIR / "train.py"), *args,
                    f"resume={latest_checkpoint(spec.run_dir / 'checkpoints')}"]
        except FileNotFoundError:
            pass
    if spec.run_dir.is_dir() and any(spec.run_dir.iterdir()):
        spec.summary_path.unlink(missing_ok=True)
        args.append("overwrite=true")
    return [sys.executable, str(SCRIPTS_DIR / "train.py"), *args]


def changes(saved: dict | None, wanted: dict) -> str:
    """What differs between a run's saved config and this command's, for the console (a few keys)."""
    if saved is None:
        return "no readable config.yaml"
    keys = [key for key in dict.fromkeys([*wanted, *saved]) if saved.get(key, "(unset)") != wanted.get(key, "(unset)")]
    shown = ", ".join(f"{key} {saved.get(key, '(unset)')} -> {wanted.get(key, '(unset)')}" for key in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def write_outputs(cfg: CompareConfig, specs: list[ex.RunSpec], out: Path, training: list[str]) -> dict[str, Path]:
    rows = ex.collect_rows(specs)
    if not rows:
        return {}
    table = ex.summarize(rows)
    reference = specs[0].arm.name if cfg.study == "scaling" else cfg.reference
    gaps = ex.paired_gaps(rows, reference=reference)
    equal = ex.equal_rollout_gaps(specs, reference=reference)
    notes = [f"Command: `python scripts/compare.py {' '.join(sys.argv[1:])}`".rstrip(),
             f"Finished runs: {sum(s.done for s in specs)} of {len(specs)}; seeds {cfg.seeds}; "
             f"training overrides: {' '.join(training) or '(none)'}"]
    paths = {"csv": ex.write_csv(rows, out / "results.csv")}
    paths["md"] = out / "results.md"
    paths["md"].write_text(ex.markdown_report(table, gaps, title=f"Comparison ({cfg.study})", notes=notes,
                                              equal_rollout=equal))
    paths["curves"] = ex.plot_accuracy_vs_rollouts(ex.accuracy_curves(specs), out / "accuracy_vs_rollouts.png")
    paths["bars"] = ex.plot_final_accuracy(table, out / "final_accuracy.png")
    if cfg.study == "scaling":
        paths["step_time"] = ex.plot_step_time(table, out / "step_time.png")
    if cfg.study == "capability" and gaps:
        paths["gap"] = ex.plot_gap_vs_capability(table, gaps, out / "gap_vs_capability.png", reference=reference)
    return paths


def _describe(spec: ex.RunSpec) -> str:
    if not spec.done:
        return f"failed (see {spec.log_path})"
    summary = spec.summary()
    accs = ", ".join(f"{name} {row['initial'].get('acc', 0):.2f}->{row['final'].get('acc', 0):.2f}"
                     for name, row in summary["agents"].items())
    return f"{accs} ({summary['wall_s']:.0f} s)"


def run_all(cfg: CompareConfig, specs: list[ex.RunSpec], training: list[str], out: Path,
            wanted: dict[Path, dict]) -> int:
    """Run the specs not finished under their config, `cfg.jobs` at a time, with a line per start and finish
    (`wanted`: each run directory's resolved values, to say why a finished run is re-run)."""
    todo = [spec for spec in specs if not spec.done]
    print(f"{len(specs)} runs ({len(specs) - len(todo)} already finished) -> {out}")
    for spec in todo:
        if spec.config_path.exists() and not spec.same_config:
            print(f"  stale  {spec.arm.name} seed={spec.seed}: ran under another config "
                  f"({changes(spec.saved_values(), wanted[spec.run_dir])}); re-running it from the start")
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // cfg.jobs)))
    running: list[tuple[ex.RunSpec, subprocess.Popen, Any]] = []
    started, finished, failed = time.perf_counter(), 0, 0
    while todo or running:
        while todo and len(running) < cfg.jobs:
            spec = todo.pop(0)
            args = command(spec, training)
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = spec.log_path.open("a")
            log.write(f"$ {' '.join(args)}\n")
            log.flush()
            running.append((spec, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=WORK_DIR),
                            log))
            print(f"  start  {spec.arm.name} seed={spec.seed}", flush=True)
        time.sleep(0.5)
        for item in [item for item in running if item[1].poll() is not None]:
            spec, proc, log = item
            running.remove(item)
            log.close()
            finished += 1
            failed += proc.returncode != 0
            elapsed = time.perf_counter() - started
            left = len(todo) + len(running)
            eta = elapsed / finished * left
            print(f"  [{finished}/{finished + left}] {spec.arm.name} seed={spec.seed}: {_describe(spec)} | "
                  f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left", flush=True)
            write_outputs(cfg, specs, out, training)
    return failed


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return 0
    try:
        cfg, training = parse_args(argv)
        arms, out = plan(cfg)
        specs, wanted = check_runs(ex.plan_runs(arms, cfg.seeds, out), training)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = run_all(cfg, specs, training, out, wanted)
    paths = write_outputs(cfg, specs, out, training)
    if paths:
        print((out / "results.md").read_text())
        print("outputs: " + ", ".join(str(p) for p in paths.values()))
    if failed:
        print(f"error: {failed} run(s) failed; their logs are <out>/runs/<method>/seed<k>.log. Re-run the same command "
              "to retry them (finished runs are kept).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
