"""``torchrec.distributed.planner.enumerators``: every way to shard each table."""

from shardkit.distributed.planner._components import (
    GUARDED_COMPUTE_KERNELS,
    GUARDED_SHARDING_TYPES_FOR_FP_MODULES,
    EmbeddingEnumerator,
    get_partition_by_type,
)

__all__ = [
    "GUARDED_COMPUTE_KERNELS",
    "GUARDED_SHARDING_TYPES_FOR_FP_MODULES",
    "EmbeddingEnumerator",
    "get_partition_by_type",
]
