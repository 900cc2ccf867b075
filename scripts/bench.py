"""Benchmarks that print figures (never asserted by tests).

    python scripts/bench.py rollout [--agents tiny_a,tiny_b,tiny_c] [--prompts 16] [--group 8]
                                    [--max-new-tokens 24] [--repeats 3] [--backend hf|vllm|all]
    python scripts/bench.py step [--n 2,3,4] [--groups 4,8,16] [--steps 3] [--json bench.json]

    python scripts/bench.py rewards [--items 1000] [--adversarial 10] [--workers 1 2] [--timeout 2]

    python scripts/bench.py exchange [--agents tiny_qwen3,tiny_llama32] [--synthetic 500] [--stress 200]

    python scripts/bench.py sync [--agents tiny_b,tiny_qwen3] [--methods file,shared_memory] [--bucket-mb 256] [--ranks 2]

`rollout`: generation throughput per agent and backend (tokens/s, responses/s) on prompts of the
synthetic task, with the prompt count, G and lengths printed beside the figures. The vLLM backend
is measured only where vllm and a GPU are present.
`rewards`: math_verify items/s in-process and through RewardPool with 1 and 2 workers, on ordinary
answers and on the same mixed with hostile ones (each of those costs a worker the timeout).

`step`: full framework HACPO training steps against a bare PyTorch + transformers loop doing the
same work (`hacrl_lightning/bench/step.py`), with the per-phase breakdown, tokens/s, peak RSS, and
scaling in n and G; figures in docs/PERFORMANCE.md.

`exchange`: partners' responses crossing between two agents' tokenizers, both directions (by
default the paper's real Qwen3 and Llama 3.2 tokenizers): rows exact or marked, and why, on the
math fixtures' texts, synthetic answers and stress texts (`hacrl_lightning/bench/exchange.py`);
figures in docs/agents.md.

`sync`: a vLLM engine's weight sync in its own process, through the safetensors file and through shared-memory
buckets: seconds per sync and the extra memory of a sync in the trainer and the engine (`hacrl_lightning/bench/sync.py`).

This file is the command line only: each subcommand is a module of `hacrl_lightning.bench`
(`add_arguments`, `run`, `print_report`); the figures are printed, and written as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hacrl_lightning.bench import exchange, rewards, rollout, step, sync

COMMANDS = {
    "rollout": (rollout, "generation tokens/s per agent and backend"),
    "rewards": (rewards, "math_verify items/s in-process and through RewardPool"),
    "step": (step, "framework HACPO step vs a bare loop: phases, tokens/s, RSS, n and G scaling"),
    "exchange": (exchange, "responses crossing two agents' tokenizers: rows exact or marked"),
    "sync": (sync, "vLLM weight sync per method (file, shared memory): seconds and extra memory per sync"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    module = COMMANDS[args.command][0]
    result = module.run(args)
    module.print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        if args.command == "step":
            print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
