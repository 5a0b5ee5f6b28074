"""Sharded embedding modules. For now: the sharder descriptors the planner uses, and plans
written by hand (``construct_module_sharding_plan``)."""

from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._sharding_plan import (
    ParameterShardingGenerator,
    apply_to_all,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    get_default_sharders,
    grid_shard,
    row_wise,
    table_row_wise,
    table_wise,
)

__all__ = [
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "ParameterShardingGenerator",
    "apply_to_all",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "grid_shard",
    "row_wise",
    "table_row_wise",
    "table_wise",
]
