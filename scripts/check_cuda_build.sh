#!/usr/bin/env bash
# `make check-cuda-build`: build shardkit's CUDA kernel on a machine WITHOUT a GPU, the way the
# first use builds it on a GPU machine (`shardkit.kernels._build`, same sources, flags and
# torch.library registration), for every architecture torch's CUDA wheel targets, and check
# that the CUDA operators register. Its own venv, .venv-cuda/ (about 5 GB, made once): torch
# 2.13.0's PyPI build (CUDA 13.0) and nvcc, CUDA headers and runtime from PyPI. Not part of
# `make test`. A second run reuses the venv and, if the sources did not change, the cached
# build (in .venv-cuda/cache); SHARDKIT_CUDA_REBUILD=1 forces a fresh build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-cuda
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed-$(sha256sum scripts/requirements-cuda.txt | cut -c1-12)"

if [[ ! -e "$STAMP" ]]; then
  echo "check-cuda-build: setting up $VENV (torch's CUDA wheel and nvcc from PyPI: several GB, once)"
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  # PyPI itself: this machine's pip config points at a local CPU wheel of the same version.
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "$VENV/bin/pip" install --quiet --index-url https://pypi.org/simple -r scripts/requirements-cuda.txt
  "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e .
  touch "$STAMP"
fi

# CUDA_HOME as cpp_extension wants it (bin/nvcc, include/, lib64/libcudart.so), made of
# symbolic links into the PyPI packages' nvidia/cu13 tree.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
CUDA_TREE="$(ls -d "$SITE"/nvidia/cu1*/ | head -n1)"
HOME_DIR="$PWD/$VENV/cuda-home"
mkdir -p "$HOME_DIR/lib64"
for part in bin include nvvm; do ln -sfn "$CUDA_TREE$part" "$HOME_DIR/$part"; done
for lib in "$CUDA_TREE"lib/*; do ln -sfn "$lib" "$HOME_DIR/lib64/"; done
ln -sfn "$(basename "$(ls "$CUDA_TREE"lib/libcudart.so.* | head -n1)")" "$HOME_DIR/lib64/libcudart.so"

export CUDA_HOME="$HOME_DIR"
export SHARDKIT_CACHE_DIR="$PWD/$VENV/cache"
if [[ "${SHARDKIT_CUDA_REBUILD:-0}" == 1 ]]; then rm -rf "$SHARDKIT_CACHE_DIR"; fi
# MAX_JOBS: ninja's parallel nvcc jobs (each arch's device code is compiled in one of them).
exec env MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/python" -m shardkit.kernels --cuda
