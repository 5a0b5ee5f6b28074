"""Where a collective's tensors must live: on the device the backend carries.

[Note: collective placement]
NCCL moves GPU memory only: a CPU tensor handed to an NCCL collective is a bug (torch refuses
it, with a message that names neither the collective nor the tensor's role). The fake GPU of the
tests (``tests/fake_gpu.py``) cannot see this bug: its collectives run on gloo, which takes the
CPU tensors that a real GPU run would refuse. So `_launch` asks `check_placement` for every
tensor it hands to a backend, and the check refuses a CPU tensor

- always, in a group whose backend for CPU tensors is NCCL (cheap: one device type per tensor);
- and, after ``set_collective_device("fakegpu")``, in every group: the fake-GPU tier stands for
  a GPU machine, so every tensor a collective moves must be on the stand-in device.

Collectives that bypass `shardkit.comm` (``torch.distributed`` called directly, DTensor's own
redistributions in `fully_shard`) are not checked here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["PlacementError", "check_placement", "collective_device", "set_collective_device"]

_expected: str | None = None


class PlacementError(ValueError):
    """A collective was handed a tensor on a device its backend does not carry."""


def set_collective_device(device_type: str | None) -> None:
    """Refuse any tensor not on ``device_type`` in every collective of this process (the tests'
    fake-GPU tier stands for NCCL with ``"fakegpu"``); None: NCCL groups alone are checked.
    See [Note: collective placement]."""
    global _expected
    if device_type is not None and not isinstance(device_type, str):
        raise TypeError(f"device_type must be a device type such as 'cuda', got {device_type!r}")
    _expected = device_type


def collective_device() -> str | None:
    """The device type `set_collective_device` asked for (None: unset)."""
    return _expected


def check_placement(
    name: str, group: dist.ProcessGroup | None, backend: str, tensors: tuple[torch.Tensor, ...]
) -> None:
    """Raise `PlacementError` if ``tensors`` (handed to collective ``name``) hold a CPU tensor
    where the backend needs device memory. ``backend``: the group's backend for CPU tensors."""
    if _expected is None and backend != "nccl":
        return
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        stands_for = "NCCL" if backend == "nccl" else f"{backend} standing in for NCCL"
        expected = _expected or "cuda"
        raise PlacementError(
            f"shardkit.comm.{name} on rank {dist.get_rank()} was handed a CPU tensor (shape "
            f"{tuple(tensor.shape)}, {tensor.dtype}) in a group whose backend "
            f"is {stands_for}, which moves {expected} memory only; create or move the tensor on "
            f"the rank's device (device={expected}:<local rank>, or .to(device)) before the "
            "collective"
        )
