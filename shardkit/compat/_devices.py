"""Running code written for GPUs on a machine without one: ``"cuda"`` runs on ``"cpu"``,
``"nccl"`` on ``"gloo"``.

[Note: cuda on cpu]
`map_cuda_to_cpu` (what ``shardkit run`` calls when ``torch.cuda.is_available()`` is False):

- a torch function mode moves tensors that code creates or moves to a CUDA device
  (``device="cuda"``, ``.to("cuda:1")``, ``.cuda()``) to the CPU instead;
- ``torch.distributed.init_process_group`` gets ``"gloo"`` for ``"nccl"`` (and a default
  timeout, so a rank that never arrives fails the job instead of hanging it);
- ``torch.cuda.set_device`` does nothing, ``torch.cuda.current_device()`` is 0;
- `resolve_device` (which shardkit's `DistributedModelParallel`, pipelines and ``shard`` call
  on the device they are given) returns ``cpu`` for a CUDA device.

Programs that check ``torch.cuda.is_available()`` themselves (most TorchRec programs) take
their CPU path and never meet any of this. Nothing changes where a GPU exists.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

__all__ = ["cuda_mapped", "map_cuda_to_cpu", "resolve_device"]

_STATE = {"on": False}
_MOVES = {torch.Tensor.to, torch.Tensor.cuda}
_TIMEOUT = datetime.timedelta(minutes=5)


def cuda_mapped() -> bool:
    """Whether `map_cuda_to_cpu` is in effect in this process."""
    return _STATE["on"]


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.split(":")[0] == "cuda"
    return isinstance(value, int) and not isinstance(value, bool)  # a CUDA ordinal


def resolve_device(device: Any) -> Any:
    """``device``, or ``torch.device("cpu")`` for a CUDA device while `map_cuda_to_cpu` is on."""
    if _STATE["on"] and device is not None and _is_cuda(device):
        return torch.device("cpu")
    return device


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0].cpu()
        if func in _MOVES and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _init_process_group(original, *args: Any, **kwargs: Any) -> Any:
    backend = kwargs.get("backend", args[0] if args else None)
    if isinstance(backend, str) and "nccl" in backend:
        backend = "gloo" if ":" not in backend else backend.replace("nccl", "gloo")
        if args:
            args = (backend, *args[1:])
        else:
            kwargs["backend"] = backend
    kwargs.setdefault("timeout", _TIMEOUT)
    return original(*args, **kwargs)


def map_cuda_to_cpu() -> str:
    """Run CUDA code on the CPU in this process (see [Note: cuda on cpu]); returns the one line
    that says so. Call it only where ``torch.cuda.is_available()`` is False."""
    if torch.cuda.is_available():
        raise RuntimeError("map_cuda_to_cpu: this machine has a GPU; run the code on it")
    if not _STATE["on"]:
        _STATE["on"] = True
        _CudaToCpu().__enter__()  # for the rest of the process
        dist.init_process_group = functools.partial(_init_process_group, dist.init_process_group)
        torch.cuda.set_device = lambda device: None
        torch.cuda.current_device = lambda: 0
    return "no GPU here: 'cuda' runs on 'cpu' and 'nccl' on 'gloo'"
