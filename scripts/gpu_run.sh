#!/usr/bin/env bash
# The GPU run (issue 30): the GPU tier and the GPU benchmarks in ONE command that fits the
# device tool's limits (10 minutes a command, 15 minutes of device time a session, start
# included; at most 8 files back from $OUT). From a session that is lent a GPU:
#
#   device run: command="bash scripts/gpu_run.sh", timeout_s=600
#
# then copy the files it returns into benchmarks/results/ (gpu_run.log names the device) and
# commit them. Elsewhere: `OUT=/tmp/gpu bash scripts/gpu_run.sh`.
#
# It uses the machine's own python3 and torch (nothing can be installed there: no network, and
# torch's CUDA wheel is far over the 64 MiB a call carries), with shardkit from this checkout on
# PYTHONPATH. The kernel is built for this GPU's architecture only (one nvcc job instead of six).
# With one GPU the multi-rank tests of the tier skip (NCCL wants a GPU per rank), DMP runs on
# one rank and the FSDP benchmark (2 ranks) is left out; FBGEMM's CUDA build is not on that
# machine, so the EBC benchmark compares shardkit's compiled and eager kernels only.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/shardkit-gpu-run}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SHARDKIT_CACHE_DIR="${SHARDKIT_CACHE_DIR:-/tmp/shardkit-cache}" MAX_JOBS="${MAX_JOBS:-16}"
TORCH_CUDA_ARCH_LIST="$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
export TORCH_CUDA_ARCH_LIST

step() {  # step SECONDS NAME COMMAND...: one part, bounded, its outcome on one line
  local limit="$1" name="$2"; shift 2
  local start=$SECONDS
  echo "=== $name (at most ${limit} s)"
  timeout "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
}

{
  echo "=== the machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__,
      "| CUDA", torch.version.cuda, "|", torch.cuda.get_device_name(), "| GPUs", torch.cuda.device_count())'
  lscpu | grep -E "^Model name|^CPU\(s\)"
  git log -1 --format="shardkit at %h (%ad)" --date=short 2>/dev/null || true
  step 150 "kernel build (sm_${TORCH_CUDA_ARCH_LIST/./})" "$PY" -m shardkit.kernels --cuda
  step 240 "GPU tier (pytest -m gpu)" "$PY" -m pytest -m gpu -q -p no:cacheprovider \
    --junitxml "$OUT/gpu_tests.xml"
  step 90 "EBC step, compiled vs eager kernel" "$PY" benchmarks/bench_ebc.py --device cuda \
    --contenders "shardkit compiled" "shardkit eager" --rounds 3 --out "$OUT/ebc_cuda.md"
  step 90 "DMP step, 1 rank" "$PY" benchmarks/bench_dmp.py --device cuda --world-size 1 \
    --rounds 1 --out "$OUT/dmp_cuda.md"
} 2>&1 | tee "$OUT/gpu_run.log"
