"""From chosen options and their ranks to the `ShardingPlan` users see."""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.planner._enumerate import Option
from shardkit.planner._partition import Placement
from shardkit.planner._shards import expand, offsets_of
from shardkit.planner._tables import TableSpec
from shardkit.planner._topology import Topology
from shardkit.types import (
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    ShardPlacement,
    placement,
)

__all__ = ["build_plan", "shard_layout"]


def shard_layout(option: Option) -> list[tuple[list[int], list[int]]]:
    """(offsets, sizes) of each shard, in shard order: column blocks, each cut into row shards."""
    rows, cols = expand(option.row_groups), expand(option.col_groups)
    row_offsets, col_offsets = offsets_of(rows), offsets_of(cols)
    return [
        ([row_offset, col_offset], [num_rows, num_cols])
        for col_offset, num_cols in zip(col_offsets, cols)
        for row_offset, num_rows in zip(row_offsets, rows)
    ]


def build_plan(
    tables: Sequence[TableSpec],
    proposal: Sequence[Option],
    where: Placement,
    topology: Topology,
) -> ShardingPlan:
    """The plan of a placed proposal, modules and tables in their original order."""
    places = [
        placement(topology.compute_device, rank, topology.local_world_size)
        for rank in range(topology.world_size)
    ]
    modules: dict[str, EmbeddingModuleShardingPlan] = {}
    for table, option, ranks in zip(tables, proposal, where.ranks):
        module = modules.setdefault(table.path, EmbeddingModuleShardingPlan())
        module[table.name] = _parameter_sharding(option, ranks, places)
    return ShardingPlan(modules)


def _parameter_sharding(
    option: Option, ranks: list[int] | None, places: list[ShardPlacement]
) -> ParameterSharding:
    world = list(range(len(places)))
    if option.sharding_type == ShardingType.DATA_PARALLEL:
        return ParameterSharding(option.sharding_type, option.kernel, world, None)
    ranks = world if ranks is None else ranks
    shards = [
        ShardMetadata(offsets, sizes, places[rank])
        for (offsets, sizes), rank in zip(shard_layout(option), ranks, strict=True)
    ]
    return ParameterSharding(
        option.sharding_type, option.kernel, list(ranks), EnumerableShardingSpec(shards)
    )
