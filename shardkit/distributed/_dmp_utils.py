"""Around `DistributedModelParallel` (``torchrec.distributed.model_parallel`` and
``.utils``): unwrapping it, the eval variant, names of the modules it left unsharded, and
copying a sharded model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardkit.sharding import DistributedModelParallel, ShardedCollection

__all__ = [
    "HybridEvalDMP",
    "get_module",
    "get_unsharded_module_names",
    "get_unwrapped_module",
    "sharded_model_copy",
]


def get_module(module: nn.Module) -> nn.Module:
    """``module`` without its `DistributedModelParallel` wrappers (data parallelism kept)."""
    while isinstance(module, DistributedModelParallel):
        module = module._dmp_wrapped_module
    return module


def get_unwrapped_module(module: nn.Module) -> nn.Module:
    """``module`` without `DistributedModelParallel` and DistributedDataParallel wrappers."""
    while isinstance(module, DistributedModelParallel | DistributedDataParallel):
        if isinstance(module, DistributedModelParallel):
            module = module._dmp_wrapped_module
        else:
            module = module.module
    return module


def get_unsharded_module_names(model: nn.Module) -> list[str]:
    """Names of the top-most submodules of ``model`` that hold no sharded collection."""
    names: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, ShardedCollection):
                continue
            if any(isinstance(m, ShardedCollection) for m in child.modules()):
                visit(child, f"{path}.")
            else:
                names.append(path)

    visit(get_unwrapped_module(model), "")
    return names


class HybridEvalDMP(DistributedModelParallel):
    """`DistributedModelParallel` for evaluation: no data parallelism by default, and in eval
    mode from the start."""

    def __init__(self, module: nn.Module, *, init_data_parallel: bool = False, **kwargs: Any):
        super().__init__(module, init_data_parallel=init_data_parallel, **kwargs)
        self.eval()


class sharded_model_copy:
    """Within it, ``copy.deepcopy`` of a sharded model copies its tensors to ``device`` (or
    shares them for None) and shares its process groups::

        with sharded_model_copy("cpu"):
            model_cpu = copy.deepcopy(model)
    """

    def __init__(self, device: str | int | torch.device | None) -> None:
        self.device = None if device is None else torch.device(device)

    def __enter__(self) -> None:
        device = self.device
        self._saved = (torch.Tensor.__deepcopy__, nn.Parameter.__deepcopy__)

        def copy_tensor(tensor: torch.Tensor, memo: dict) -> torch.Tensor:
            if device is None:
                return tensor
            if tensor.device != device:
                return tensor.detach().to(device)
            return tensor.detach().clone()

        def copy_param(param: torch.Tensor, memo: dict) -> nn.Parameter:
            return nn.Parameter(copy_tensor(param, memo), requires_grad=param.requires_grad)

        torch.Tensor.__deepcopy__ = copy_tensor  # type: ignore[method-assign]
        nn.Parameter.__deepcopy__ = copy_param  # type: ignore[method-assign]
        self._groups = []
        for group_class in _process_group_classes():
            self._groups.append((group_class, group_class.__dict__.get("__deepcopy__")))
            group_class.__deepcopy__ = lambda obj, memo: obj

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.__deepcopy__, nn.Parameter.__deepcopy__ = self._saved  # type: ignore[method-assign]
        for group_class, saved in self._groups:
            if saved is None:
                del group_class.__deepcopy__
            else:
                group_class.__deepcopy__ = saved


def _process_group_classes() -> list[type[Any]]:
    import torch.distributed as dist

    found: list[type[Any]] = [dist.ProcessGroup]
    c10d = torch._C._distributed_c10d
    for name in ("ProcessGroupGloo", "ProcessGroupNCCL"):
        if hasattr(c10d, name):
            found.append(getattr(c10d, name))
    return found
