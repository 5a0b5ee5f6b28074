"""Where a rank sits among hosts (``torchrec.distributed.comm``): local size and rank, host
("group") rank and count, and the intra-host and cross-host process groups.

The local size comes from what ``shardkit.launch`` set up (`spawn`, `init_from_env`), else from
torchrun's or MPI's environment variables, else it is the world size (one host), as in TorchRec.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from shardkit.launch import current, is_initialized
from shardkit.types import ShardingEnv2D

__all__ = [
    "get_group_rank",
    "get_local_rank",
    "get_local_size",
    "get_node_group_size",
    "get_num_groups",
    "get_topology_domain_multiple",
    "get_topology_group_world_size",
    "intra_and_cross_node_pg",
    "intra_and_cross_node_pg_2D",
]

logger = logging.getLogger(__name__)

_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "MV2_COMM_WORLD_LOCAL_SIZE")  # fmt: skip
_LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "MV2_COMM_WORLD_LOCAL_RANK")  # fmt: skip
# Process groups made once per job, keyed by (world size, backend).
_GROUPS: dict[tuple, tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
_NODE_GROUP_SIZE_2D: int | None = None


def _env_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def get_local_size(world_size: int | None = None) -> int:
    """Ranks per host (``world_size`` when unknown or when it does not divide the world)."""
    world_size = dist.get_world_size() if world_size is None else world_size
    local = current().local_world_size if is_initialized() else _env_int(_LOCAL_SIZE_VARS)
    if local is None or local < 1 or world_size % local:
        return world_size
    return local


def get_node_group_size(world_size: int | None = None) -> int:
    """`get_local_size`, or the node group size a 2D environment set."""
    return get_local_size(world_size) if _NODE_GROUP_SIZE_2D is None else _NODE_GROUP_SIZE_2D


def get_local_rank(world_size: int | None = None, rank: int | None = None) -> int:
    """This rank's index on its host (``rank % local size`` when the launcher did not say)."""
    local_size = get_local_size(world_size)
    local = current().local_rank if is_initialized() else _env_int(_LOCAL_RANK_VARS)
    if local is None or local >= local_size:
        rank = dist.get_rank() if rank is None else rank
        local = rank % local_size
    return local


def get_group_rank(world_size: int | None = None, rank: int | None = None) -> int:
    """The index of this rank's host: ``rank // local size``."""
    rank = dist.get_rank() if rank is None else rank
    return rank // get_local_size(world_size)


def get_num_groups(world_size: int | None = None) -> int:
    """The number of hosts."""
    world_size = dist.get_world_size() if world_size is None else world_size
    return world_size // get_local_size(world_size)


def get_topology_domain_multiple() -> int | None:
    """Hosts per pod, from ``TOPOLOGY_DOMAIN_MULTIPLE`` (None when unset)."""
    return _env_int(("TOPOLOGY_DOMAIN_MULTIPLE",))


def get_topology_group_world_size(world_size: int | None = None) -> int:
    """Ranks joined by fast links: ``TORCHREC_RESOLVED_POD_SIZE`` hosts of local size, else
    one host."""
    local = get_local_size(world_size)
    pods = _env_int(("TORCHREC_RESOLVED_POD_SIZE",))
    if pods is None:
        return local
    world_size = dist.get_world_size() if world_size is None else world_size
    if world_size % (pods * local):
        raise ValueError(
            f"world size {world_size} is not a multiple of the topology group "
            f"({pods} hosts x {local} ranks); fix TORCHREC_RESOLVED_POD_SIZE"
        )
    return pods * local


def _new_groups(rank_lists: list[list[int]], backend: str) -> dist.ProcessGroup:
    """Every rank creates every group (torch's rule); this rank's one is returned."""
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks=ranks, backend=backend)
        if dist.get_rank() in ranks:
            mine = group
    assert mine is not None, "every rank is in one of the groups"
    return mine


def intra_and_cross_node_pg(
    device: torch.device | None = None, backend: str | None = None
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's host group and its cross-host group (the ranks of the same local index),
    made once per job; ``(None, None)`` on the meta device.

    With 12 ranks in hosts of 6: rank 7's intra group is ``[6..11]``, its cross group
    ``[1, 7]``.
    """
    if device is not None and torch.device(device).type == "meta":
        return None, None
    world = dist.get_world_size()
    backend = backend or dist.get_backend()
    key = (world, backend)
    if key not in _GROUPS:
        local = get_topology_group_world_size(world)
        hosts = world // local
        intra = _new_groups([[h * local + r for r in range(local)] for h in range(hosts)], backend)
        cross = _new_groups([[h * local + r for h in range(hosts)] for r in range(local)], backend)
        logger.info("rank %d: intra-host group of %d, cross-host group of %d", dist.get_rank(),
                    local, hosts)  # fmt: skip
        _GROUPS[key] = (intra, cross)
    return _GROUPS[key]


def intra_and_cross_node_pg_2D(
    env: ShardingEnv2D, device: torch.device | None = None
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """The intra and cross groups inside ``env``'s sharding groups (TorchRec's 2D layout:
    sharding group ``g`` is ranks ``g, g + step, ...``, or consecutive ranks with
    ``use_inter_host_allreduce``); node groups of ``env.node_group_size`` ranks."""
    global _NODE_GROUP_SIZE_2D
    if device is not None and torch.device(device).type == "meta":
        return None, None
    backend = dist.get_backend(env.sharding_pg)  # type: ignore[attr-defined]
    world, size = dist.get_world_size(), env.world_size
    step = world // size
    per_node = env.node_group_size or get_local_size(world)  # type: ignore[attr-defined]
    if size % per_node:
        raise ValueError(f"node group size {per_node} does not divide sharding group size {size}")
    _NODE_GROUP_SIZE_2D = per_node
    intra_lists, cross_lists = [], []
    for g in range(step):
        if env.use_inter_host_allreduce:  # type: ignore[attr-defined]
            peers = list(range(g * size, (g + 1) * size))
        else:
            peers = [step * r + g for r in range(size)]
        nodes = [peers[n * per_node : (n + 1) * per_node] for n in range(size // per_node)]
        intra_lists += nodes
        cross_lists += [[node[i] for node in nodes] for i in range(per_node)]
    return _new_groups(intra_lists, backend), _new_groups(cross_lists, backend)
