# The two commands a newcomer needs (README): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch that lies on this machine's disk; a plain `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test bench install

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) scripts/train.py

test: $(STAMP)
	$(PY) -m pytest -q --durations=15

bench: $(STAMP)
	$(PY) scripts/bench.py step --json bench.json
