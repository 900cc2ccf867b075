"""Compare methods (or ablations, or agent counts) over several seeds: results.csv, results.md, plots.

    python scripts/compare.py                                   # grpo gspo gspo_x2 naive hacpo, seeds 0-4
    python scripts/compare.py methods=[gspo_x2,hacpo] seeds=[0,1,2] trainer.steps=100
    python scripts/compare.py methods=[hacpo] ablations=[hacpo_no_adv,hacpo_no_omega]
    python scripts/compare.py study=scaling seeds=[0,1,2]        # n = 2, 3, 4 zoo agents, all vs 2 partner samples
    python scripts/compare.py study=capability methods=[gspo_x2,naive,hacpo]   # pairs close / apart in skill
    python scripts/compare.py out=runs/compare/mine jobs=2 agents=[tiny_a,tiny_c]
    python scripts/compare.py seeds=[0,1,2] allow_partial=true   # means over finished runs if some failed

Keys of this script (`CompareConfig` below) are taken from the command line; every other
`key=value` is a training override given to each run, exactly as to `scripts/train.py`. Every run
is composed and validated before the first one starts (all problems at once, exit status 2). Each
run is a `scripts/train.py` subprocess in `<out>/runs/<method>/seed<k>` with its log beside it.
A run is finished only when its summary says `completed` after all its steps. Re-running the same
command skips finished runs whose saved config hashes to the same resolved settings and that read the
same files (the SHA-256 of every data file, code reward file and local model folder the config names,
computed once per invocation and recorded beside each run when it starts, `seed<k>.inputs.json`),
resumes an interrupted or failed run of the same settings and files from its newest checkpoint, and
re-runs any other (`overwrite=true`), so a comparison survives interruptions. A run continued by hand
past the planned `trainer.steps` (`resume=`) is never reused nor overwritten: compare.py refuses to
start (exit 2), naming the run and its steps. Ctrl-C (SIGINT), SIGTERM or SIGHUP stop
it: each running run checkpoints and ends as interrupted, no new one starts, exit 128 + the signal.
One compare.py at a time per output directory (a lock, `<out>/.lock`: a second is refused, exit 2).
The outputs are rewritten from all finished runs after each run: `results.csv`, `results.md` (with
each method and agent's diagnostics, docs/training.md#diagnostics, and what the agents know together: union and
majority-vote accuracy, their gains over the best single agent, the pairwise complementarity), `accuracy_vs_rollouts.png`,
`final_accuracy.png` (and `step_time.png` for the scaling study, `gap_vs_capability.png` for the
capability study). Each mean says how many of its planned runs it rests on; an arm with fewer finished
runs than planned gets no mean (`allow_partial=true`: a mean over the finished ones, marked partial),
and compare.py exits 1 naming the runs that did not finish.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hacrl_lightning import experiments as ex
from hacrl_lightning.cli import SCRIPTS_DIR, WORK_DIR, compose_config, hydra_value
from hacrl_lightning.errors import ConfigError, Problem
from hacrl_lightning.run_dir import is_run_dir, live_holder, lock_directory, output_dir_problem, unlock_directory

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
    """Output directory; default runs/compare/<study>. Re-running with the same `out` resumes. A folder that
    holds other files (not a comparison's) is refused unless `overwrite=true`."""
    overwrite: bool = False
    """Write into an `out` that holds other files: compare.py's own outputs there are replaced, others kept."""
    jobs: int = 1
    """Runs at once (each gets cores/jobs torch threads)."""
    allow_partial: bool = False
    """Show means over an arm's finished runs when some of its planned runs did not finish (marked partial);
    by default such an arm gets no mean."""


MARKER = ".hacrl_compare"
"""Written into every comparison's `out`: re-running into it resumes, and is not refused as someone's folder."""


def is_comparison(out: Path) -> bool:
    """`out` holds a comparison: the marker, or (one made before the marker) a `runs/` of run directories."""
    if (out / MARKER).is_file():
        return True
    runs = out / "runs"
    return runs.is_dir() and any(is_run_dir(run) for arm in runs.iterdir() if arm.is_dir() for run in arm.iterdir()
                                 if run.is_dir())


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
    """Compose, validate and preflight every run before the first starts; raise one ConfigError with all problems.
    Returns the specs with the hash of their resolved config, the checksums of the files they read (each file
    read once here, `ex.run_inputs`) and their planned steps, and each run directory's resolved values."""
    problems: list[Problem] = []
    said, refused = set(), set()  # fitted-length lines printed, problems listed: each once over all runs
    hashed, values = [], {}
    checksums: dict[Path, str] = {}
    for spec in specs:
        try:  # with train.py's preflight, which may fit agents' lengths (data.few_shot): what the run will save
            with contextlib.redirect_stdout(io.StringIO()) as out:
                _, dcfg = compose_config(spec.overrides(training, quote=hydra_value), preflight=True)
            for line in out.getvalue().splitlines():  # each fitted length once, not once per run
                if line not in said:
                    said.add(line)
                    print(line, flush=True)
            values[spec.run_dir] = ex.resolved_values(OmegaConf.to_yaml(dcfg, resolve=True))  # as train.py saves it
            inputs = input_checksums(values[spec.run_dir], checksums)
            hashed.append(replace(spec, config_hash=ex.config_hash(values[spec.run_dir]), inputs=inputs,
                                  steps=values[spec.run_dir].get("trainer.steps")))
        except ConfigError as err:
            for problem in err.problems:
                text = f"[{spec.arm.name}] {problem}"
                if text not in refused:
                    refused.add(text)
                    problems.append(Problem(f"{spec.arm.name}: {problem.key}", problem.value, problem.allowed, problem.fix))
    if problems:
        raise ConfigError(problems)
    return hashed, values


def input_checksums(values: dict, cache: dict[Path, str]) -> tuple[tuple[str, str], ...]:
    """`ex.run_inputs` of one run (relative paths from WORK_DIR, where the runs start); a file that exists but
    cannot be read is a ConfigError naming its key."""
    pairs = {}
    for key, path in ex.input_paths(values, WORK_DIR):
        try:
            pairs[str(path)] = ex.checksum(path, cache)
        except OSError as err:
            raise ConfigError([Problem(key, str(path), "a file or folder this user can read",
                                       f"make it readable (chmod u+r) or name another ({type(err).__name__}: "
                                       f"{err.strerror or err})")]) from None
    return tuple(sorted(pairs.items()))


def extended_problems(specs: list[ex.RunSpec]) -> list[Problem]:
    """A Problem for each run directory holding a run continued by hand past the plan's steps (`extended`): it is
    neither reused (its results are of more steps) nor overwritten (it is the user's)."""
    problems = []
    for spec in specs:
        if spec.state == "extended":
            steps = spec.extended_to()
            moved = spec.run_dir.with_name(f"{spec.run_dir.name}_{steps}steps")
            problems.append(Problem(
                "trainer.steps", spec.steps, f"runs of {spec.steps} steps in {spec.run_dir.parent}",
                f"{spec.arm.name} seed={spec.seed} ({spec.run_dir}) was continued by hand to {steps} steps (resume=); "
                f"compare.py neither reuses nor deletes it: give trainer.steps={steps} to compare at {steps} steps, "
                f"move it aside (mv {shlex.quote(str(spec.run_dir))} {shlex.quote(str(moved))}) to re-run the "
                f"{spec.steps}-step plan, or give another out="))
    return problems


def command(spec: ex.RunSpec, training: list[str]) -> list[str]:
    """The `scripts/train.py` command of an unfinished run: an interrupted or failed run of the same config
    resumes from its newest checkpoint; any other run in its directory (another config, or ended before its
    first checkpoint) is overwritten, its stale `summary.json` removed first so a failed re-run never reads as
    done."""
    from hacrl_lightning.callbacks.checkpoint import latest_checkpoint  # Lightning: loaded once a run starts

    args = spec.overrides(training, quote=hydra_value)
    if spec.same_config and spec.same_inputs and (spec.run_dir / "checkpoints").is_dir():
        try:
            return [sys.executable, str(SCRIPTS_DIR / "train.py"), *args,
                    f"resume={hydra_value(str(latest_checkpoint(spec.run_dir / 'checkpoints')))}"]
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


PLOTS = ("accuracy_vs_rollouts.png", "final_accuracy.png", "step_time.png", "gap_vs_capability.png")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a comparison: each is passed on to every running run (SIGHUP as SIGTERM), which
checkpoints and ends as `interrupted`; the next compare.py run resumes it."""


def write_outputs(cfg: CompareConfig, specs: list[ex.RunSpec], out: Path, training: list[str]) -> dict[str, Path]:
    """results.csv (every finished run), results.md and the plots: means only over arms whose every planned run
    finished, unless `cfg.allow_partial` (then over the finished runs, marked partial)."""
    rows = ex.collect_rows(specs)
    table = ex.summarize(rows, allow_partial=cfg.allow_partial)
    shown = {spec.arm.name for spec in specs} if cfg.allow_partial else ex.complete_arms(specs)
    shown_rows = [row for row in rows if row["method"] in shown]
    shown_specs = [spec for spec in specs if spec.arm.name in shown]
    shown_table = [row for row in table if row["method"] in shown]
    reference = specs[0].arm.name if cfg.study == "scaling" else cfg.reference
    gaps = ex.paired_gaps(shown_rows, reference=reference)
    equal = ex.equal_rollout_gaps(shown_specs, reference=reference)
    unfinished = [f"{spec.arm.name} seed={spec.seed} ({spec.state})" for spec in specs if not spec.done]
    notes = [f"Command: `{shlex.join(['python', 'scripts/compare.py', *sys.argv[1:]])}`",
             f"Finished runs: {sum(s.done for s in specs)} of {len(specs)}; seeds {cfg.seeds}; "
             f"training overrides: {shlex.join(training) or '(none)'}"]
    if unfinished:
        notes.append(f"Not finished (no result; the same command resumes or re-runs them): {', '.join(unfinished)}")
    paths = {"csv": ex.write_csv(rows, out / "results.csv"), "md": out / "results.md"}
    collective = ex.summarize_collective(rows, allow_partial=cfg.allow_partial)  # what the agents know together
    paths["md"].write_text(ex.markdown_report(table, gaps, title=f"Comparison ({cfg.study})", notes=notes,
                                              equal_rollout=equal, collective=collective))
    for name in PLOTS:  # a plot of an earlier call that this one does not draw is not left to mislead
        (out / name).unlink(missing_ok=True)
    if not shown_table:
        return paths
    paths["curves"] = ex.plot_accuracy_vs_rollouts(ex.accuracy_curves(shown_specs), out / "accuracy_vs_rollouts.png")
    paths["bars"] = ex.plot_final_accuracy(shown_table, out / "final_accuracy.png")
    if cfg.study == "scaling":
        paths["step_time"] = ex.plot_step_time(shown_table, out / "step_time.png")
    if cfg.study == "capability" and gaps:
        paths["gap"] = ex.plot_gap_vs_capability(shown_table, gaps, out / "gap_vs_capability.png", reference=reference)
    return paths


def _describe(spec: ex.RunSpec) -> str:
    """A finished run's accuracies and time, or how it ended and where its log is."""
    summary = spec.read_summary() or {}
    if not spec.done:
        state = spec.state
        if state == "interrupted":
            return (f"interrupted at step {summary.get('steps')} of {summary.get('steps_wanted')} "
                    f"({summary.get('signal') or 'stopped'}); the next compare.py run resumes it")
        reason = f": {summary['error']}" if state == "failed" and summary.get("error") else ""
        return f"{state}{reason} (see {spec.log_path}); the next compare.py run retries it"
    accs = ", ".join(f"{name} {row['initial'].get('acc', 0):.2f}->{row['final'].get('acc', 0):.2f}"
                     for name, row in summary["agents"].items())
    return f"{accs} ({summary['wall_s']:.0f} s)"


def _announce(specs: list[ex.RunSpec], todo: list[ex.RunSpec], out: Path, wanted: dict[Path, dict]) -> None:
    """The plan's first lines: how many runs are reused, and why each other one is resumed or re-run."""
    print(f"{len(specs)} runs ({len(specs) - len(todo)} already finished) -> {out}")
    for spec in todo:
        state, summary = spec.state, spec.read_summary() or {}
        if state == "stale" and not spec.same_config:
            print(f"  stale  {spec.arm.name} seed={spec.seed}: ran under another config "
                  f"({changes(spec.saved_values(), wanted[spec.run_dir])}); re-running it from the start")
        elif state == "stale":
            print(f"  stale  {spec.arm.name} seed={spec.seed}: read other file contents ({spec.input_changes()}); "
                  "re-running it from the start")
        elif state in ("interrupted", "failed"):
            print(f"  retry  {spec.arm.name} seed={spec.seed}: {state} at step {summary.get('steps')} of "
                  f"{summary.get('steps_wanted')}; resuming from its newest checkpoint, or re-running it without one")


class Stop:
    """While in use: SIGINT, SIGTERM and SIGHUP are caught (an ignored one stays ignored) and passed on to each
    running run; `signum` is the first one caught (None: none)."""

    def __init__(self, running: list[tuple[ex.RunSpec, subprocess.Popen, Any]]):
        self.running, self.signum, self.previous = running, None, {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        for _, proc, _ in self.running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def __enter__(self) -> "Stop":
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def run_all(cfg: CompareConfig, specs: list[ex.RunSpec], training: list[str], out: Path,
            wanted: dict[Path, dict]) -> int | None:
    """Run the specs not finished under their config, `cfg.jobs` at a time, with a line per start and finish
    (`wanted`: each run directory's resolved values, to say why a finished run is re-run). Each run is in its
    own process group, so a terminal's Ctrl-C reaches it once, from here. Returns the signal that stopped the
    comparison (None: every run ended): no run starts after it, and the running ones checkpoint and end."""
    todo = [spec for spec in specs if not spec.done]
    _announce(specs, todo, out, wanted)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // cfg.jobs)))
    running: list[tuple[ex.RunSpec, subprocess.Popen, Any]] = []
    started, finished = time.perf_counter(), 0
    with Stop(running) as stop:
        while running or (todo and not stop.signum):
            while todo and len(running) < cfg.jobs and not stop.signum:
                spec = todo.pop(0)
                if spec.done:  # finished since the plan was made (another compare.py or train.py): reused, untouched
                    print(f"  done   {spec.arm.name} seed={spec.seed}: finished meanwhile; reused", flush=True)
                    continue
                holder = live_holder(spec.run_dir)
                if holder:  # started since the plan was made: never touched while its process lives
                    print(f"  held   {spec.arm.name} seed={spec.seed}: {spec.run_dir} is in use by {holder}; "
                          "left alone (run compare.py again once it ends)", flush=True)
                    continue
                args = command(spec, training)
                spec.record_inputs()  # what this run reads, as compare.py checksummed it
                spec.log_path.parent.mkdir(parents=True, exist_ok=True)
                log = spec.log_path.open("a")
                log.write(f"$ {shlex.join(args)}\n")
                log.flush()
                running.append((spec, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                       cwd=WORK_DIR, process_group=0), log))
                print(f"  start  {spec.arm.name} seed={spec.seed}", flush=True)
            time.sleep(0.5)
            for item in [item for item in running if item[1].poll() is not None]:
                spec, proc, log = item
                running.remove(item)
                log.close()
                finished += 1
                elapsed = time.perf_counter() - started
                left = len(todo) + len(running)
                eta = elapsed / finished * left
                print(f"  [{finished}/{finished + left}] {spec.arm.name} seed={spec.seed}: {_describe(spec)} | "
                      f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left", flush=True)
                write_outputs(cfg, specs, out, training)
    return stop.signum


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return 0
    try:
        cfg, training = parse_args(argv)
        arms, out = plan(cfg)
        problem = output_dir_problem(out, key="out", overwrite=cfg.overwrite, owned=is_comparison(out),
                                     writes="runs/, results.csv, results.md and plots")
        if problem:
            raise ConfigError([problem])
        specs, wanted = check_runs(ex.plan_runs(arms, cfg.seeds, out), training)
        extended = extended_problems(specs)
        if extended:
            raise ConfigError(extended)
        held = [(spec, holder) for spec in specs if (holder := live_holder(spec.run_dir))]
        if held:  # another train.py (or compare.py) is running one of these runs: touch none of them
            raise ConfigError([Problem("out", str(out), "runs no other process is using",
                                       f"{spec.run_dir} is in use by {holder}; wait for it to end (or stop it), "
                                       "then run this command again") for spec, holder in held])
        out.mkdir(parents=True, exist_ok=True)
        lock = lock_directory(out, key="out", what="comparison")  # one compare.py per output directory
        (out / MARKER).write_text("A scripts/compare.py output directory: re-running compare.py with this out= "
                                  "resumes it.\n")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        return _run(cfg, specs, training, out, wanted, again=shlex.join(["python", "scripts/compare.py", *argv]))
    finally:
        unlock_directory(out, lock)


def _run(cfg: CompareConfig, specs: list[ex.RunSpec], training: list[str], out: Path, wanted: dict[Path, dict], *,
         again: str) -> int:
    """Run, write the outputs and say how it ended (`again`: this command, to print): 0 (every planned run
    finished), 1 (some did not), 128 + the signal that stopped it."""
    signum = run_all(cfg, specs, training, out, wanted)
    paths = write_outputs(cfg, specs, out, training)
    unfinished = [spec for spec in specs if not spec.done]
    if signum:
        print(f"compare.py: stopped by {signal.Signals(signum).name}; {len(unfinished)} of {len(specs)} runs not "
              f"finished (each running one checkpointed and ended as interrupted). The same command resumes them: "
              f"{again}", file=sys.stderr)
        return 128 + signum
    print((out / "results.md").read_text())
    print("outputs: " + ", ".join(str(p) for p in paths.values()))
    if unfinished:
        partial = sorted({spec.arm.name for spec in unfinished})
        shown = "shows their means over the finished runs, marked partial" if cfg.allow_partial else (
            "shows no mean for them (allow_partial=true shows means over the finished runs)")
        print(f"error: {len(unfinished)} of {len(specs)} planned runs did not finish: "
              f"{', '.join(f'{s.arm.name} seed={s.seed} ({s.state}, log {s.log_path})' for s in unfinished)}. "
              f"results.md {shown} for {', '.join(partial)}. Re-run the same command to resume or retry them "
              f"(finished runs are kept): {again}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
