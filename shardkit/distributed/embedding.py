"""``torchrec.distributed.embedding``: the sharder of `EmbeddingCollection`."""

from shardkit.sharding import EmbeddingCollectionSharder

__all__ = ["EmbeddingCollectionSharder"]
