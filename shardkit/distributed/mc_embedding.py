"""``torchrec.distributed.mc_embedding``: the sharder of `ManagedCollisionEmbeddingCollection`
(row-wise and table-wise, on CPU and GPU)."""

from shardkit.sharding import (
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingCollection,
)

__all__ = [
    "ManagedCollisionEmbeddingCollectionSharder",
    "ShardedManagedCollisionEmbeddingCollection",
]
