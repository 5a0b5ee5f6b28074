"""``torchrec.distributed.embedding``: the sharder of `EmbeddingCollection`."""

from shardkit.sharding import EmbeddingCollectionSharder, ShardedEmbeddingCollection

__all__ = ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"]
