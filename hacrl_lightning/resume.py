"""What a resume may change: the run's saved config (`run_config.json`) against the new command's.

A resumed run must be the run it continues: a change of anything that shapes the training (agents,
algorithm, batch sizes, data, seeds, precision, the number of ranks) is refused, naming every
differing key. What only affects how the run is watched or kept may change, and is recorded:
logging and evaluation cadence, checkpoint cadence, exports, the non-finite tolerance, the reward
pool's worker count, memory knobs that do not change the math (gradient checkpointing, vLLM's
memory share), and `trainer.steps` (a larger value extends a finished run). Pure: no file is read
here (`training.train` reads `run_config.json` and passes it in). Deliberately not here: which
checkpoint is resumed (`callbacks.checkpoint.resume_checkpoint`) and the run directory (`run_dir`).
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
    if old_agents != new_agents:  # one problem for the set (and order: it is the optimizer order), not per field
        problems.append(Problem("agents", new_agents, f"{old_agents}, the agents the run was started with",
                                f"resume with agents=[{','.join(old_agents)}], or start a new run (another run_dir)"))
    for key in sorted(old.keys() | now.keys()):
        before, after = old.get(key, _implied(implied, key)), now.get(key, "<absent>")
        if before == after or key in location or (key.startswith("agents.") and old_agents != new_agents):
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
