"""Collectives of picklable Python objects, built on the tensor collectives.

They move the pickled bytes as one uint8 tensor with a label and a timeout like every shardkit
collective (torch's own object collectives go through NumPy and carry neither).
"""

from __future__ import annotations

import ctypes
import pickle
from typing import Any

import torch
import torch.distributed as dist

from shardkit.comm._errors import collective_error
from shardkit.comm._label import label
from shardkit.comm._ops import AllGather, Broadcast
from shardkit.comm._placement import collective_device

__all__ = ["all_gather_object", "broadcast_object", "group_device"]

Group = dist.ProcessGroup | None


def group_device(group: Group) -> torch.device:
    """Where the group's collectives want their tensors (an object's bytes, a flag, a count):
    the current GPU for NCCL (or the device `set_collective_device`
    names, see [Note: collective placement]), else the CPU."""
    device_type = collective_device()
    if device_type is None and dist.get_backend(group) == "nccl":
        device_type = "cuda"
    if device_type is None:
        return torch.device("cpu")
    return torch.device(device_type, torch.get_device_module(device_type).current_device())


def broadcast_object(obj: Any, *, src: int = 0, group: Group = None) -> Any:
    """Every rank gets global rank ``src``'s picklable ``obj`` (others pass anything, e.g. None)."""
    device = group_device(group)
    is_src = dist.get_rank() == src
    payload = _encode(obj, device) if is_src else None
    with label("shardkit::broadcast_object"):
        try:
            size = torch.tensor([payload.numel() if payload is not None else 0], device=device)
            size = Broadcast(group, src, inplace=True).launch(size, async_op=False).finish()
            if payload is None:
                payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
            payload = Broadcast(group, src, inplace=True).launch(payload, async_op=False).finish()
        except RuntimeError as exc:
            raise collective_error("broadcast_object", group, exc) from exc
    return obj if is_src else _decode(payload)


def all_gather_object(obj: Any, *, group: Group = None) -> list[Any]:
    """Every rank gets the list of all ranks' picklable objects, in rank order."""
    device = group_device(group)
    payload = _encode(obj, device)
    num_ranks = dist.get_world_size(group)
    with label("shardkit::all_gather_object"):
        try:
            size = torch.tensor([payload.numel()], device=device)
            sizes = AllGather(group, (1,) * num_ranks).launch(size, async_op=False).finish()
            sizes_list = tuple(int(s) for s in sizes.tolist())
            gathered = AllGather(group, sizes_list).launch(payload, async_op=False).finish()
        except RuntimeError as exc:
            raise collective_error("all_gather_object", group, exc) from exc
    return [_decode(piece) for piece in torch.split(gathered, list(sizes_list))]


def _encode(obj: Any, device: torch.device) -> torch.Tensor:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _decode(payload: torch.Tensor) -> Any:
    data = payload.cpu().contiguous()
    return pickle.loads(ctypes.string_at(data.data_ptr(), data.numel()))
