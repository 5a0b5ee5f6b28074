"""``torchrec.distributed.embeddingbag``: the sharder of `EmbeddingBagCollection` and the
awaitables, contexts and helpers around it."""

from shardkit.compat import refuse
from shardkit.distributed._module_internals import (
    EmbeddingAwaitable,
    EmbeddingBagCollectionAwaitable,
    EmbeddingBagCollectionContext,
    VariableBatchEmbeddingBagCollectionAwaitable,
    construct_output_kt,
    create_sharding_infos_by_sharding_device_group,
    get_device_from_parameter_sharding,
    replace_placement_with_meta_device,
)
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)

__all__ = [
    "EmbeddingAwaitable",
    "EmbeddingBagCollectionAwaitable",
    "EmbeddingBagCollectionContext",
    "EmbeddingBagCollectionSharder",
    "ShardedEmbeddingBagCollection",
    "VariableBatchEmbeddingBagCollectionAwaitable",
    "construct_output_kt",
    "create_sharding_infos_by_sharding_device_group",
    "get_device_from_parameter_sharding",
    "replace_placement_with_meta_device",
]

__getattr__ = refuse(
    __name__,
    {
        "EmbeddingBagSharder": "sharding a bare torch.nn.EmbeddingBag is not in shardkit; put the table in an EmbeddingBagCollection (one EmbeddingBagConfig) and shard that with EmbeddingBagCollectionSharder",
        "ShardedEmbeddingBag": "sharding a bare torch.nn.EmbeddingBag is not in shardkit; put the table in an EmbeddingBagCollection (one EmbeddingBagConfig) and shard that with EmbeddingBagCollectionSharder",
    },
)
