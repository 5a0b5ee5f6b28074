"""``torchrec.distributed.mc_embeddingbag``: the sharder of `ManagedCollisionEmbeddingBagCollection`
(row-wise and table-wise, on CPU and GPU)."""

from shardkit.sharding import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
)

__all__ = [
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ShardedManagedCollisionEmbeddingBagCollection",
]
