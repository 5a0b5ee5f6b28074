"""Embedding tables: configurations and the (unsharded) collections.

The batched kernel (`BatchedTables`, `lookup`, its inputs from `kernel_input` and
`mean_as_weights`), the functions that read and build tables (`collection_tables`,
`stack_tables`, `fused_tables`) and the managed-collision remappers' `with_values` are the
interface the sharded modules and the planner use; they read nothing else of a collection.
"""

# TorchRec's `torchrec.modules` imports these submodules: `import torchrec` then
# `torchrec.modules.mlp.MLP` works, and so it does here.
from shardkit.modules import (  # noqa: F401 (see above)
    activation,
    crossnet,
    deepfm,
    embedding_configs,
    embedding_modules,
    mlp,
    utils,
)
from shardkit.modules._inputs import kernel_input, mean_as_weights
from shardkit.modules._kernel import BatchedTables, lookup
from shardkit.modules._mc_collection import with_values
from shardkit.modules._tables import (
    CollectionTables,
    TableDict,
    collection_tables,
    fused_tables,
    stack_tables,
)
from shardkit.modules._traced import ids_per_key_unbacked, key_of_bag, traced_group_input
from shardkit.modules._vbe import expand_bags, expand_variable_batch
from shardkit.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbeddingTableConfig,
    PoolingType,
    data_type_to_dtype,
)
from shardkit.modules.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingBagCollectionInterface,
    EmbeddingCollection,
    get_embedding_names_by_table,
)

__all__ = [
    "BaseEmbeddingConfig",
    "BatchedTables",
    "CollectionTables",
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagCollectionInterface",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "EmbeddingTableConfig",
    "PoolingType",
    "TableDict",
    "collection_tables",
    "data_type_to_dtype",
    "expand_bags",
    "expand_variable_batch",
    "fused_tables",
    "get_embedding_names_by_table",
    "ids_per_key_unbacked",
    "kernel_input",
    "key_of_bag",
    "lookup",
    "mean_as_weights",
    "stack_tables",
    "traced_group_input",
    "with_values",
]
