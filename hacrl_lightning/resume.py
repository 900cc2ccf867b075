"""What a resume may change: the run's saved config (`run_config.json`) against the new command's.

A resumed run must be the run it continues: a change of anything that shapes the training (agents,
algorithm, batch sizes, data, seeds, precision, the number of ranks) is refused, naming every
differing key. What only affects how the run is watched or kept may change, and is recorded:
logging and evaluation cadence, checkpoint cadence, exports, the non-finite tolerance, the reward
pool's worker count, memory knobs that do not change the math (gradient checkpointing, vLLM's
memory share), and `trainer.steps` (a larger value extends a finished run). Another agent set only with
`resume_agents=change` (on one device): the kept agents' own settings are still compared, and
`adapt_checkpoint` gives the checkpoint the new set's layout as it loads (each kept agent's state as saved,
each new one's fresh). Pure: no file is read here (`training.train` reads `run_config.json` and passes it
in). Deliberately not here: which checkpoint is resumed (`callbacks.checkpoint.resume_checkpoint`) and the
run directory (`run_dir`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

from hacrl_lightning.config import TrainConfig, flat_values, implied_values, setting_keys
from hacrl_lightning.errors import Problem

def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain data (what `run_config.json` holds)."""
    return dataclasses.asdict(cfg)


def resume_changes(saved: dict[str, Any], new: TrainConfig, *, at_step: int,
                   completed: bool) -> tuple[list[Problem], dict[str, tuple[Any, Any]]]:
    """(the refused changes, the allowed ones as key -> (old, new)) of resuming the run saved as `saved`
    from its checkpoint at step `at_step` with `new`; `completed`: that run had finished."""
    old, now = flat_values(saved), flat_values(new)
    root = type(new)  # the facts of its own fields (a config class with a field added picks it up)
    harmless, implied, location = setting_keys("harmless", root), implied_values(root), setting_keys("location", root)
    problems, allowed = [], {}
    old_agents, new_agents = list(saved.get("agents", {})), list(new.agents)
    kept, added, dropped = agent_change(old_agents, new_agents)
    unmatched: set[str] = set()  # agents whose own settings are not compared
    if old_agents != new_agents:  # one problem for the set (and order: it is the optimizer order), not per field
        problem = _agents_problem(old_agents, new, kept)
        problems += [problem] if problem else []
        unmatched = set(old_agents) | set(new_agents) if problem else set(added) | set(dropped)
        if not problem:
            allowed["agents"] = (old_agents, new_agents)
    for key in sorted(old.keys() | now.keys()):
        before, after = old.get(key, _implied(implied, key)), now.get(key, "<absent>")
        if before == after or key in location or (key.startswith("agents.") and key.split(".")[1] in unmatched):
            continue
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in harmless):
            allowed[key] = (before, after)
            continue
        problems.append(Problem(key, after, f"{before!r}, the value the run was started with",
                                f"resume with {key}={_shown(before)}, or start a new run (another run_dir) "
                                "to train with the new value"))
    if new.trainer.steps < at_step or (new.trainer.steps == at_step and completed):
        wanted = "a larger value to extend it" if completed else f">= {at_step}"
        problems.append(Problem("trainer.steps", new.trainer.steps, f"{wanted} (the checkpoint is at step {at_step}"
                                + (", the run has finished)" if completed else ")"),
                                f"set trainer.steps={at_step + 1 if completed else at_step} or more"))
    return problems, allowed


def agent_change(old: list[str], new: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(kept, added, dropped) agents of a run of agents `old` resumed with agents `new` (kept and added in the
    new order, dropped in the old)."""
    return [n for n in new if n in old], [n for n in new if n not in old], [n for n in old if n not in new]


def _agents_problem(old: list[str], new: TrainConfig, kept: list[str]) -> Problem | None:
    """Why the run of agents `old` cannot resume with `new.agents` (None: `resume_agents=change` allows it)."""
    names, again = list(new.agents), f"resume with agents=[{','.join(old)}]"
    if new.resume_agents != "change":
        return Problem("agents", names, f"{old}, the agents the run was started with (another set needs "
                       "resume_agents=change)", f"{again}; or add resume_agents=change to add or drop agents (each "
                       "kept agent continues exactly, a new one starts from its preset); or start a new run")
    if not kept:
        return Problem("agents", names, f"at least one of the run's agents {old} (resume_agents=change keeps them)",
                       f"{again} and the agents to add, or start a new run (another run_dir)")
    if new.trainer.strategy == "fsdp" and new.trainer.placement != "split":
        return Problem("resume_agents", "change", "a run on one device, or under trainer.placement=split: a "
                       "distributed checkpoint whose ranks each hold every agent resumes with its own agents",
                       f"{again}, or start a new run from the run's exports (agents.<key>.model=<run>/exports/<key>)")
    return None


def adapt_checkpoint(checkpoint: dict[str, Any], names: list[str], *, weights: dict[str, Any],
                     optimizers: dict[str, Any], schedules: dict[str, Any], counters: dict[str, Any]) -> dict[str, Any]:
    """Lightning's `checkpoint` given the layout of the agents `names` (`resume_agents=change`):
    each kept agent's weights, optimizer state, LR schedule, counters, non-finite streak and diagnostics as
    saved; each new agent's weights from `weights` (the new run's module `state_dict`, its agents loaded from
    their presets) and its optimizer state, LR schedule and counters from `optimizers`, `schedules` and
    `counters` (fresh ones, by agent); a dropped agent's entries left out (they stay in the file, which is only
    read). The callbacks' states are theirs to map (`CapabilityCallback.load_state_dict`). Changes `checkpoint`
    in place and returns it. Under `trainer.placement=split` the strategy has read the weights, optimizer states and
    LR schedules itself (`strategies.SplitStrategy`): a checkpoint without `state_dict` maps the rest."""
    state = checkpoint["hacrl"]
    index = {name: i for i, name in enumerate(state["agents"])}

    def owner(key: str) -> str | None:  # `agents.<name>.…` and `references.<name>.…` belong to an agent
        part = key.split(".", 2)
        return part[1] if part[0] in ("agents", "references") and len(part) == 3 else None

    if "state_dict" in checkpoint:
        saved = checkpoint["state_dict"]
        checkpoint["state_dict"] = {key: value for key, value in saved.items()
                                    if owner(key) is None or owner(key) in names}
        checkpoint["state_dict"].update({key: value for key, value in weights.items()
                                         if owner(key) in names and owner(key) not in index})
        for key, fresh in (("optimizer_states", optimizers), ("lr_schedulers", schedules)):
            checkpoint[key] = [checkpoint[key][index[name]] if name in index else fresh[name] for name in names]
    state["counters"] = {name: state["counters"][name] if name in index else counters[name] for name in names}
    state["fault_streak"] = {name: state.get("fault_streak", {}).get(name, 0) for name in names}
    state["diagnostics"] = {key: pairs for key, pairs in state.get("diagnostics", {}).items()
                            if key.split("/", 1)[0] in names}
    state["agents"] = list(names)
    return checkpoint


def _implied(implied: dict[str, Any], key: str) -> Any:
    """The value a run saved before setting `key` existed trained with (patterns: `agents.*.ranks`)."""
    if key in implied:
        return implied[key]
    return next((value for pattern, value in implied.items() if fnmatch.fnmatchcase(key, pattern)), "<absent>")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
