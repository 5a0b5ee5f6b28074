"""Who holds what: the shard group splits each parameter, the replicate group holds copies.

[Note: strategies as groups]
Every sharding strategy is a pair of process groups. A parameter is split over the ``shard``
group (``torch.chunk`` rows along dim 0); ranks of the ``replicate`` group hold the same rows.

=============  ==========================  =========================
strategy       shard group                 replicate group
=============  ==========================  =========================
FULL_SHARD     all ranks                   none
SHARD_GRAD_OP  all ranks                   none
NO_SHARD       none (whole parameters)     all ranks
HYBRID_SHARD   the ranks of one host       same local rank, all hosts
=============  ==========================  =========================

Gradients are averaged over the shard group (reduce-scatter) and then over the replicate group
(all-reduce), which is the average over all ranks because the groups are equal in size.

``fully_shard`` takes FSDP2's DeviceMesh instead: a 1-D mesh is the shard group (FULL_SHARD, or
SHARD_GRAD_OP with ``reshard_after_forward=False``); a 2-D mesh ``(replicate, shard)`` gives the
replicate group (dim 0) and the shard group (dim 1), HYBRID_SHARD. Its parameters are DTensors on
that mesh with placements ``(Shard(0),)`` or ``(Replicate(), Shard(0))``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist

from shardkit import comm, launch
from shardkit.fsdp.api import ShardingStrategy

__all__ = ["MeshInfo", "compute_device", "default_mesh", "make_mesh_info", "mesh_info_of"]

logger = logging.getLogger(__name__)

Group = dist.ProcessGroup

# (id of the default group, world size, ranks per host) -> (intra-host group, inter-host group).
# Creating groups is a collective over all ranks; every unit of a job shares one pair.
_HOST_GROUPS: dict[tuple[int, int, int], tuple[Group, Group]] = {}


@dataclass(frozen=True, eq=False)
class MeshInfo:
    """A unit's groups, mesh and compute device (FSDP2 calls it FSDPMeshInfo; not the planner's
    Topology). See [Note: strategies as groups].

    Args:
        world_group: every rank of the job (for agreement checks).
        shard_group: ranks that split each parameter; None when each rank holds whole ones.
        replicate_group: ranks that hold the same shard; None when there are no copies.
        device: where gathered parameters and the computation live.
        mesh: the DeviceMesh of the unit's DTensors (given to ``fully_shard``; the wrapper's is
            built from the groups when a sharded state dict first needs it).
    """

    world_group: Group
    shard_group: Group | None
    replicate_group: Group | None
    device: torch.device
    mesh: Any = None

    @property
    def shard_size(self) -> int:
        return 1 if self.shard_group is None else dist.get_world_size(self.shard_group)

    @property
    def shard_rank(self) -> int:
        return 0 if self.shard_group is None else dist.get_rank(self.shard_group)

    @property
    def replicate_size(self) -> int:
        return 1 if self.replicate_group is None else dist.get_world_size(self.replicate_group)

    @cached_property
    def mesh_and_placements(self) -> tuple[Any, tuple[Any, ...]]:
        """The DeviceMesh and DTensor placements of a dim-0 shard (built on first use)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Replicate, Shard

        device_type = self.device.type
        if self.mesh is not None:
            if self.mesh.ndim == 2:
                return self.mesh, (Replicate(), Shard(0))
            return self.mesh, (Shard(0),)
        if self.shard_group is not None and self.replicate_group is not None:
            layout = _hybrid_layout(self)
            mesh = DeviceMesh.from_group(
                [self.replicate_group, self.shard_group],
                device_type,
                mesh=layout,
                mesh_dim_names=("replicate", "shard"),
            )
            return mesh, (Replicate(), Shard(0))
        if self.shard_group is not None:
            return DeviceMesh.from_group(self.shard_group, device_type), (Shard(0),)
        group = self.replicate_group or self.world_group
        return DeviceMesh.from_group(group, device_type), (Replicate(),)


def _hybrid_layout(mesh_info: MeshInfo) -> torch.Tensor:
    """``[replicas, shards]`` global ranks: entry ``[i, j]`` holds shard ``j`` of replica ``i``."""
    mine = (dist.get_rank(mesh_info.replicate_group), mesh_info.shard_rank, dist.get_rank())
    everyone = comm.all_gather_object(mine, group=mesh_info.world_group)
    layout = torch.empty(mesh_info.replicate_size, mesh_info.shard_size, dtype=torch.int)
    for replica, shard, rank in everyone:
        layout[replica, shard] = rank
    return layout


def compute_device(device_id: int | str | torch.device | None = None) -> torch.device:
    """The device units compute on: ``device_id`` (an index is a GPU; a device type such as a
    mesh's ``"cuda"`` means the current one), else the rank's device from shardkit.launch, else
    the current GPU under NCCL, else the CPU."""
    if isinstance(device_id, int):
        return torch.device("cuda", device_id)
    if device_id is not None:
        device = torch.device(device_id)
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device
    if launch.is_initialized():
        return launch.current().device
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_DEFAULT_MESHES: dict[tuple[int, str], Any] = {}


def _world() -> dist.ProcessGroup:
    """The default group (``dist.group.WORLD`` is typed Optional: None before it is set up)."""
    world = dist.group.WORLD
    assert world is not None, "the default process group is initialised before FSDP runs"
    return world


def default_mesh(device_type: str) -> Any:
    """A 1-D mesh of every rank (FSDP2's default), one per process group and device type."""
    from torch.distributed.device_mesh import DeviceMesh

    key = (id(_world()), device_type)
    if key not in _DEFAULT_MESHES:
        _DEFAULT_MESHES[key] = DeviceMesh.from_group(_world(), device_type)
    return _DEFAULT_MESHES[key]


def mesh_info_of(mesh: Any) -> MeshInfo:
    """The groups of FSDP2's mesh: 1-D shards, 2-D (replicate, shard) shards and replicates."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh) or mesh.ndim not in (1, 2):
        what = f"a {mesh.ndim}-D DeviceMesh" if isinstance(mesh, DeviceMesh) else repr(mesh)
        raise ValueError(
            f"fully_shard's mesh must be a 1-D DeviceMesh (shard) or a 2-D one (replicate, "
            f"shard), got {what}; e.g. init_device_mesh('cpu', (world_size,))"
        )
    device = compute_device(mesh.device_type)
    if mesh.ndim == 1:
        group = mesh.get_group()
        return MeshInfo(group, group, None, device, mesh)
    whole = mesh.size() == dist.get_world_size()
    world = _world() if whole else mesh._flatten().get_group()
    return MeshInfo(world, mesh.get_group(1), mesh.get_group(0), device, mesh)


def make_mesh_info(
    strategy: ShardingStrategy,
    *,
    process_group: Group | tuple[Group, Group] | None = None,
    device_mesh: Any = None,
    device: torch.device,
) -> MeshInfo:
    """Groups for ``strategy`` from an explicit group, a DeviceMesh, or the default group."""
    if not isinstance(strategy, ShardingStrategy):
        raise TypeError(
            f"sharding_strategy must be a shardkit.fsdp.ShardingStrategy, got {strategy!r}; "
            "use e.g. ShardingStrategy.FULL_SHARD"
        )
    world = _world()
    if strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
        shard, replicate = _hybrid_groups(process_group, device_mesh)
        return MeshInfo(world, shard, replicate, device)
    group = _flat_group(strategy, process_group, device_mesh)
    if strategy is ShardingStrategy.NO_SHARD:
        replicas = group if dist.get_world_size(group) > 1 else None
        return MeshInfo(group, None, replicas, device)
    return MeshInfo(group, group, None, device)


def _flat_group(strategy: ShardingStrategy, process_group: Any, device_mesh: Any) -> Group:
    if isinstance(process_group, tuple):
        raise ValueError(
            f"process_group is a tuple (intra-host, inter-host) but sharding_strategy is "
            f"{strategy.name}; a tuple is for HYBRID_SHARD only, pass one ProcessGroup"
        )
    if device_mesh is not None:
        if device_mesh.ndim != 1:
            raise ValueError(
                f"device_mesh has {device_mesh.ndim} dimensions but {strategy.name} needs a 1-D "
                "mesh; a 2-D (replicate, shard) mesh is for HYBRID_SHARD"
            )
        return device_mesh.get_group()
    return process_group if process_group is not None else _world()


def _hybrid_groups(process_group: Any, device_mesh: Any) -> tuple[Group, Group]:
    if isinstance(process_group, tuple):
        intra, inter = process_group
        return intra, inter
    if device_mesh is not None:
        if device_mesh.ndim != 2:
            raise ValueError(
                f"HYBRID_SHARD needs a 2-D device_mesh (replicate, shard), got {device_mesh.ndim} "
                "dimension(s)"
            )
        return device_mesh.get_group(1), device_mesh.get_group(0)
    if process_group is not None:
        raise ValueError(
            "HYBRID_SHARD with a single process_group is ambiguous: pass process_group="
            "(intra_host_group, inter_host_group), a 2-D device_mesh, or neither (hosts are "
            "taken from shardkit.launch)"
        )
    return _host_groups()


def _host_groups() -> tuple[Group, Group]:
    if not launch.is_initialized():
        raise ValueError(
            "HYBRID_SHARD needs to know which ranks share a host: start the ranks with "
            "shardkit.launch (spawn or init_from_env), or pass process_group=(intra_host_group, "
            "inter_host_group) or a 2-D device_mesh"
        )
    info = launch.current()
    num_hosts, per_host = info.num_hosts, info.local_world_size
    key = (id(dist.group.WORLD), info.world_size, per_host)
    if key not in _HOST_GROUPS:
        hosts = [list(range(h * per_host, (h + 1) * per_host)) for h in range(num_hosts)]
        across = [list(range(local, info.world_size, per_host)) for local in range(per_host)]
        intra, _ = dist.new_subgroups_by_enumeration(hosts)
        inter, _ = dist.new_subgroups_by_enumeration(across)
        _HOST_GROUPS[key] = (intra, inter)
        logger.info(
            "HYBRID_SHARD: %d host(s) of %d rank(s): parameters sharded over a host, "
            "replicated across hosts",
            num_hosts,
            per_host,
        )
    return _HOST_GROUPS[key]
