"""``fbgemm_gpu.split_table_batched_embeddings_ops_common``: FBGEMM's enums for where tables live,
how bags pool, how a cache evicts and how ids are bounds-checked (FBGEMM's members and values;
see ``shardkit.types``, where they are defined, for what shardkit does with each)."""

from shardkit.types import BoundsCheckMode, CacheAlgorithm, EmbeddingLocation, PoolingMode

__all__ = ["BoundsCheckMode", "CacheAlgorithm", "EmbeddingLocation", "PoolingMode"]
