# Two commands do all the set-up on a fresh machine:
#   make demo   # creates .venv if missing, then runs shardkit's main job
#   make test   # creates .venv if missing, then lints and runs the test suite
# TORCH_INDEX=https://download.pytorch.org/whl/cpu make test   # where pip has no local CPU wheel

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
STAMP := $(VENV)/.shardkit-installed

.PHONY: demo test lint typecheck bench-comm clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PIP_EXTRA) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardkit train

test: $(STAMP) lint
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

bench-comm: $(STAMP)
	$(VENV)/bin/shardkit bench comm --world-size 2 --json benchmarks/results/comm_gloo_2ranks.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
