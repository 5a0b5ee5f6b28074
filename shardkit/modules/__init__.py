"""Embedding tables: configurations and the (unsharded) collections."""

from shardkit.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
    data_type_to_dtype,
)

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "PoolingType",
    "data_type_to_dtype",
]
