"""``torchrec.distributed.embeddingbag``: the sharder of `EmbeddingBagCollection`."""

from shardkit.sharding import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection

__all__ = ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"]
