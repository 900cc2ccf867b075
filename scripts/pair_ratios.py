"""A pair's cross ratios before a run is spent on it: how likely each agent finds its partners' responses, against
the bounds HACPO clamps the ratio to, without training.

    python scripts/pair_ratios.py agents=[tiny_a,tiny_b]
    python scripts/pair_ratios.py agents=[tiny_qwen3,tiny_llama32] data.prompts_per_step=16 rollout.group_size=4
    python scripts/pair_ratios.py experiment=paper_smoke run_dir=runs/pair_check --json ratios.json

Takes scripts/train.py's overrides, composed and checked the same way (`hacrl_lightning.cli`). Every agent answers
the run's first step's prompts (`data.prompts_per_step`, `rollout.group_size` responses each, sampled as the run
would: the same engines, rewards and exchange), and every other agent scores each response in its own tokens
(`pair_ratios.score_pair`): s = π_learner(y) / π_source(y), length-normalised (docs/spec.md §6), as the first update
of a run's first step would see it. Prints, per learner and source, the quantiles of log s and the shares below,
inside and above the bounds of the clip schedule's first mini-batch, [1 - algorithm.delta, 1] (the widest of a
step), of every response and of the correct ones; writes the same as JSON (--json PATH; default
<run_dir>/pair_ratios.json). During a run the same ratios are logged on the diagnostics steps
(docs/training.md#diagnostics). Flags: --json PATH, --cfg job (print the composed config), -h/--help. Exit status:
0, or 2 for a bad config or flag.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from hacrl_lightning.cli import compose_config, parse_cli, wants_help
from hacrl_lightning.errors import ConfigError


def take_json(args: list[str]) -> tuple[list[str], str | None]:
    """`--json PATH` out of args (None when absent); `ValueError` with the fix when PATH is missing."""
    if "--json" not in args:
        return args, None
    i = args.index("--json")
    if i + 1 >= len(args) or args[i + 1].startswith("-"):
        raise ValueError("--json takes a file name, e.g. --json pair_ratios.json")
    return args[:i] + args[i + 2:], args[i + 1]


def table(report: dict) -> str:
    """The report as a plain table: one line per learner and source."""
    bounds = report["bounds"]
    lines = [f"pair ratios: {', '.join(report['agents'])} on {report['prompts']} prompts x "
             f"{report['samples_per_prompt']} responses ({report['data']}, seed {report['seed']}); accuracy "
             + ", ".join(f"{name} {acc:.3f}" for name, acc in report["accuracy"].items()),
             f"log s = log pi_learner(y) - log pi_source(y) (length-normalised); bounds of mini-batch 0: "
             f"[{bounds['lower']:g}, {bounds['upper']:g}] = log [{_log(bounds['lower']):+.3f}, 0]",
             f"{'learner':<16} {'source':<16} {'rows':>5}  {'q05':>7} {'q25':>7} {'median':>7} {'q75':>7} {'q95':>7}  "
             f"{'below':>6} {'inside':>6} {'above':>6}  {'correct':>7} {'below':>6} {'inside':>6} {'above':>6}"]
    for learner, sources in report["pairs"].items():
        for source, row in sources.items():
            q, s, c = row["log_ratio"], row["shares"], row["shares_correct"]
            quantiles = " ".join(f"{q[key]:+7.3f}" for key in ("q05", "q25", "q50", "q75", "q95"))
            shares = " ".join(f"{s[key]:6.2f}" for key in ("below", "inside", "above"))
            correct = " ".join(f"{c[key]:6.2f}" if c else f"{'-':>6}" for key in ("below", "inside", "above"))
            lines.append(f"{learner:<16} {source:<16} {row['rows']:>5}  {quantiles}  {shares}  {row['correct']:>7} "
                         f"{correct}")
    return "\n".join(lines)


def _log(value: float) -> float:
    import math

    return math.log(value) if value > 0 else float("-inf")


def main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    try:
        args, json_path = take_json(list(argv))
        overrides, show = parse_cli(args)
        cfg, dcfg = compose_config(overrides, preflight=not show)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if show:
        print(OmegaConf.to_yaml(dcfg, resolve=True), end="")
        return 0
    if len(cfg.agents) < 2:
        print(f"error: agents: got {list(cfg.agents)}; allowed: two agents or more (each scores the others' answers); "
              "fix: e.g. agents=[tiny_a,tiny_b]", file=sys.stderr)
        return 2
    from hacrl_lightning.pair_ratios import score_pair
    from hacrl_lightning.files import write_atomically

    report = score_pair(cfg)["report"]
    print(table(report))
    path = Path(json_path).expanduser() if json_path else Path(cfg.run_dir) / "pair_ratios.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(report, indent=2) + "\n")
    print(f"pair ratios: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
