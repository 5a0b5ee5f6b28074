# Two commands do all the set-up on a fresh machine:
#   make demo   # creates .venv if missing, then runs shardkit's main job
#   make test   # creates .venv if missing, then lints, type-checks and runs the test suite
# TORCH_INDEX=https://download.pytorch.org/whl/cpu make test   # where pip has no local CPU wheel

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
STAMP := $(VENV)/.shardkit-installed

.PHONY: demo test test-slow test-programs test-gpu bench-gpu check-cuda-build lint typecheck bench-comm clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PIP_EXTRA) -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/shardkit train

test: $(STAMP) lint typecheck
	$(PY) -m pytest

# The programs tier: user programs written from TorchRec's and torch's docs, run on TorchRec
# (the peers venv, ../shared/peers/setup.sh) and on shardkit, figures compared (~15 min).
test-programs: $(STAMP)
	$(PY) -m pytest -m programs tests/programs

# The slow tier: end-to-end examples, the benchmarks' smoke runs and CLI pipelines (~7 min);
# `make test` skips it to stay within its 15 minutes on 2 cores.
test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# The GPU tier (tests marked gpu: the sharded-vs-unsharded, FSDP and checkpoint bodies on CUDA
# with NCCL). Without CUDA every one of them skips, with one summary line.
test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu

# GPU benchmarks, one command each part; TorchRec's side needs its CUDA build in this venv.
bench-gpu: $(STAMP)
	$(PY) benchmarks/bench_ebc.py --device cuda --sweep --out benchmarks/results/ebc_cuda.md
	$(PY) benchmarks/bench_dmp.py --device cuda --out benchmarks/results/dmp_cuda.md
	$(PY) benchmarks/bench_fsdp.py --device cuda --json benchmarks/results/fsdp_cuda.json \
		--markdown benchmarks/results/fsdp_cuda.md

# Build the CUDA kernel without a GPU, as a GPU machine's first use does, for every architecture
# torch's CUDA wheel targets: its own venv (.venv-cuda, ~5 GB once); not part of `make test`.
check-cuda-build:
	scripts/check_cuda_build.sh

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

bench-comm: $(STAMP)
	$(VENV)/bin/shardkit bench comm --world-size 2 --json benchmarks/results/comm_gloo_2ranks.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
