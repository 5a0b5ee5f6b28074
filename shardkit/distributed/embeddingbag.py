"""``torchrec.distributed.embeddingbag``: the sharder of `EmbeddingBagCollection`."""

from shardkit.sharding import EmbeddingBagCollectionSharder

__all__ = ["EmbeddingBagCollectionSharder"]
