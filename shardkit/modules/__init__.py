"""Embedding tables: configurations and the (unsharded) collections.

The batched kernel (`BatchedTables`, `lookup`, its inputs from `kernel_input` and
`mean_as_weights`) and the functions that read and build tables (`collection_tables`,
`stack_tables`, `fused_tables`) are the interface the sharded modules and the planner use; they
read nothing else of a collection.
"""

from shardkit.modules._inputs import kernel_input, mean_as_weights
from shardkit.modules._kernel import BatchedTables, lookup
from shardkit.modules._tables import (
    CollectionTables,
    TableDict,
    collection_tables,
    fused_tables,
    stack_tables,
)
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
    "BatchedTables",
    "CollectionTables",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "PoolingType",
    "TableDict",
    "collection_tables",
    "data_type_to_dtype",
    "fused_tables",
    "kernel_input",
    "lookup",
    "mean_as_weights",
    "stack_tables",
]
