"""Embedding tables: configurations and the (unsharded) collections."""

from shardkit.modules._tables import TableDict
from shardkit.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
    data_type_to_dtype,
)
from shardkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "PoolingType",
    "TableDict",
    "data_type_to_dtype",
]
