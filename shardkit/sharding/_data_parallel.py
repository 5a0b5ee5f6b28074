"""How `DistributedModelParallel` makes the unsharded rest of a model data-parallel: TorchRec's
`DataParallelWrapper` interface and `DefaultDataParallelWrapper` (torch's
DistributedDataParallel over every parameter that is not a table shard)."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardkit.types import ShardingEnv

__all__ = ["DataParallelWrapper", "DefaultDataParallelWrapper", "wrap_data_parallel"]

_PRECISIONS = ("fp16", "bf16")


def wrap_data_parallel(
    module: nn.Module,
    env: ShardingEnv,
    device: torch.device,
    ignore: Iterable[str],
    **ddp_kwargs: Any,
) -> nn.Module:
    """``module`` in DistributedDataParallel over its parameters not named in ``ignore``
    (``module`` itself when there are none, or one rank)."""
    ignore = set(ignore)
    dense = [p for n, p in module.named_parameters() if n not in ignore and p.requires_grad]
    if env.world_size == 1 or not dense:
        return module
    if env.pg is None:
        raise RuntimeError("data parallelism needs a ShardingEnv with a process group")
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, sorted(ignore))
    device_ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(
        module, device_ids=device_ids, process_group=env.pg, **ddp_kwargs
    )


class DataParallelWrapper(abc.ABC):
    """Makes a `DistributedModelParallel`'s unsharded parameters data-parallel: ``wrap(dmp,
    env, device)`` replaces ``dmp._dmp_wrapped_module`` with its wrapped version."""

    @abc.abstractmethod
    def wrap(self, dmp: nn.Module, env: ShardingEnv, device: torch.device) -> None:
        """Wrap ``dmp._dmp_wrapped_module``."""


class DefaultDataParallelWrapper(DataParallelWrapper):
    """torch's DistributedDataParallel with TorchRec's settings over every parameter that is
    not a table shard (nor in ``params_to_ignore``).

    Args:
        bucket_cap_mb, static_graph, find_unused_parameters: DistributedDataParallel's.
        allreduce_comm_precision: ``"fp16"`` or ``"bf16"`` compresses the gradient
            all-reduce (torch's comm hooks); None sends float32.
        params_to_ignore: more parameter names to leave out.
        ddp_kwargs: further DistributedDataParallel arguments.
    """

    def __init__(
        self,
        bucket_cap_mb: int = 25,
        static_graph: bool = True,
        find_unused_parameters: bool = False,
        allreduce_comm_precision: str | None = None,
        params_to_ignore: Iterable[str] | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if allreduce_comm_precision not in (None, *_PRECISIONS):
            raise ValueError(
                f"allreduce_comm_precision={allreduce_comm_precision!r}: use None, 'fp16' or 'bf16'"
            )
        self._kwargs = {
            "bucket_cap_mb": bucket_cap_mb,
            "static_graph": static_graph,
            "find_unused_parameters": find_unused_parameters,
            "gradient_as_bucket_view": True,
            "broadcast_buffers": False,
            **dict(ddp_kwargs or {}),
        }
        self._precision = allreduce_comm_precision
        self._ignore = set(params_to_ignore or [])

    def wrap(self, dmp: nn.Module, env: ShardingEnv, device: torch.device) -> None:
        module, sharded_names = dmp._dmp_wrapped_module, dmp.sharded_parameter_names
        assert isinstance(module, nn.Module) and callable(sharded_names)  # dmp: a DMP
        if isinstance(module, DistributedDataParallel):
            return
        ignore = set(sharded_names()) | self._ignore
        wrapped = wrap_data_parallel(module, env, device, ignore, **self._kwargs)
        if self._precision is not None and isinstance(wrapped, DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = getattr(default_hooks, f"{self._precision}_compress_hook")
            wrapped.register_comm_hook(env.pg, hook)
        dmp._dmp_wrapped_module = wrapped
