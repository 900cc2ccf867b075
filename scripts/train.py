"""The main job: train N heterogeneous agents together with HACPO (or a baseline).

    python scripts/train.py                                  # two tiny zoo agents, HACPO, synthetic task
    python scripts/train.py agents=[tiny_a,tiny_b,tiny_c]    # three agents
    python scripts/train.py agents.tiny_b.lr=3e-4            # per-agent override
    python scripts/train.py algorithm=gspo_x2                # a baseline
    python scripts/train.py --cfg job                        # print the composed config and exit
    python scripts/train.py resume=runs/x                    # continue the run in runs/x from its newest checkpoint

Composes and validates the configuration, files and tokenizers included, before any model is
loaded (every problem reported at once, exit status 2; docs/reliability.md), saves
the resolved config in the run directory, trains, exports each agent and prints a final table.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C in the first seconds (imports, checks): one line, nothing written
    from hacrl_lightning.console import exit_on_interrupt

    exit_on_interrupt("interrupted before training started; nothing was written")

from omegaconf import OmegaConf  # noqa: E402

from hacrl_lightning.cli import (GROUPS, TRAIN_SETTINGS, compose_config, help_text, help_topic, parse_cli,  # noqa: E402
                                 settings_text, shell_override, shell_word, wants_help)
from hacrl_lightning.errors import ConfigError, RunFailed  # noqa: E402


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    finally:
        from hacrl_lightning.placement import end_process_group

        end_process_group()


def _main(argv: list[str]) -> int:
    started = time.time()
    if wants_help(argv):
        try:
            topic = help_topic(argv)
            print(settings_text(topic, TRAIN_SETTINGS) if topic else help_text(__doc__, groups=GROUPS, topics=TRAIN_SETTINGS))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        overrides, show = parse_cli(argv)
        cfg, dcfg = compose_config(overrides, preflight=not show)  # files and tokenizers too, before any model
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if show:
        print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
        return 0
    # imported once the config is good, so a bad one is reported without loading Lightning and the models' code
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from hacrl_lightning.agents.agent import AgentLoadError
    from hacrl_lightning.callbacks.interrupt import RunInterrupted
    from hacrl_lightning.training import train

    print(f"run directory: {Path(cfg.run_dir).resolve()}")
    print(f"agents: {', '.join(cfg.agents)} | algorithm: {cfg.algorithm.name} | steps: {cfg.trainer.steps}")
    try:
        summary = train(cfg, started=started, config_yaml=OmegaConf.to_yaml(dcfg, resolve=True))
    except (ConfigError, AgentLoadError, FileNotFoundError, KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunFailed as err:  # a fault the message names (non-finite losses, a full disk): checkpoints intact
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as err:
        print(f"{err}: stopped before training started; nothing was written", file=sys.stderr)
        return 128 + err.signum
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the start-up message no longer holds
    if rank_zero_only.rank != 0:  # one report, not one per data-parallel rank
        return 0
    if summary["status"] == "interrupted":
        again = [shell_word(o) for o in overrides if not o.startswith(("resume=", "overwrite="))]
        again.append(shell_override("resume", summary["run_dir"]))  # one shell word that Hydra reads back as the path
        print(f"interrupted ({summary['signal'] or 'stopped'}) after step {summary['steps']} of "
              f"{summary['steps_wanted']}; newest checkpoint: {summary['last_checkpoint']}\n"
              f"continue with: python scripts/train.py {' '.join(again)}", file=sys.stderr)
        return 128 + signal.Signals[summary["signal"]].value if summary["signal"] else 1
    print_summary(summary)
    return 0


def print_summary(summary: dict) -> None:
    """The final table: held-out accuracy (greedy decoding) before and after, and the cost of each agent."""
    rows = [("agent", "held-out acc (greedy) before", "held-out acc (greedy) after", "rollouts", "trained on", "updates")]
    for name, row in summary["agents"].items():
        rows.append((name, f"{row['initial'].get('acc', float('nan')):.3f}", f"{row['final'].get('acc', float('nan')):.3f}",
                     str(row["rollouts_generated"]), str(row["responses_trained"]), str(row["optimizer_updates"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)))
    print(f"{summary['steps']} steps in {summary['wall_s']:.1f} s; summary: {summary['run_dir']}/summary.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
