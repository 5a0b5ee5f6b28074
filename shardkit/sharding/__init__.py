"""Sharded embedding modules, their sharders, plans written by hand, and
`DistributedModelParallel`.

`ShardedCollection` (the base of both sharded collections), `fused_state`, `load_fused_state`
and `quiet_sharded_tensor` are the interface ``shardkit.checkpoint`` saves and loads them by.
"""

from shardkit.sharding._collection import ShardedCollection
from shardkit.sharding._embedding import ShardedEmbeddingCollection
from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding._fp_embeddingbag import (
    FeatureProcessedEmbeddingBagCollectionSharder,
    ShardedFeatureProcessedEmbeddingBagCollection,
)
from shardkit.sharding._input_dist import InputError
from shardkit.sharding._mc_collection import ShardedManagedCollisionCollection
from shardkit.sharding._mc_embedding import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingCollection,
)
from shardkit.sharding._model_parallel import DistributedModelParallel
from shardkit.sharding._sharding_plan import (
    ParameterShardingGenerator,
    apply_to_all,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    get_default_sharders,
    grid_shard,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.sharding._state import fused_state, load_fused_state, quiet_sharded_tensor
from shardkit.sharding._train_pipeline import DataExhaustedError, TrainPipelineSparseDist

__all__ = [
    "DataExhaustedError",
    "DistributedModelParallel",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "FeatureProcessedEmbeddingBagCollectionSharder",
    "InputError",
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ParameterShardingGenerator",
    "ShardedCollection",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedFeatureProcessedEmbeddingBagCollection",
    "ShardedManagedCollisionCollection",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
    "TrainPipelineSparseDist",
    "apply_to_all",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "fused_state",
    "get_default_sharders",
    "grid_shard",
    "load_fused_state",
    "quiet_sharded_tensor",
    "row_wise",
    "table_row_wise",
    "table_wise",
]
