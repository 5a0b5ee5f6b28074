"""``torchrec.distributed.sharding_plan``: plans written by hand."""

from shardkit.sharding import (
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
