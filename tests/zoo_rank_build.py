"""A zoo build and a GGUF conversion on rank 1 of 2 gloo ranks (torch's launcher starts both): rank 1 builds a
quick preset into the cache and, given a GGUF file, converts it into `<cache dir>/converted`; rank 0 waits.
tests/test_zoo.py and tests/test_packaged_model.py read what was written (one launch for both: tests/conftest.py's
`rank_one_builds`). transformers (v5) writes a model only on
global rank 0 once torch.distributed is up, so rank 1's build cached an entry with no config or weights.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/zoo_rank_build.py <cache dir> [<gguf file>]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from hacrl_lightning import zoo


def main(cache: str, gguf: str | None = None) -> None:
    dist.init_process_group("gloo")
    base = zoo.PRESETS["tiny_c"]  # the quick preset of tests/test_zoo.py: a few warm-start steps
    zoo.PRESETS["quick"] = replace(base, name="quick", warm_start=replace(base.warm_start, steps=4, eval_every=2,
                                                                          probe_size=8, pool_size=64))
    zoo.builder.HELDOUT_SIZE = 16
    if dist.get_rank() == 1:
        zoo.ensure_built("quick", cache_dir=cache)
        if gguf:
            from hacrl_lightning.agents.packaged import convert_gguf

            convert_gguf(Path(gguf), Path(cache) / "converted")
    dist.barrier()
    print(f"ZOO-RANK-DONE {dist.get_rank()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
