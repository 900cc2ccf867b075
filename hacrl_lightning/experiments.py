"""Comparisons over seeds: what to run (arms x seeds), and what the finished runs say (rows, intervals, plots).

An *arm* is a labelled set of training overrides (`hacpo` = `algorithm=hacpo`; `n3_cs2` = three
agents, two partner samples per prompt; `tiny_a+tiny_c/hacpo` = that pair under HACPO, the capability-gap
study, whose arms are compared within their pair). `plan_runs` crosses arms with seeds into `RunSpec`s, each
with its own run directory. A run is a result only when it finished: its `summary.json` (written
atomically by `training.train`) says `completed` after every step it wanted, under the same resolved
config (`config_hash` hashes the resolved config, the text a run saves as `config.yaml`, without
`HASH_IGNORES`; a spec knows the hash its run must have), reading the same files (`run_inputs`: the SHA-256 of
every file the config names by path, recorded beside the run when it starts, `RunSpec.inputs_path`), and for
no more steps than planned (a run continued by hand with `resume=` is `extended`, never a result of a shorter
plan). An interrupted, failed or killed run is not (`RunSpec.state` says which, for the console and a retry). `result_rows` turns summaries into one row
per (arm, agent, seed), each saying how many of its arm's planned runs finished; `summarize` gives mean
and Student-t 95% confidence intervals over seeds, and no mean (nan) for an arm with fewer finished
runs than planned unless `allow_partial` (`summarize_collective` likewise for the group's figures of each arm:
union and majority-vote accuracy, their gains, the pairwise complementarity); `paired_gaps` compares
each arm with a reference arm seed by seed (same seed = same prompt order and initial agents), and
`equal_rollout_gaps` does so at an equal number of rollouts generated (GSPO×2 halfway against HACPO at the end).

Deliberately not here: launching runs and Hydra (`scripts/compare.py` runs each job through
`scripts/train.py`), and any training (`training.py`).
"""

from __future__ import annotations

import fnmatch

import csv
import hashlib
import importlib.util
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from hacrl_lightning.config import setting_keys
from hacrl_lightning.files import write_atomically

DIAGNOSTIC_COLUMNS = ("cross_nograd_frac_correct", "cross_nograd_frac_wrong", "self_nograd_frac_correct",
                      "self_nograd_frac_wrong", "cross_grad_share", "grad_cos_self_cross", "omega_first", "omega_mean",
                      "omega_last")
"""The run's diagnostics (summary.json `agents.*.diagnostics`, docs/training.md#diagnostics): means over its
steps; `omega_first` / `omega_mean` / `omega_last` are the means over partners of each partner's ω at the first
step, over all steps and at the last step (ω over time). nan where the run has none."""
COLLECTIVE_COLUMNS = ("initial_union_acc", "final_union_acc", "final_union_gain", "initial_majority_acc",
                      "final_majority_acc", "final_majority_gain", "final_majority_tied")
"""The group's held-out figures of the run (summary.json `eval_history[*].collective`, `collective.py`), at its first
and last evaluation, the same on each of its agents' rows: union and majority-vote accuracy, their gains over the
best single agent, the share of problems with tied votes. nan for a run of one agent (or one made before them)."""
RESULT_COLUMNS = ("method", "agent", "seed", "initial_acc", "final_acc", "initial_reward", "final_reward",
                  "rollouts_generated", "responses_trained",
                  "optimizer_updates", "wall_s", "n_agents", "steps", "step_s", *DIAGNOSTIC_COLUMNS,
                  *COLLECTIVE_COLUMNS, "final_right_partner_wrong", "arm_runs", "arm_runs_planned")
"""Columns of `results.csv`, one row per method (arm) x agent x seed of a finished run; `arm_runs` of the
arm's `arm_runs_planned` runs (seeds) have finished, what a mean over the arm rests on. `*_acc`: the held-out
accuracy of the verifier (the reward's first term); `*_reward`: the held-out mean of the weighted `data.rewards`
sum (equal to the accuracy for a single unweighted reward); `final_right_partner_wrong`: JSON, partner -> the share of
held-out problems this agent gets right and that partner wrong at the last evaluation ({} for one agent)."""
STATES = ("finished", "interrupted", "failed", "stale", "extended", "unfinished")
"""`RunSpec.state`: finished (a result); interrupted (resumable); failed; stale (ran under another config, or
read files whose contents have changed since); extended (continued by hand past the planned steps: no result,
and never overwritten); unfinished (not started, killed before its summary, or a `completed` summary short of
its steps)."""

HASH_IGNORES = (*setting_keys("location"), *setting_keys("unhashed"))
"""Keys that do not change what a run computes or reports (`setting(location=True)`, `setting(unhashed=True)`):
where it lives, how the command started it (fresh, resumed, overwriting), where the built tiny agents are
cached, how often it prints a progress line. Every other resolved value counts (a key added to the schema
later makes older runs stale)."""


def resolved_values(config_yaml: str) -> dict[str, Any]:
    """The typed values of a resolved config (the text of a run's `config.yaml`), flat (`agents.tiny_a.lr`),
    without `HASH_IGNORES`; raises ValueError when the text is not a config of today's schema."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hacrl_lightning.config import TrainConfig, flat_values

    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.create(config_yaml)))
    except OmegaConfBaseException as err:
        raise ValueError(f"not a training config: {str(err).splitlines()[0]}") from None
    return {key: value for key, value in flat_values(typed).items()
            if not any(fnmatch.fnmatchcase(key, pattern) for pattern in HASH_IGNORES)}


def config_hash(values: dict[str, Any]) -> str:
    """A short, stable hash of `resolved_values` (key order is the schema's, agents in config order)."""
    return hashlib.sha256(json.dumps(values, default=str).encode()).hexdigest()[:16]


# -- the files a run reads ----------------------------------------------------------------------------

WHOLE_FILE_LIMIT = 64 * 2**20
"""Inside a folder (a local model), files up to this size are keyed by their SHA-256, larger ones (weight shards
of GBs) by their size and modification time: a changed `config.json`, tokenizer or tiny model's weights is
seen by its contents, a rewritten shard by its new mtime."""


def input_paths(values: dict[str, Any], base: Path) -> list[tuple[str, Path]]:
    """(key, path) of every file or folder that a run of these `resolved_values` reads and that its config names
    by path: data files, a code reward's `.py` file (`path.py:fn`, or the file of `module:fn`), a local model or
    tokenizer folder, and any other string value that names an existing path (contains `/`, starts with `~` or
    has a suffix: `a.jsonl`). Relative paths are taken from `base` (where the runs start). Agent and experiment
    YAML files need no entry: their contents are in the resolved values. Registered rewards and `zoo:` agents
    are the project's code; hub models are named by id and revision."""
    found: list[tuple[str, Path]] = []

    def visit(key: str, value: Any) -> None:
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{key}.{i}", item)
        elif isinstance(value, dict):
            for name, item in value.items():
                visit(f"{key}.{name}", item)
        elif isinstance(value, str) and value.strip() not in ("", ".", ".."):
            path = _named_path(key, value, base)
            if path is not None:
                found.append((key, path))

    for key, value in values.items():
        visit(key, value)
    return found


def _named_path(key: str, value: str, base: Path) -> Path | None:
    """The existing file or folder a config value names, or None (a name, a number, a hub id)."""
    target, colon, _ = value.rpartition(":")
    if colon and target and not value.startswith(("http:", "https:")):  # a code spec: path.py:fn or module:fn
        if target.endswith(".py") or "/" in target:
            value = target
        elif target.replace(".", "").replace("_", "").isalnum() and key.split(".")[-1] == "reward":
            try:
                origin = getattr(importlib.util.find_spec(target), "origin", None)
            except (ImportError, ValueError):
                origin = None
            return Path(origin) if origin and Path(origin).is_file() else None
        else:
            return None
    looks_like_path = "/" in value or value.startswith("~") or Path(value).suffix or key.endswith((".model", ".tokenizer"))
    if not looks_like_path:
        return None
    try:  # a prompt or template with `/` in it is no path: too long, a NUL, `~nobody` all read as none
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        return path.resolve() if path.exists() else None
    except (OSError, ValueError, RuntimeError):
        return None


def checksum(path: Path, cache: dict[Path, str] | None = None) -> str:
    """`sha256:<hex>` of a file's contents; of a folder, the SHA-256 of its manifest: each file's relative path and
    SHA-256 (size and mtime above `WHOLE_FILE_LIMIT`). `cache`: path -> checksum, so one invocation reads each
    path once. Raises OSError for what cannot be read."""
    if cache is not None and path in cache:
        return cache[path]
    if path.is_dir():
        lines = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                file = Path(root) / name
                stat = file.stat()
                key = (f"size {stat.st_size} mtime {stat.st_mtime_ns}" if stat.st_size > WHOLE_FILE_LIMIT
                       else _file_sha256(file))
                lines.append(f"{file.relative_to(path)}\t{key}")
        value = "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
    else:
        value = "sha256:" + _file_sha256(path)
    if cache is not None:
        cache[path] = value
    return value


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_inputs(values: dict[str, Any], base: Path, cache: dict[Path, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The contents of what a run reads (`input_paths`): sorted (path, `checksum`) pairs, what a run's record
    holds and a comparison's key compares. Raises OSError naming nothing: the caller names the key."""
    return tuple(sorted({str(path): checksum(path, cache) for _, path in input_paths(values, base)}.items()))


@dataclass(frozen=True)
class Arm:
    """One compared configuration: a label and the training overrides that make it."""

    name: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class RunSpec:
    arm: Arm
    seed: int
    run_dir: Path
    config_hash: str = ""
    """The hash of the resolved config this run must have (`config_hash`); empty: not checked."""
    inputs: tuple[tuple[str, str], ...] | None = None
    """The (path, checksum) of every file this run must read (`run_inputs`); None: not checked."""
    steps: int | None = None
    """The steps this run is planned to make (`trainer.steps`); None: not checked."""

    def overrides(self, common: Sequence[str] = (), *, quote: Callable[[str], str] = str) -> list[str]:
        """The `scripts/train.py` overrides of this run: shared ones first, then the arm's, seed, run dir
        (written by `quote`: `cli.hydra_value`, for a path Hydra must read quoted)."""
        return [*common, *self.arm.overrides, f"seed={self.seed}", f"run_dir={quote(str(self.run_dir))}"]

    @property
    def summary_path(self) -> Path:
        return self.run_dir / "summary.json"

    @property
    def log_path(self) -> Path:
        """The run's console output, beside its directory (`seed0.log`): a fresh run's directory stays empty
        until `scripts/train.py` fills it."""
        return self.run_dir.with_name(f"{self.run_dir.name}.log")

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def inputs_path(self) -> Path:
        """The record of the files the run read (`seed0.inputs.json`, beside its directory): (path, checksum) as
        computed when compare.py started it."""
        return self.run_dir.with_name(f"{self.run_dir.name}.inputs.json")

    def recorded_inputs(self) -> dict[str, str] | None:
        """The run's record of its inputs (None: none, or unreadable)."""
        try:
            record = json.loads(self.inputs_path.read_text())
        except (OSError, ValueError):
            return None
        files = record.get("files") if isinstance(record, dict) else None
        return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None

    def record_inputs(self) -> None:
        """Write the record of this spec's inputs (atomically), when its run starts."""
        if self.inputs is None:
            return
        self.inputs_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.inputs_path, json.dumps({"files": dict(self.inputs)}, indent=1) + "\n")

    @property
    def same_inputs(self) -> bool:
        """The run read the files this spec reads, as they are now (any run when the spec has no inputs; a run
        without a record only when the spec reads no file)."""
        if self.inputs is None:
            return True
        recorded = self.recorded_inputs()
        return recorded == dict(self.inputs) if recorded is not None else not self.inputs

    def input_changes(self) -> str:
        """What differs between the recorded inputs and this spec's, for the console (a few paths)."""
        recorded, wanted = self.recorded_inputs(), dict(self.inputs or ())
        if recorded is None:
            return f"no record of the files it read ({self.inputs_path.name}): {', '.join(list(wanted)[:3])}"
        said = [f"{path} {'changed' if path in recorded and path in wanted else 'added' if path in wanted else 'no longer read'}"
                for path in dict.fromkeys([*wanted, *recorded]) if recorded.get(path) != wanted.get(path)]
        return ", ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")

    def saved_values(self) -> dict[str, Any] | None:
        """`resolved_values` of the config the run saved (None: none saved, or unreadable)."""
        try:
            return resolved_values(self.config_path.read_text())
        except (OSError, ValueError):
            return None

    @property
    def same_config(self) -> bool:
        """The run directory holds a run of this spec's config (any run when the spec has no hash)."""
        if not self.config_hash:
            return True
        values = self.saved_values()
        return values is not None and config_hash(values) == self.config_hash

    def read_summary(self) -> dict[str, Any] | None:
        """The run's summary.json (None: none, or unreadable)."""
        try:
            summary = json.loads(self.summary_path.read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    @property
    def state(self) -> str:
        """How the run stands (`STATES`): only `finished` is a result."""
        if self.config_path.exists() and not self.same_config:
            return "stale"
        summary = self.read_summary()
        if summary is None or not self.same_config:
            return "unfinished"
        if self.extended_to(summary) is not None:
            return "extended"
        if not self.same_inputs:
            return "stale"
        status, steps = summary.get("status"), summary.get("steps")
        if (status == "completed" and steps is not None and steps == summary.get("steps_wanted")
                and (self.steps is None or steps == self.steps)):
            return "finished"
        return status if status in ("interrupted", "failed") else "unfinished"

    def extended_to(self, summary: dict[str, Any] | None = None) -> int | None:
        """The steps of a run continued past the plan (by hand, `resume=` with more `trainer.steps`), else None."""
        summary = self.read_summary() if summary is None else summary
        steps = (summary or {}).get("steps")
        if self.steps is None or not isinstance(steps, int) or isinstance(steps, bool) or steps <= self.steps:
            return None
        return steps

    @property
    def done(self) -> bool:
        """Completed every step it wanted under this spec's config: its results may be reused."""
        return self.state == "finished"

    def summary(self) -> dict[str, Any]:
        return json.loads(self.summary_path.read_text())


def method_arms(methods: Iterable[str]) -> list[Arm]:
    """One arm per algorithm preset name (`grpo`, `hacpo_no_adv`, ...)."""
    return [Arm(name, (f"algorithm={name}",)) for name in methods]


def scaling_arms(agent_sets: Iterable[Sequence[str]], cross_samples: Iterable[Any], *, method: str = "hacpo") -> list[Arm]:
    """One arm per (agent set, partner samples per prompt): `n3` uses all partner samples, `n3_cs2` two."""
    arms = []
    for agents in agent_sets:
        for per_prompt in cross_samples:
            name = f"n{len(agents)}" + ("" if str(per_prompt) == "all" else f"_cs{per_prompt}")
            arms.append(Arm(name, (f"algorithm={method}", f"agents=[{','.join(agents)}]",
                                   f"algorithm.cross_samples_per_prompt={per_prompt}")))
    return arms


def capability_arms(pairs: Iterable[Sequence[str]], methods: Iterable[str]) -> list[Arm]:
    """One arm per (agent pair, method), named `<pair>/<method>` (`tiny_a+tiny_c/hacpo`): the capability-gap
    study compares the methods within each pair, on pairs whose starting accuracies lie closer or further apart."""
    methods = list(methods)
    return [Arm(f"{pair_label(pair)}/{method}", (f"algorithm={method}", f"agents=[{','.join(pair)}]"))
            for pair in pairs for method in methods]


def pair_label(agents: Sequence[str]) -> str:
    """The name of an agent set in arm names: `tiny_a+tiny_c`."""
    return "+".join(agents)


def arm_group(name: str) -> tuple[str, str]:
    """(group, method) of an arm name: `tiny_a+tiny_c/hacpo` -> (`tiny_a+tiny_c`, `hacpo`); ("", name) for an
    arm without a group (the methods and scaling studies)."""
    group, _, method = name.rpartition("/")
    return group, method


def reference_arm(name: str, reference: str) -> str:
    """The arm `name` is compared with: `reference` itself, or `<group>/<reference>` for a grouped arm."""
    group = arm_group(name)[0]
    return f"{group}/{reference}" if group else reference


def duplicate_names(arms: Sequence[Arm]) -> list[str]:
    """Arm names that occur more than once (two arms would share one run directory)."""
    names = [arm.name for arm in arms]
    return sorted({name for name in names if names.count(name) > 1})


def plan_runs(arms: Sequence[Arm], seeds: Sequence[int], out: Path) -> list[RunSpec]:
    """Every arm x seed, seed-major (so a partial comparison already has every arm for its first seeds)."""
    duplicates = duplicate_names(arms)
    if duplicates:
        raise ValueError(f"arm names must be unique, got {duplicates} more than once")
    return [RunSpec(arm, seed, out / "runs" / arm.name / f"seed{seed}") for seed in seeds for arm in arms]


# -- rows ---------------------------------------------------------------------------------------------


def result_rows(spec: RunSpec, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per agent of a finished run (columns `RESULT_COLUMNS`)."""
    together, final = collective_values(summary)
    rows = []
    for agent, row in summary["agents"].items():
        rows.append({
            "method": spec.arm.name, "agent": agent, "seed": spec.seed,
            "initial_acc": row["initial"].get("acc", math.nan), "final_acc": row["final"].get("acc", math.nan),
            "initial_reward": row["initial"].get("reward", row["initial"].get("acc", math.nan)),
            "final_reward": row["final"].get("reward", row["final"].get("acc", math.nan)),
            "rollouts_generated": row["rollouts_generated"], "responses_trained": row["responses_trained"],
            "optimizer_updates": row["optimizer_updates"], "wall_s": summary["wall_s"],
            "n_agents": len(summary["agents"]), "steps": summary["steps"], "step_s": summary.get("step_s", math.nan),
            **diagnostic_values(row.get("diagnostics", {})), **together,
            "final_right_partner_wrong": json.dumps(final.get("right_wrong", {}).get(agent, {})),
        })
    return rows


def collective_values(summary: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """(`COLLECTIVE_COLUMNS` of a run's summary, its last evaluation's group figures); nan and {} where it has none."""
    history = summary.get("eval_history") or [{}]
    first, last = (history[0].get("collective") or {}), (history[-1].get("collective") or {})
    values = {}
    for column in COLLECTIVE_COLUMNS:
        when, key = column.split("_", 1)
        values[column] = float((first if when == "initial" else last).get(key, math.nan))
    return values, last


def diagnostic_values(diagnostics: dict[str, Any]) -> dict[str, float]:
    """`DIAGNOSTIC_COLUMNS` of one agent's summary block (nan for what it lacks: an older run, a value never measured)."""
    values = {key: math.nan if diagnostics.get(key) is None else float(diagnostics[key])
              for key in DIAGNOSTIC_COLUMNS if not key.startswith("omega_")}
    partners = list(diagnostics.get("omega", {}).values())
    for when in ("first", "mean", "last"):
        values[f"omega_{when}"] = sum(p[when] for p in partners) / len(partners) if partners else math.nan
    return values


def planned_runs(specs: Iterable[RunSpec]) -> dict[str, tuple[int, int]]:
    """Arm name -> (finished runs, planned runs)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for spec in specs:
        counts[spec.arm.name][0] += spec.done
        counts[spec.arm.name][1] += 1
    return {name: (done, planned) for name, (done, planned) in counts.items()}


def collect_rows(specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
    """The rows of the finished runs, each with its arm's finished and planned run counts."""
    counts = planned_runs(specs)
    return [{**row, "arm_runs": counts[spec.arm.name][0], "arm_runs_planned": counts[spec.arm.name][1]}
            for spec in specs if spec.done for row in result_rows(spec, spec.summary())]


def complete_arms(specs: Sequence[RunSpec]) -> set[str]:
    """The arms whose every planned run finished (the only ones a comparison shows unless `allow_partial`)."""
    return {name for name, (done, planned) in planned_runs(specs).items() if done == planned}


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


# -- statistics ---------------------------------------------------------------------------------------


def mean_ci(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the Student-t confidence interval); the half-width is nan for one value."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)


def _by_method_agent(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["method"], row["agent"])].append(row)
    return groups


def summarize(rows: Sequence[dict[str, Any]], *, allow_partial: bool = False) -> list[dict[str, Any]]:
    """Per (method, agent), in first-seen order: seeds (`runs` of `planned`: the rows' `arm_runs_planned`, else
    the rows there are), initial acc, final acc and gain (mean, CI), costs. A group with fewer runs than planned
    has every figure nan (no mean over a part of the seeds) unless `allow_partial`."""
    table = []
    for (method, agent), group in _by_method_agent(rows).items():
        planned = max(int(r.get("arm_runs_planned", len(group))) for r in group)
        if len(group) < planned and not allow_partial:
            table.append({"method": method, "agent": agent, "seeds": len(group), "runs": len(group),
                          "planned": planned, "partial": True,
                          **{key: math.nan for key in ("initial_acc", "final_acc", "final_ci", "gain", "gain_ci",
                                                       "final_reward",
                                                       *_COST_KEYS, *DIAGNOSTIC_COLUMNS)}})
            continue
        final, final_ci = mean_ci([r["final_acc"] for r in group])
        gain, gain_ci = mean_ci([r["final_acc"] - r["initial_acc"] for r in group])
        table.append({
            "method": method, "agent": agent, "seeds": len(group), "runs": len(group), "planned": planned,
            "partial": len(group) < planned,
            "initial_acc": sum(r["initial_acc"] for r in group) / len(group),
            "final_acc": final, "final_ci": final_ci, "gain": gain, "gain_ci": gain_ci,
            "final_reward": _nan_mean([r.get("final_reward", r["final_acc"]) for r in group]),
            **{key: sum(r[key] for r in group) / len(group) for key in _COST_KEYS},
            **{key: _nan_mean([r.get(key, math.nan) for r in group]) for key in DIAGNOSTIC_COLUMNS},
        })
    return table


_COST_KEYS = ("rollouts_generated", "responses_trained", "optimizer_updates", "step_s", "wall_s", "n_agents")


def summarize_collective(rows: Sequence[dict[str, Any]], *, allow_partial: bool = False) -> list[dict[str, Any]]:
    """Per method (arm) with group figures, in first-seen order: each `COLLECTIVE_COLUMNS` figure and the best
    single agent's final accuracy (union - union gain) as (mean, CI) over its runs (seeds), `<figure>` and
    `<figure>_ci`, and `right_wrong`: per (agent, partner) the share of problems the agent gets right and the partner
    wrong at the last evaluation (mean, CI). nan where the arm has fewer runs than planned, unless `allow_partial`."""
    runs: dict[str, dict[Any, list[dict[str, Any]]]] = defaultdict(dict)
    for row in rows:
        runs[row["method"]].setdefault(row["seed"], []).append(row)
    number = lambda row, key: float(row.get(key, math.nan))  # noqa: E731  (rows read back from csv hold strings)
    table = []
    for method, by_seed in runs.items():
        firsts = [run[0] for run in by_seed.values()]  # a run's group figures are on each of its rows
        if all(math.isnan(number(r, "final_union_acc")) for r in firsts):
            continue
        planned = max(int(r.get("arm_runs_planned", len(firsts))) for r in firsts)
        hidden = len(firsts) < planned and not allow_partial
        entry: dict[str, Any] = {"method": method, "runs": len(firsts), "planned": planned,
                                 "partial": len(firsts) < planned}
        per_run = {key: [number(r, key) for r in firsts] for key in COLLECTIVE_COLUMNS}
        per_run["final_best_acc"] = [u - g for u, g in zip(per_run["final_union_acc"], per_run["final_union_gain"])]
        for key, values in per_run.items():
            kept = [v for v in values if not math.isnan(v)]
            entry[key], entry[f"{key}_ci"] = (math.nan, math.nan) if hidden else mean_ci(kept)
        pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
        for run in by_seed.values():
            for row in run:
                for partner, share in json.loads(row.get("final_right_partner_wrong") or "{}").items():
                    pairs[(row["agent"], partner)].append(float(share))
        entry["right_wrong"] = [{"agent": agent, "partner": partner,
                                 **dict(zip(("mean", "ci"), (math.nan, math.nan) if hidden else mean_ci(values)))}
                                for (agent, partner), values in pairs.items()]
        table.append(entry)
    return table


def _nan_mean(values: Sequence[float]) -> float:
    """The mean of the values that are not nan (nan when none is)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def paired_gaps(rows: Sequence[dict[str, Any]], *, reference: str) -> list[dict[str, Any]]:
    """Final accuracy of `reference` minus each other method, per agent, paired by seed (mean, CI). Arms named
    `<group>/<method>` (capability study) are compared with `<group>/<reference>`, within their group only."""
    groups = _by_method_agent(rows)
    gaps = []
    for (method, agent), group in groups.items():
        ref_name = reference_arm(method, reference)
        if method == ref_name or (ref_name, agent) not in groups:
            continue
        ref = {r["seed"]: r["final_acc"] for r in groups[(ref_name, agent)]}
        diffs = [ref[r["seed"]] - r["final_acc"] for r in group if r["seed"] in ref]
        if diffs:
            gap, ci = mean_ci(diffs)
            gaps.append({"reference": ref_name, "method": method, "agent": agent, "seeds": len(diffs),
                         "gap": gap, "gap_ci": ci})
    return gaps


def equal_rollout_gaps(specs: Iterable[RunSpec], *, reference: str) -> list[dict[str, Any]]:
    """The reference's final accuracy minus each other arm's accuracy at the evaluation where that arm had
    generated as many rollouts as the reference did in its whole run (GSPO×2 after half its steps against HACPO
    at the end), per agent, paired by seed. Only arms that generate more rollouts per step, and only when such an
    evaluation exists (the evaluation cadence must hit that count exactly). Groups as in `paired_gaps`."""
    histories: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for spec in specs:
        if spec.done:
            histories[(spec.arm.name, spec.seed)] = spec.summary()["eval_history"]
    diffs: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (name, seed), history in histories.items():
        ref_name = reference_arm(name, reference)
        ref_history = histories.get((ref_name, seed))
        if name == ref_name or not ref_history:
            continue
        for agent, ref_score in ref_history[-1]["scores"].items():
            budget = ref_history[-1]["rollouts_generated"][agent]
            if history[-1]["rollouts_generated"].get(agent, 0) <= budget:
                continue
            same = [h for h in history if h["rollouts_generated"].get(agent) == budget]
            if same:
                diffs[(ref_name, name, agent)].append(ref_score["acc"] - same[0]["scores"][agent]["acc"])
    gaps = []
    for (ref_name, name, agent), values in diffs.items():
        gap, ci = mean_ci(values)
        gaps.append({"reference": ref_name, "method": name, "agent": agent, "seeds": len(values), "gap": gap,
                     "gap_ci": ci})
    return gaps


# -- reports ------------------------------------------------------------------------------------------


def _pm(mean: float, ci: float) -> str:
    return f"{mean:.3f}" if math.isnan(ci) else f"{mean:.3f} ± {ci:.3f}"


def _interval(gap: dict[str, Any]) -> str:
    if math.isnan(gap["gap_ci"]):
        return "n/a"
    return f"[{gap['gap'] - gap['gap_ci']:+.3f}, {gap['gap'] + gap['gap_ci']:+.3f}]"


def _gap_table(gaps: Sequence[dict[str, Any]], heading: str, explanation: str) -> list[str]:
    """A gap table under `## <reference> <heading>` (`each pair's <method>` when arms are grouped in pairs)."""
    if not gaps:
        return []
    references = list(dict.fromkeys(g["reference"] for g in gaps))
    reference = references[0] if len(references) == 1 else f"each pair's {arm_group(references[0])[1]}"
    lines = ["", f"## {reference} {heading}", "", explanation, "", "| reference | method | agent | seeds | gap | 95% interval |",
             "|---|---|---|---:|---:|---|"]
    lines += [f"| {g['reference']} | {g['method']} | {g['agent']} | {g['seeds']} | {g['gap']:+.3f} | {_interval(g)} |"
              for g in gaps]
    return lines


def markdown_report(table: Sequence[dict[str, Any]], gaps: Sequence[dict[str, Any]], *, title: str,
                    notes: Sequence[str] = (), equal_rollout: Sequence[dict[str, Any]] = (),
                    collective: Sequence[dict[str, Any]] = ()) -> str:
    """`results.md`: the per-method table, the paired gaps to the reference (at the end of the runs, and at an
    equal number of rollouts generated), the agents together (`summarize_collective`), and the diagnostics."""
    weighted = any(not math.isnan(r.get("final_reward", math.nan)) and r.get("final_reward") != r["final_acc"]
                   for r in table)
    reward_head, reward_rule = (" final reward |", "---:|") if weighted else ("", "")
    lines = [f"# {title}", "", *notes, "" if notes else "",
             "Final held-out accuracy: the verifier's (the reward's first term: right or wrong), mean over seeds ± "
             "half-width of the 95% Student-t interval. "
             "Gain = final − initial accuracy of the same agent, per seed. Costs are per agent per run. Runs: "
             "the finished runs (seeds) each mean rests on, of those planned; a run that was interrupted or "
             "failed is no result." + (" Final reward: the mean weighted `data.rewards` sum on the same answers "
                                        "(it may exceed 1)." if weighted else ""), "",
             "| method | agent | runs | initial acc | final acc | gain |" + reward_head + " rollouts generated | "
             "responses trained | updates | s/step |",
             "|---|---|---:|---:|---:|---:|" + reward_rule + "---:|---:|---:|---:|"]
    for r in table:
        runs = f"{r['runs']} of {r['planned']}"
        if r.get("partial") and math.isnan(r["final_acc"]):
            lines.append(f"| {r['method']} | {r['agent']} | {runs} | – | no mean: {runs} planned runs finished "
                         "(allow_partial=true shows it) | – |" + (" – |" if weighted else "") + " – | – | – | – |")
            continue
        runs += " (partial)" if r.get("partial") else ""
        lines.append(f"| {r['method']} | {r['agent']} | {runs} | {r['initial_acc']:.3f} | "
                     f"{_pm(r['final_acc'], r['final_ci'])} | {_pm(r['gain'], r['gain_ci'])} | "
                     + (f"{r.get('final_reward', math.nan):.3f} | " if weighted else "") +
                     f"{r['rollouts_generated']:.0f} | {r['responses_trained']:.0f} | {r['optimizer_updates']:.0f} | "
                     f"{r['step_s']:.2f} |")
    lines += _gap_table(gaps, "minus each method (final accuracy, paired by seed)",
                        "Positive: the reference is better. The interval excludes 0 when the gap is significant at 95%.")
    lines += _gap_table(equal_rollout, "minus each method at an equal number of rollouts generated",
                        "The reference's final accuracy minus the method's accuracy at the evaluation where it had "
                        "generated as many rollouts as the reference's whole run (e.g. GSPO×2 after half its steps).")
    return "\n".join(lines + _collective_table(collective) + _diagnostics_table(table)) + "\n"


def _collective_table(collective: Sequence[dict[str, Any]]) -> list[str]:
    """results.md's section on the agents together (`summarize_collective`; none without group figures)."""
    if not collective:
        return []
    lines = ["", "## The agents together (held-out, last evaluation)", "",
             "From each agent's greedy answer to each held-out problem, compared by boxed answer (collective.py), "
             "mean over seeds ± half-width of the 95% Student-t interval. Union: some agent is right; majority: the "
             "most-given answer is right (a tie for the most votes is no majority and counts as wrong; tied: the "
             "share of such problems); gains are over the best single agent of the same run.", "",
             "| method | runs | best single | union | union gain | majority | majority gain | tied |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = ("final_best_acc", "final_union_acc", "final_union_gain", "final_majority_acc", "final_majority_gain",
            "final_majority_tied")
    for r in collective:
        runs = f"{r['runs']} of {r['planned']}" + (" (partial)" if r["partial"] else "")
        cells = " | ".join("–" if math.isnan(r[key]) else _pm(r[key], r[f"{key}_ci"]) for key in keys)
        lines.append(f"| {r['method']} | {runs} | {cells} |")
    lines += ["", "Complementarity: the share of held-out problems the agent gets right and the partner wrong.", "",
              "| method | agent | partner | right, partner wrong |", "|---|---|---|---:|"]
    lines += [f"| {r['method']} | {p['agent']} | {p['partner']} | "
              f"{'–' if math.isnan(p['mean']) else _pm(p['mean'], p['ci'])} |" for r in collective for p in r["right_wrong"]]
    return lines


def _diagnostics_table(table: Sequence[dict[str, Any]]) -> list[str]:
    """results.md's diagnostics section (mean over seeds of each run's mean over steps; '-': not measured)."""
    if not table or all(math.isnan(r.get(key, math.nan)) for r in table for key in DIAGNOSTIC_COLUMNS):
        return []
    shown = lambda v: "-" if math.isnan(v) else f"{v:.3f}"  # noqa: E731
    lines = ["", "## Diagnostics (why a method helps or not)", "",
             "Mean over seeds of each run's mean over steps (docs/training.md#diagnostics). No-gradient: the "
             "fraction of the learner's own or partners' correct / wrong responses that the clip leaves "
             "without gradient. Cross share: ‖g_cross‖ / (‖g_self‖ + ‖g_cross‖) of the step's gradient; "
             "cos: cosine between the two parts; ω: factor on partners' responses (mean over partners) at the "
             "first step, over all steps and at the last step. '-': not measured.", "",
             "| method | agent | cross no-grad, correct | cross no-grad, wrong | own no-grad, correct "
             "| own no-grad, wrong | cross grad share | cos(self, cross) | ω first | ω mean | ω last |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        cells = " | ".join(shown(r.get(key, math.nan)) for key in DIAGNOSTIC_COLUMNS)
        lines.append(f"| {r['method']} | {r['agent']} | {cells} |")
    return lines


def accuracy_curves(specs: Iterable[RunSpec]) -> dict[tuple[str, str], list[tuple[list[int], list[float]]]]:
    """(method, agent) -> per seed, (rollouts generated by the agent, held-out accuracy) at each evaluation."""
    curves: dict[tuple[str, str], list[tuple[list[int], list[float]]]] = defaultdict(list)
    for spec in specs:
        if not spec.done:
            continue
        history = spec.summary()["eval_history"]
        for agent in history[0]["scores"]:
            curves[(spec.arm.name, agent)].append(([h["rollouts_generated"][agent] for h in history],
                                                   [h["scores"][agent]["acc"] for h in history]))
    return curves


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Lay out, write `path` (its folder created) and close the figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_accuracy_vs_rollouts(curves: dict[tuple[str, str], list[tuple[list[int], list[float]]]], path: Path) -> Path:
    """One panel per agent: mean held-out accuracy over seeds (line) and its 95% interval (band)."""
    plt = _pyplot()
    agents = list(dict.fromkeys(agent for _, agent in curves))
    fig, axes = plt.subplots(1, len(agents), figsize=(5.5 * len(agents), 4), squeeze=False)
    for ax, agent in zip(axes[0], agents):
        for (method, name), runs in curves.items():
            if name != agent:
                continue
            length = min(len(x) for x, _ in runs)
            xs = runs[0][0][:length]
            stats = [mean_ci([acc[i] for _, acc in runs]) for i in range(length)]
            means = [m for m, _ in stats]
            half = [0.0 if math.isnan(c) else c for _, c in stats]
            ax.plot(xs, means, marker="o", markersize=3, label=method)
            ax.fill_between(xs, [m - h for m, h in zip(means, half)], [m + h for m, h in zip(means, half)], alpha=0.15)
        ax.set_title(agent)
        ax.set_xlabel("rollouts generated by this agent")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_final_accuracy(table: Sequence[dict[str, Any]], path: Path) -> Path:
    """Grouped bars: final accuracy per method (groups) and agent (bars), 95% interval as error bars."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in table))
    agents = list(dict.fromkeys(r["agent"] for r in table))
    cell = {(r["method"], r["agent"]): r for r in table}
    width = 0.8 / len(agents)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(methods) * len(agents) / 2 + 2), 4))
    for a, agent in enumerate(agents):
        xs = [m + (a - (len(agents) - 1) / 2) * width for m in range(len(methods))]
        rows = [cell.get((method, agent)) for method in methods]
        heights = [r["final_acc"] if r else 0.0 for r in rows]
        errors = [0.0 if not r or math.isnan(r["final_ci"]) else r["final_ci"] for r in rows]
        bars = ax.bar(xs, heights, width, yerr=errors, capsize=3, label=agent)
        initial = [r["initial_acc"] for r in rows if r]
        if initial:
            ax.axhline(sum(initial) / len(initial), color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1)
    ax.set_xticks(range(len(methods)), methods, rotation=20)
    ax.set_ylabel("final held-out accuracy (dashed: initial)")
    ax.set_ylim(0.0, 1.0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_step_time(table: Sequence[dict[str, Any]], path: Path) -> Path:
    """Scaling: seconds per training step and responses trained per agent, per arm."""
    plt = _pyplot()
    methods = list(dict.fromkeys(r["method"] for r in table))
    first = {m: next(r for r in table if r["method"] == m) for m in methods}
    trained = {m: sum(r["responses_trained"] for r in table if r["method"] == m) / max(1, first[m]["n_agents"])
               for m in methods}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(methods, [first[m]["step_s"] for m in methods])
    left.set_ylabel("seconds per training step")
    right.bar(methods, [trained[m] for m in methods], color="tab:orange")
    right.set_ylabel("responses trained per agent per run")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def plot_gap_vs_capability(table: Sequence[dict[str, Any]], gaps: Sequence[dict[str, Any]], path: Path, *,
                           reference: str = "hacpo") -> Path:
    """Capability study: one panel per compared method, the paired gap `reference − method` (95% interval as
    error bars) of each agent of a pair against the pair's difference in starting accuracy (partner − first)."""
    plt = _pyplot()
    initial = {(r["method"], r["agent"]): r["initial_acc"] for r in table}
    others = list(dict.fromkeys(arm_group(g["method"])[1] for g in gaps))
    fig, axes = plt.subplots(1, max(1, len(others)), figsize=(5.5 * max(1, len(others)), 4), squeeze=False)
    for ax, other in zip(axes[0], others):
        points: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for g in gaps:
            group, method = arm_group(g["method"])
            if method != other:
                continue
            agents = group.split("+")
            if len(agents) != 2 or any((g["reference"], a) not in initial for a in agents):
                continue
            spread = initial[(g["reference"], agents[1])] - initial[(g["reference"], agents[0])]
            role = "first agent" if g["agent"] == agents[0] else "partner"
            points[role].append((spread, g["gap"], 0.0 if math.isnan(g["gap_ci"]) else g["gap_ci"]))
        for offset, (role, values) in zip((-0.004, 0.004), sorted(points.items())):
            values.sort()
            ax.errorbar([x + offset for x, _, _ in values], [y for _, y, _ in values],
                        yerr=[c for _, _, c in values], marker="o", capsize=3, label=role)
        ax.axhline(0.0, color="grey", linewidth=1)
        ax.set_title(f"{reference} − {other}")
        ax.set_xlabel("starting accuracy: partner − first agent")
        ax.set_ylabel("final accuracy gap (95% interval)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)
