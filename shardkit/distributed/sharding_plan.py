"""``torchrec.distributed.sharding_plan``: plans written by hand, and their helpers."""

from shardkit.distributed._plan_helpers import (
    calculate_shard_sizes_and_offsets,
    column_wise,
    data_parallel,
    get_module_to_default_sharders,
    get_sharding_constructor_from_type,
    grid_shard,
    placement_helper,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.distributed._plan_helpers import placement_string as placement
from shardkit.sharding import (
    ParameterShardingGenerator,
    apply_to_all,
    construct_module_sharding_plan,
    get_default_sharders,
)

__all__ = [
    "ParameterShardingGenerator",
    "apply_to_all",
    "calculate_shard_sizes_and_offsets",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "get_module_to_default_sharders",
    "get_sharding_constructor_from_type",
    "grid_shard",
    "placement",
    "placement_helper",
    "row_wise",
    "table_row_wise",
    "table_wise",
]
