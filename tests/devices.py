"""The devices a multi-rank test body runs on, one body for all of them.

A test passes ``device="cpu" | "fakegpu" | "cuda"`` to ``run_ranks``; each rank then calls the
body with ``device=<torch.device>`` (this rank's device), on a process group that carries it:

- ``cpu``: gloo, the default tier.
- ``fakegpu``: gloo, with every tensor the body puts on ``device`` a fake-GPU tensor that refuses
  to mix with CPU tensors (see [Note: the fake GPU] in `tests.fake_gpu`), and collectives that
  refuse CPU tensors as NCCL does (`shardkit.comm.set_collective_device`). Part of the default
  tier: it proves on a CPU-only machine that nothing is created on, or left on, the wrong device.
- ``cuda``: NCCL on ``cuda:<local rank>``, the GPU tier (``pytest -m gpu``, ``make test-gpu``);
  skipped, with one summary line for all of them, where CUDA is missing.

Bodies compute the unsharded reference on the CPU and compare on the CPU (`tests.fake_gpu.to_cpu`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from shardkit import launch

__all__ = [
    "ALL",
    "CPU_AND_GPU",
    "DEVICE_TIER",
    "GPU_SKIP_REASON",
    "OnDevice",
    "backend_of",
    "cuda_ready",
    "gpu_param",
]

GPU_SKIP_REASON = "gpu tier: no CUDA device here (run `make test-gpu` on a GPU machine)"


def gpu_param(*values: Any) -> Any:
    """A parameter of the GPU tier: marked ``gpu``, so ``pytest -m gpu`` selects it."""
    return pytest.param(*values, marks=pytest.mark.gpu, id="-".join(map(str, values)))


# Every device a test body can run on: the CPU, the fake GPU, a real one (marked gpu).
ALL = ["cpu", "fakegpu", gpu_param("cuda")]
# The CPU tier and the GPU tier of one test (the fake GPU runs a chosen few: DEVICE_TIER).
CPU_AND_GPU = ["cpu", gpu_param("cuda")]
# The tier that proves device placement: the fake GPU here, a real one where there is one.
DEVICE_TIER = ["fakegpu", gpu_param("cuda")]


def backend_of(kind: str) -> str:
    """The process group backend that carries a device kind's tensors."""
    return "nccl" if kind == "cuda" else "gloo"


def cuda_ready(world_size: int) -> str | None:
    """Why ``world_size`` ranks cannot run the GPU tier here (None: they can)."""
    if not torch.cuda.is_available():
        return GPU_SKIP_REASON
    if torch.cuda.device_count() < world_size:
        return "gpu tier: fewer GPUs than ranks (NCCL needs one GPU per rank)"
    return None


@dataclass(frozen=True)
class OnDevice:
    """``fn(rank, world_size, *args, device=...)`` run on one device kind (picklable)."""

    fn: Callable[..., Any]
    kind: str

    def __call__(self, rank: int, world_size: int, *args: Any) -> Any:
        if self.kind == "cpu":
            return self.fn(rank, world_size, *args, device=torch.device("cpu"))
        if self.kind == "cuda":
            return self.fn(rank, world_size, *args, device=launch.current().device)
        from shardkit import comm
        from tests.fake_gpu import DEVICE_TYPE, fake_gpu

        # The fake GPU's gloo stands for NCCL: collectives refuse CPU tensors as NCCL does
        # (see [Note: collective placement] in shardkit/comm/_placement.py).
        comm.set_collective_device(DEVICE_TYPE)
        try:
            with fake_gpu() as device:
                return self.fn(rank, world_size, *args, device=device)
        finally:
            comm.set_collective_device(None)
