"""``torchrec.distributed.comm``: where a rank sits among hosts, and the intra- and cross-host
process groups."""

from shardkit.distributed._comm_helpers import (
    get_group_rank,
    get_local_rank,
    get_local_size,
    get_node_group_size,
    get_num_groups,
    get_topology_domain_multiple,
    get_topology_group_world_size,
    intra_and_cross_node_pg,
    intra_and_cross_node_pg_2D,
)

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
