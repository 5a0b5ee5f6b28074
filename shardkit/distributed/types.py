"""``torchrec.distributed.types``: plans, sharding types, environments, sharders."""

from shardkit.types import (
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)

__all__ = [
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "ModuleSharder",
    "ParameterSharding",
    "ShardMetadata",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
]
