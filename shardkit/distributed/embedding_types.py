"""``torchrec.distributed.embedding_types``: compute kernels, sharder bases, sharded tables and
the interfaces of sharded embedding modules."""

from shardkit.distributed._embedding_types import (
    BaseEmbeddingLookup,
    BaseEmbeddingUpdate,
    BaseGroupedFeatureProcessor,
    BaseQuantEmbeddingSharder,
    DTensorMetadata,
    EmbeddingAttributes,
    GroupedEmbeddingConfig,
    InputDistOutputs,
    KJTList,
    ListOfKJTList,
    OptimType,
    ShardedConfig,
    ShardedEmbeddingTable,
    ShardedMetaConfig,
    compute_kernel_to_embedding_location,
)
from shardkit.sharding import FeatureShardingMixIn, ModuleShardingMixIn, ShardedEmbeddingModule
from shardkit.types import (
    BaseEmbeddingSharder,
    EmbeddingComputeKernel,
)

__all__ = [
    "BaseEmbeddingLookup",
    "BaseEmbeddingSharder",
    "BaseEmbeddingUpdate",
    "BaseGroupedFeatureProcessor",
    "BaseQuantEmbeddingSharder",
    "DTensorMetadata",
    "EmbeddingAttributes",
    "EmbeddingComputeKernel",
    "FeatureShardingMixIn",
    "GroupedEmbeddingConfig",
    "InputDistOutputs",
    "KJTList",
    "ListOfKJTList",
    "ModuleShardingMixIn",
    "OptimType",
    "ShardedConfig",
    "ShardedEmbeddingModule",
    "ShardedEmbeddingTable",
    "ShardedMetaConfig",
    "compute_kernel_to_embedding_location",
]
