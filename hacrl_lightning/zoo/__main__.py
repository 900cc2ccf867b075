"""The zoo's command line: `python -m hacrl_lightning.zoo build|list|verify|ship` (the package's docstring)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Sequence

from hacrl_lightning.agents.cache import DEFAULT_CACHE, ENV_CACHE
from hacrl_lightning.zoo.builder import built_on
from hacrl_lightning.zoo.presets import PRESETS, get_spec
from hacrl_lightning.zoo import store
from hacrl_lightning.zoo.store import MANIFEST, _accuracy, ensure_built, entry_dir, read_manifest, ship, shipped_manifest, \
    verify


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hacrl_lightning.zoo",
                                     description="The offline tiny-agent zoo: build, list, verify or ship presets.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="build a preset (cached) and copy it to --out as a standalone HF dir")
    build_cmd.add_argument("name", choices=sorted(PRESETS))
    build_cmd.add_argument("--out", required=True, help="directory to write (created; must not hold other files)")
    build_cmd.add_argument("--cache", default=None, help=f"zoo cache (default ${ENV_CACHE} or {DEFAULT_CACHE})")
    list_cmd = commands.add_parser("list", help="presets, their cache entries and measured facts")
    list_cmd.add_argument("--cache", default=None)
    verify_cmd = commands.add_parser("verify", help="rebuild presets from their recipes here and compare them "
                                                    "with the shipped builds (exit 1 on any difference)")
    verify_cmd.add_argument("names", nargs="*", metavar="name", help="default: every shipped preset")
    ship_cmd = commands.add_parser("ship", help="build presets from their recipes and make the builds the shipped "
                                                f"ones (in {store.SHIPPED}; for a changed recipe, commit them with it)")
    ship_cmd.add_argument("names", nargs="+", choices=sorted(n for n in PRESETS if PRESETS[n].warm_start.steps),
                          metavar="name")
    args = parser.parse_args(argv)
    if args.command == "ship":
        for name in args.names:
            facts = ship(name)
            print(f"{name}: shipped to {store.SHIPPED / name} (held-out {_accuracy(facts)}, {facts['steps']} steps)")
        return 0
    if args.command == "verify":
        names = args.names or sorted(p.name for p in store.SHIPPED.iterdir() if (p / MANIFEST).is_file())
        for name in names:
            try:
                get_spec(name)
            except KeyError as error:
                parser.error(error.args[0])
        problems = [problem for name in names for problem in verify(name)]
        for problem in problems:
            print(f"DIFFERS {problem}")
        print(f"{len(names) - len({p.split(':')[0] for p in problems})} of {len(names)} presets rebuild to the "
              f"shipped bytes on this machine ({built_on()})")
        if problems:
            print("A build depends on this CPU's floating-point rounding; the shipped weights are the reference "
                  "(docs/agents.md). If you changed a recipe, `ship` it.", file=sys.stderr)
        return 1 if problems else 0
    if args.command == "build":
        source = ensure_built(args.name, cache_dir=args.cache)
        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            parser.error(f"--out {out} exists and is not empty; choose a new directory")
        shutil.copytree(source, out, dirs_exist_ok=True)
        print(out)
        return 0
    for name, spec in PRESETS.items():
        manifest = read_manifest(entry_dir(name, args.cache))
        facts = manifest["facts"] if manifest else {}
        origin = "shipped" if shipped_manifest(spec) is not None else "built here"
        state = (f"{facts['parameters']:,} params, vocab {facts['vocab_size']:,}, acc {_accuracy(facts)} "
                 f"({origin})") if facts else f"not in the cache ({origin} on first use)"
        print(f"{name:12s} {spec.model_type:8s} tokenizer={spec.tokenizer.label:33s} "
              f"steps={spec.warm_start.steps:<5d} {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
