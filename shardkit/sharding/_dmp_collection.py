"""`DMPCollection`: 2-D parallelism, TorchRec's way (``torchrec.distributed.model_parallel``).

[Note: 2-D parallelism]
``W`` ranks form ``W / G`` sharding groups of ``G`` ranks (``G = sharding_group_size``). Each
group shards the tables by the same plan (made for ``G`` ranks) and trains on its own ranks'
batches; the dense part is data-parallel over all ``W`` ranks (DDP on the global group). The
ranks holding the same shard in different groups form a replica group, and `DMPCollection.sync`
averages their shards (and the fused optimizer's state of those shards) over it; call it every
``N`` steps, as TorchRec's users do. Groups are laid out as TorchRec lays them out:

    step = W / G;  sharding group g (0 <= g < step): ranks [g, g + step, g + 2 * step, ...]
    replica group of rank r: ranks [step * (r // step), ..., step * (r // step) + step - 1]

so replicas are neighbours (the all-reduce stays inside a host), or, with
``use_inter_host_allreduce=True``, sharding groups are runs of ``G`` neighbouring ranks. Inside
a group a table's gradient is divided by ``G`` (the group's ranks' batches, DDP's convention); so
with a linear update (SGD) and a sync after every step the model is the single-group model
trained on the global batch. ``plan`` (what you pass, in the group's ranks ``0..G-1``) is the
plan each group applies; ``dmp.plan`` is it with this group's global ranks, as TorchRec shows it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardkit import comm
from shardkit.sharding._collection._base import dense_replicas_by_ddp
from shardkit.sharding._data_parallel import DataParallelWrapper, wrap_data_parallel
from shardkit.sharding._model_parallel import DistributedModelParallel
from shardkit.types import (
    ModuleSharder,
    ShardingEnv,
    ShardingPlan,
    ShardingStrategy,
    ShardPlacement,
)

__all__ = ["DMPCollection"]

logger = logging.getLogger(__name__)


class DMPCollection(DistributedModelParallel):
    """`DistributedModelParallel` over sharding groups of ``sharding_group_size`` ranks,
    replicated across groups and kept equal by `sync` (see [Note: 2-D parallelism]).

    Example::

        plan = planner.collective_plan(model, sharders, pg)   # a Topology of G ranks
        model = DMPCollection(module=model, device=device, plan=plan, world_size=W,
                              sharding_group_size=G, global_pg=dist.group.WORLD)
        for step, batch in enumerate(batches):
            ...; optimizer.step()
            if step % N == 0:
                model.sync()

    Args:
        module, device, sharders, init_data_parallel, init_parameters, data_parallel_wrapper:
            as `DistributedModelParallel`.
        plan: the plan of one sharding group (ranks ``0..G-1``), the same on every rank.
        world_size: ranks in ``global_pg``.
        sharding_group_size: ``G``, the ranks one copy of the tables is sharded over; divides
            ``world_size``.
        global_pg: the group of all ranks.
        sharding_strategy: ``ShardingStrategy.DEFAULT`` (or ``PER_MODULE``, the same without
            submodule configs); ``FULLY_SHARDED`` (weights reduce-scattered every step) is not
            in shardkit.
        node_group_size: ranks per host, for table-row-wise and grid plans (default ``G``).
        use_inter_host_allreduce: sharding groups of neighbouring ranks (see the Note).
        custom_all_reduce: ``f(tensors)`` that averages ``tensors`` over the replica group in
            place, instead of shardkit's all-reduce.
        submodule_configs, rs_awaitable_hook_module, use_sharded_relay: TorchRec's per-module
            plans, fully-sharded hook and NCCL relay; refused when given.
    """

    def __init__(
        self,
        module: nn.Module,
        device: torch.device | str | None,
        plan: ShardingPlan,
        world_size: int,
        sharding_group_size: int,
        global_pg: dist.ProcessGroup,
        sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT,
        node_group_size: int | None = None,
        sharders: Sequence[ModuleSharder] | None = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        data_parallel_wrapper: DataParallelWrapper | None = None,
        use_inter_host_allreduce: bool = False,
        custom_all_reduce: Callable[[list[torch.Tensor]], None] | None = None,
        submodule_configs: Any = None,
        rs_awaitable_hook_module: str | None = None,
        use_sharded_relay: bool = False,
    ) -> None:
        _check_arguments(world_size, sharding_group_size, global_pg, sharding_strategy,
                         submodule_configs, rs_awaitable_hook_module, use_sharded_relay)  # fmt: skip
        rank = dist.get_rank(global_pg)
        mesh = _mesh(world_size, sharding_group_size, use_inter_host_allreduce, device)
        sharding_pg, replica_pg = mesh.get_group("shard"), mesh.get_group("replicate")
        env = ShardingEnv.from_process_group(sharding_pg)
        with dense_replicas_by_ddp():  # DENSE data-parallel tables: DDP over every rank
            super().__init__(
                module,
                env,
                torch.device(device) if device is not None else None,
                plan,
                sharders,
                init_data_parallel=False,  # below, over every rank
                init_parameters=init_parameters,
                data_parallel_wrapper=data_parallel_wrapper,
                local_world_size=node_group_size or sharding_group_size,
            )
        self._global_env = ShardingEnv.from_process_group(global_pg)
        self._device_mesh = mesh
        self._replica_pg = replica_pg
        self._custom_all_reduce = custom_all_reduce
        self._group_plan = self.plan
        self.plan = _global_plan(self.plan, mesh)
        logger.info(
            "2-D parallelism: %d sharding groups of %d ranks; rank %d shards with ranks %s and "
            "syncs with ranks %s",
            world_size // sharding_group_size, sharding_group_size, rank,
            dist.get_process_group_ranks(sharding_pg), dist.get_process_group_ranks(replica_pg),
        )  # fmt: skip
        if init_data_parallel:
            self.init_data_parallel()

    @property
    def device_mesh(self) -> DeviceMesh:
        """The ranks as a ``("replicate", "shard")`` mesh (TorchRec's)."""
        return self._device_mesh

    def init_data_parallel(self) -> None:
        """The dense part data-parallel over every rank (not only this sharding group)."""
        if self._data_parallel_wrapper is not None:
            self._data_parallel_wrapper.wrap(self, self._global_env, self.device)
            return
        if isinstance(self._dmp_wrapped_module, nn.parallel.DistributedDataParallel):
            return
        own = [
            f"{path}.{name}" if path else name
            for path in self._sharded_paths
            for name, _ in self.module.get_submodule(path).named_buffers()
        ]
        self._dmp_wrapped_module = wrap_data_parallel(
            self._dmp_wrapped_module,
            self._global_env,
            self.device,
            self.sharded_parameter_names() + own,
        )

    @torch.no_grad()
    def sync(self, include_optimizer_state: bool = True) -> None:
        """Average this rank's table shards (and, with ``include_optimizer_state``, their fused
        optimizer's floating-point state) with the same shards of the other sharding groups.
        A collective over the replica group: every rank calls it at the same step."""
        tensors = self._sync_tensors(include_optimizer_state)
        if self._custom_all_reduce is not None:
            self._custom_all_reduce(tensors)
            return
        replicas = dist.get_world_size(self._replica_pg)
        if replicas == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():  # one all-reduce per dtype, as TorchRec's coalesced one
            flat = torch.cat([t.reshape(-1) for t in group])
            with torch.profiler.record_function("shardkit::dmp_collection_sync"):
                summed = comm.all_reduce(flat, group=self._replica_pg)
            assert isinstance(summed, torch.Tensor)
            summed.div_(replicas)
            for tensor, part in zip(group, summed.split([t.numel() for t in group])):
                tensor.copy_(part.view_as(tensor))

    def _sync_tensors(self, include_optimizer_state: bool) -> list[torch.Tensor]:
        """This rank's shards and replicas of fused tables, then their optimizer state."""
        names = set(self.sharded_parameter_names())
        params = [p for n, p in self.module.named_parameters() if n in names]
        tensors = [p.data for p in params]
        if include_optimizer_state:
            for path in self._sharded_paths:
                optimizer = getattr(self.module.get_submodule(path), "fused_optimizer", None)
                if optimizer is not None:
                    tensors.extend(optimizer.local_state_tensors())
        return tensors


def _check_arguments(
    world_size: int,
    sharding_group_size: int,
    global_pg: dist.ProcessGroup,
    sharding_strategy: ShardingStrategy,
    submodule_configs: Any,
    rs_awaitable_hook_module: str | None,
    use_sharded_relay: bool,
) -> None:
    """Refuse what cannot work, before any collective (the arguments are every rank's)."""
    actual = dist.get_world_size(global_pg)
    if world_size != actual:
        raise ValueError(
            f"DMPCollection: world_size={world_size} but global_pg has {actual} ranks; pass the "
            "global group's size"
        )
    if sharding_group_size < 1 or world_size % sharding_group_size:
        raise ValueError(
            f"DMPCollection: sharding_group_size={sharding_group_size} must divide world_size="
            f"{world_size} (each sharding group shards the tables over sharding_group_size ranks)"
        )
    if ShardingStrategy(sharding_strategy) == ShardingStrategy.FULLY_SHARDED:
        raise ValueError(
            "DMPCollection(sharding_strategy=FULLY_SHARDED): reduce-scattering the replicas' "
            "weights every step is not in shardkit; use ShardingStrategy.DEFAULT and sync()"
        )
    refused = {
        "submodule_configs": submodule_configs is not None,
        "rs_awaitable_hook_module": rs_awaitable_hook_module is not None,
        "use_sharded_relay": use_sharded_relay,
    }
    for name, given in refused.items():
        if given:
            raise ValueError(
                f"DMPCollection({name}=...): TorchRec's per-module 2-D plans, fully-sharded "
                "hooks and NCCL sharded relay are not in shardkit; leave it unset (one plan and "
                "sharding group size for the whole model)"
            )


def _mesh(
    world_size: int, group_size: int, inter_host: bool, device: torch.device | str | None
) -> DeviceMesh:
    """Rows are sharding groups, columns replica groups (see [Note: 2-D parallelism])."""
    if inter_host:
        rows = [
            list(range(start, start + group_size)) for start in range(0, world_size, group_size)
        ]
    else:
        step = world_size // group_size
        rows = [[step * r + g for r in range(group_size)] for g in range(step)]
    device_type = torch.device(device).type if device is not None else "cpu"
    return DeviceMesh(device_type, rows, mesh_dim_names=("replicate", "shard"))


def _global_plan(plan: ShardingPlan, mesh: DeviceMesh) -> ShardingPlan:
    """``plan`` (group ranks) with this sharding group's global ranks, as TorchRec remaps it."""
    ranks = dist.get_process_group_ranks(mesh.get_group("shard"))
    out = copy.deepcopy(plan)
    for module_plan in out.plan.values():
        for sharding in module_plan.values():
            if sharding.ranks is not None:
                sharding.ranks = [ranks[r] for r in sharding.ranks]
            if sharding.sharding_spec is not None:
                for shard in sharding.sharding_spec.shards:
                    where = shard.placement
                    shard.placement = ShardPlacement(ranks[where.rank()], where.device())
    return out
