"""The sharding vocabulary every layer shares: how a table is cut (`ShardingType`), which kernel
looks it up (`EmbeddingComputeKernel`), plans (`ShardingPlan` and its parts), the ranks a
sharded module runs on (`ShardingEnv`) and what a sharder can do (`ModuleSharder`).

Plain data and descriptors with TorchRec's names; nothing here plans, shards or communicates.
The planner (``shardkit.planner``) produces plans, ``shardkit.sharding`` carries them out, and
``shardkit.distributed`` re-exports these names at TorchRec's import paths.
"""

from shardkit.types._enums import EmbeddingComputeKernel, ParsableEnum, ShardingType
from shardkit.types._env import ShardingEnv
from shardkit.types._plan import (
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
    ShardPlacement,
    placement,
)
from shardkit.types._sharder import (
    BaseEmbeddingSharder,
    ModuleSharder,
    embedding_compute_kernels,
    embedding_sharding_types,
)
from shardkit.types._shards import split_evenly

__all__ = [
    "BaseEmbeddingSharder",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "ModuleSharder",
    "ParameterSharding",
    "ParsableEnum",
    "ShardMetadata",
    "ShardPlacement",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
    "embedding_compute_kernels",
    "embedding_sharding_types",
    "placement",
    "split_evenly",
]
