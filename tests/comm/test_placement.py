"""A collective refuses a CPU tensor where its backend moves GPU memory only (NCCL, and the fake
GPU's gloo standing in for it): see [Note: collective placement] in shardkit/comm/_placement.py."""

from __future__ import annotations

import pytest
import torch

from shardkit import comm
from tests.fake_gpu import to_cpu

_REFUSED = (
    r"shardkit\.comm\.{name} on rank {rank} was handed a CPU tensor \(shape \(\d+, 2\), "
    r"torch\.float32\) in a group whose backend is gloo standing in for NCCL, which moves fakegpu "
    r"memory only; create or move the tensor on the rank's device"
)


def _cpu_tensor_slipped_in(rank: int, world_size: int, *, device: torch.device):
    on_device = torch.full((4, 2), float(rank + 1), device=device)
    total = comm.all_reduce(on_device)  # on the stand-in device: carried as NCCL would
    slipped = torch.ones(4, 2)  # a factory call without device=, as a library bug would make
    calls = {
        "all_reduce": lambda: comm.all_reduce(slipped),
        "all_to_all_single": lambda: comm.all_to_all_single(slipped),
        "all_gather_into_tensor": lambda: comm.all_gather_into_tensor(slipped),
        # gloo has no fast reduce-scatter: its fallback's all-to-all is what refuses
        "(reduce_scatter_tensor|all_to_all_single)": lambda: comm.reduce_scatter_tensor(slipped),
        "broadcast": lambda: comm.broadcast(slipped, src=0),
    }
    for name, call in calls.items():
        with pytest.raises(comm.PlacementError, match=_REFUSED.format(name=name, rank=rank)):
            call()
    return to_cpu(total), comm.collective_device()


def test_fake_gpu_collectives_refuse_cpu_tensors_as_nccl(run_ranks):
    results = run_ranks(_cpu_tensor_slipped_in, 2, device="fakegpu")
    for total, expected_device in results:
        torch.testing.assert_close(total, torch.full((4, 2), 3.0))
        assert expected_device == "fakegpu"


def _cpu_tier(rank: int, world_size: int, *, device: torch.device):
    # The CPU tier's gloo carries CPU tensors: nothing refused, and the fake tier's setting is
    # gone from a pool's process (it is reset after each fake-GPU body).
    return to_cpu(comm.all_reduce(torch.ones(2, device=device))), comm.collective_device()


def test_cpu_tier_collectives_take_cpu_tensors(run_ranks):
    for total, expected_device in run_ranks(_cpu_tier, 2, device="cpu"):
        torch.testing.assert_close(total, torch.full((2,), 2.0))
        assert expected_device is None


def test_set_collective_device_refuses_a_non_string():
    with pytest.raises(TypeError, match=r"device_type must be a device type such as 'cuda', got 3"):
        comm.set_collective_device(3)  # type: ignore[arg-type]
