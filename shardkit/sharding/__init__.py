"""Sharded embedding modules, their sharders, plans written by hand, and
`DistributedModelParallel`."""

from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._input_dist import InputError
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
from shardkit.sharding.embedding import ShardedEmbeddingCollection
from shardkit.sharding.embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding.model_parallel import DistributedModelParallel
from shardkit.sharding.train_pipeline import DataExhaustedError, TrainPipelineSparseDist

__all__ = [
    "DataExhaustedError",
    "DistributedModelParallel",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "InputError",
    "ParameterShardingGenerator",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "TrainPipelineSparseDist",
    "apply_to_all",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "grid_shard",
    "row_wise",
    "table_row_wise",
    "table_wise",
]
