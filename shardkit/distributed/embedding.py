"""``torchrec.distributed.embedding``: the sharder of `EmbeddingCollection` and the awaitables,
contexts and helpers around it."""

from shardkit.distributed._module_internals import (
    EC_INDEX_DEDUP,
    EmbeddingCollectionAwaitable,
    EmbeddingCollectionContext,
    get_device_from_parameter_sharding,
    pad_vbe_kjt_lengths,
    set_ec_index_dedup,
)
from shardkit.distributed._module_internals import (
    create_ec_sharding_infos as create_sharding_infos_by_sharding_device_group,
)
from shardkit.distributed._module_internals import ec_index_dedup as get_ec_index_dedup
from shardkit.sharding import (
    EmbeddingCollectionSharder,
    ShardedEmbeddingCollection,
)

__all__ = [
    "EC_INDEX_DEDUP",
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionContext",
    "EmbeddingCollectionSharder",
    "ShardedEmbeddingCollection",
    "create_sharding_infos_by_sharding_device_group",
    "get_device_from_parameter_sharding",
    "get_ec_index_dedup",
    "pad_vbe_kjt_lengths",
    "set_ec_index_dedup",
]
