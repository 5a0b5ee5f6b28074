"""``fbgemm_gpu.split_table_batched_embeddings_ops`` (FBGEMM's older path for the same names)."""

from shardkit.fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
from shardkit.fbgemm_gpu.split_embedding_configs import SparseType
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    CacheAlgorithm,
    EmbeddingLocation,
    PoolingMode,
)
from shardkit.fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

__all__ = [
    "BoundsCheckMode",
    "CacheAlgorithm",
    "ComputeDevice",
    "EmbeddingLocation",
    "OptimType",
    "PoolingMode",
    "SparseType",
    "SplitTableBatchedEmbeddingBagsCodegen",
]
