"""Sharded embedding modules, their sharders, plans written by hand, `DistributedModelParallel`,
the train pipelines and the composable `shard`/`shard_modules` (``shardkit.distributed``
re-exports these at TorchRec's paths, beside TorchRec's vocabulary that only the edge holds).

The private subpackages group the mechanism by concern: `_collection` (the sharded
collections), `_dist` (their input and output exchanges), `_pipeline` (the train pipelines).

`ShardedCollection` (the base of both sharded collections), `fused_state`, `load_fused_state`
and `quiet_sharded_tensor` are the interface ``shardkit.checkpoint`` saves and loads them by;
`bucket_rows`, the row bucketing of the row-wise input dist, is shared with
``shardkit.inference``'s row-wise serving.
"""

from shardkit.sharding._collection._base import ShardedCollection
from shardkit.sharding._collection._embedding import ShardedEmbeddingCollection
from shardkit.sharding._collection._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding._collection._state import fused_state, load_fused_state, quiet_sharded_tensor
from shardkit.sharding._data_parallel import DataParallelWrapper, DefaultDataParallelWrapper
from shardkit.sharding._dist._codecs import (
    CommType,
    NoOpQuantizedCommCodec,
    QCommsConfig,
    QuantizedCommCodec,
    QuantizedCommCodecs,
    comm_type_to_sparse_type,
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
)
from shardkit.sharding._dist._input import InputError
from shardkit.sharding._dist._row_buckets import bucket_rows
from shardkit.sharding._dmp_collection import DMPCollection
from shardkit.sharding._embedding_module import (
    FeatureShardingMixIn,
    ModuleShardingMixIn,
    ShardedEmbeddingModule,
)
from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._fp_embeddingbag import (
    FeatureProcessedEmbeddingBagCollectionSharder,
    ShardedFeatureProcessedEmbeddingBagCollection,
)
from shardkit.sharding._fully_shard_wrapper import FullyShardDataParallelWrapper
from shardkit.sharding._mc_collection import ShardedManagedCollisionCollection
from shardkit.sharding._mc_embedding import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingCollection,
)
from shardkit.sharding._model_parallel import DistributedModelParallel
from shardkit.sharding._pipeline._train import (
    DataExhaustedError,
    TorchCompileConfig,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineContext,
    TrainPipelineSparseDist,
)
from shardkit.sharding._pipeline._variants import (
    DataLoadingThread,
    EvalPipelineSparseDist,
    GradientAccumulationConfig,
    GradientAccumulationWrapper,
    PrefetchTrainPipelineSparseDist,
    SparseDataDistUtil,
    StagedTrainPipeline,
    TrainPipelineFusedSparseDist,
    TrainPipelinePT2,
    TrainPipelineSparseDistCompAutograd,
)
from shardkit.sharding._shard import shard, shard_modules
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

__all__ = [
    "CommType",
    "DMPCollection",
    "DataExhaustedError",
    "DataLoadingThread",
    "DataParallelWrapper",
    "DefaultDataParallelWrapper",
    "DistributedModelParallel",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionSharder",
    "EvalPipelineSparseDist",
    "FeatureProcessedEmbeddingBagCollectionSharder",
    "FeatureShardingMixIn",
    "FullyShardDataParallelWrapper",
    "GradientAccumulationConfig",
    "GradientAccumulationWrapper",
    "InputError",
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ModuleShardingMixIn",
    "NoOpQuantizedCommCodec",
    "ParameterShardingGenerator",
    "PrefetchTrainPipelineSparseDist",
    "QCommsConfig",
    "QuantizedCommCodec",
    "QuantizedCommCodecs",
    "ShardedCollection",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedEmbeddingModule",
    "ShardedFeatureProcessedEmbeddingBagCollection",
    "ShardedManagedCollisionCollection",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
    "SparseDataDistUtil",
    "StagedTrainPipeline",
    "TorchCompileConfig",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSparseDist",
    "TrainPipelineSparseDistCompAutograd",
    "apply_to_all",
    "bucket_rows",
    "column_wise",
    "comm_type_to_sparse_type",
    "construct_module_sharding_plan",
    "data_parallel",
    "fused_state",
    "get_default_sharders",
    "get_qcomm_codecs",
    "get_qcomm_codecs_registry",
    "grid_shard",
    "load_fused_state",
    "quiet_sharded_tensor",
    "row_wise",
    "shard",
    "shard_modules",
    "table_row_wise",
    "table_wise",
]
