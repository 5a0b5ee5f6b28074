"""``python -m shardkit.kernels --cuda``: build the CPU and CUDA operators as a GPU machine's
first use does, and check that the CUDA ones registered. Needs a CUDA build of torch and nvcc,
not a GPU; ``make check-cuda-build`` runs it in its own venv (``.venv-cuda``)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from shardkit.kernels._build import BuildError, build_cuda

_OPS = ("pooled_forward", "fused_backward", "dense_backward")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardkit.kernels", description=__doc__)
    parser.add_argument("--cuda", action="store_true", required=True, help="build the CUDA ops")
    parser.parse_args(argv)
    no_gpu = torch.version.cuda is not None and not torch.cuda.is_available()
    if no_gpu and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        # No GPU to ask: the architectures torch's own wheel was built for, as `sm_90 ...`.
        arches = str(torch._C._cuda_getArchFlags() or "").split()
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(
            f"{a[3:-1]}.{a[-1]}" for a in arches if a.startswith("sm_")
        )
    start = time.perf_counter()
    try:
        how = build_cuda()
    except BuildError as error:
        print(f"check-cuda-build: FAILED: {error}", file=sys.stderr)
        return 1
    missing = [
        op
        for op in _OPS
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"shardkit::{op}", "CUDA")
    ]
    if missing:
        print(f"check-cuda-build: FAILED: no CUDA kernel registered for {missing}", file=sys.stderr)
        return 1
    print(
        f"check-cuda-build: OK in {time.perf_counter() - start:.0f} s: torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), architectures {os.environ['TORCH_CUDA_ARCH_LIST']}; "
        f"{', '.join(_OPS)} registered for CUDA; {how}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
