"""`FullyShardDataParallelWrapper`: the dense part of a `DistributedModelParallel` fully sharded
with `shardkit.fsdp.fully_shard` instead of replicated under DDP (2-D: model-parallel tables,
fully-sharded dense layers).

[Note: dense units around sharded collections]
The wrapper makes every top-most submodule that holds no sharded collection (``over_arch``,
``dense_arch``, ...) its own `fully_shard` unit, then makes the whole model the root unit for
what is left (parameters directly on modules that also hold a sharded collection). Everything
inside a sharded collection is the root's ``ignored_params``: table shards are updated by their
fused optimizer, and the collection's replicated parameters (data-parallel tables, position
weights) cannot become DTensors: a data-parallel table's ``weight`` is a view of its kernel
group's stacked buffer (see ``shardkit.modules``' [Note: table views]), which the kernel reads
directly, so a gathered copy would be looked up by nobody and get no gradient. Those stay plain
replicas whose gradients are averaged over the ranks as each one is accumulated, exactly as
DDP averages them on the default path. Every rank runs the same graph, so the averages are
issued in the same order everywhere.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.sharding._data_parallel import DataParallelWrapper
from shardkit.types import ShardingEnv

if TYPE_CHECKING:  # imported on first use: a DMP without fully_shard needs none of shardkit.fsdp
    from shardkit.fsdp import MixedPrecisionPolicy, OffloadPolicy

__all__ = ["FullyShardDataParallelWrapper", "average_gradients", "dense_unit_paths"]

logger = logging.getLogger(__name__)


class FullyShardDataParallelWrapper(DataParallelWrapper):
    """Shard a `DistributedModelParallel`'s dense part with `fully_shard` (DTensor
    parameters, each rank holding ``1/W`` of every dense parameter and its optimizer state).

    Pass it as ``DistributedModelParallel(model, data_parallel_wrapper=...)``; the dense
    optimizer is then built over ``dmp.parameters()`` as with `fully_shard` alone. See
    [Note: dense units around sharded collections].

    Args:
        reshard_after_forward: `fully_shard`'s (None: its default).
        mp_policy: `fully_shard`'s mixed precision (default: none).
        offload_policy: `fully_shard`'s offload policy (default: none).
    """

    def __init__(
        self,
        *,
        reshard_after_forward: bool | None = None,
        mp_policy: MixedPrecisionPolicy | None = None,
        offload_policy: OffloadPolicy | None = None,
    ) -> None:
        self._kwargs: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
        if mp_policy is not None:
            self._kwargs["mp_policy"] = mp_policy
        if offload_policy is not None:
            self._kwargs["offload_policy"] = offload_policy

    def wrap(self, dmp: nn.Module, env: ShardingEnv, device: torch.device) -> None:
        from shardkit.fsdp import FSDPModule, fully_shard

        module, sharded_paths = dmp._dmp_wrapped_module, dmp._sharded_paths
        sharded_names = dmp.sharded_parameter_names
        assert isinstance(module, nn.Module) and isinstance(sharded_paths, list)  # dmp: a DMP
        assert callable(sharded_names)
        if isinstance(module, FSDPModule) or getattr(dmp, "_dense_fully_sharded", False):
            return  # init_data_parallel() may be called again
        dmp._dense_fully_sharded = True
        if env.pg is None:
            raise RuntimeError(
                "fully sharding the dense part needs a ShardingEnv with a process group"
            )
        mesh = _mesh_of(env, device)
        shards = set(sharded_names())
        inside = [
            (f"{path}.{name}" if path else name, param)
            for path in sharded_paths
            for name, param in module.get_submodule(path).named_parameters()
        ]
        paths = dense_unit_paths(module, sharded_paths)
        for path in paths:
            fully_shard(module.get_submodule(path), mesh=mesh, **self._kwargs)
        ignored = [param for _, param in inside]
        if any(p not in set(ignored) for p in module.parameters()):
            fully_shard(module, mesh=mesh, ignored_params=ignored, **self._kwargs)
        replicas = [p for n, p in inside if n not in shards and p.requires_grad]
        average_gradients(replicas, env)
        logger.info(
            "dense part fully sharded over %d rank(s): %d unit(s) %s and the root; "
            "%d replicated parameter(s) of sharded collections averaged as DDP would",
            env.world_size,
            len(paths),
            paths,
            len(replicas),
        )


def dense_unit_paths(module: nn.Module, sharded_paths: list[str]) -> list[str]:
    """Paths of the top-most submodules of ``module`` that hold none of ``sharded_paths`` (the
    sharded collections) and have parameters: the dense units
    `FullyShardDataParallelWrapper` makes."""
    paths: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in parent.named_children():
            path = f"{prefix}{name}"
            if path in sharded_paths:
                continue
            if any(s.startswith(f"{path}.") for s in sharded_paths):
                visit(child, f"{path}.")
            elif any(True for _ in child.parameters()):
                paths.append(path)

    if "" not in sharded_paths:
        visit(module, "")
    return paths


def average_gradients(params: list[torch.Tensor], env: ShardingEnv) -> None:
    """Average each of ``params``' gradients over ``env``'s ranks as soon as it is accumulated
    (DDP's result, without its buckets)."""
    if env.world_size == 1:
        return

    def hook(param: torch.Tensor) -> None:
        assert param.grad is not None  # a post-accumulate-grad hook: the gradient is there
        comm.all_reduce(param.grad, op=dist.ReduceOp.AVG, group=env.pg, inplace=True)

    for param in params:
        param.register_post_accumulate_grad_hook(hook)


def _mesh_of(env: ShardingEnv, device: torch.device) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    assert env.pg is not None  # wrap() raised first
    return DeviceMesh.from_group(env.pg, device.type)
