"""``torchrec.distributed.fp_embeddingbag``: the sharder of
`FeatureProcessedEmbeddingBagCollection` (every sharding type, row-wise included)."""

from shardkit.sharding import (
    FeatureProcessedEmbeddingBagCollectionSharder,
    ShardedFeatureProcessedEmbeddingBagCollection,
)

__all__ = [
    "FeatureProcessedEmbeddingBagCollectionSharder",
    "ShardedFeatureProcessedEmbeddingBagCollection",
]
