"""Sharded embedding modules, their sharders, plans written by hand, `DistributedModelParallel`,
the train pipelines, the composable `shard`/`shard_modules`, and TorchRec's smaller names
around them (``shardkit.distributed`` re-exports these at TorchRec's paths).

`ShardedCollection` (the base of both sharded collections), `fused_state`, `load_fused_state`
and `quiet_sharded_tensor` are the interface ``shardkit.checkpoint`` saves and loads them by;
`bucket_rows`, the row bucketing of the row-wise input dist, is shared with
``shardkit.inference``'s row-wise serving.
"""

from shardkit.sharding._collection._base import ShardedCollection
from shardkit.sharding._collection._embedding import ShardedEmbeddingCollection
from shardkit.sharding._collection._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding._collection._state import fused_state, load_fused_state, quiet_sharded_tensor
from shardkit.sharding._comm_helpers import (
    get_group_rank,
    get_local_rank,
    get_local_size,
    get_node_group_size,
    get_num_groups,
    get_topology_domain_multiple,
    get_topology_group_world_size,
    intra_and_cross_node_pg,
    intra_and_cross_node_pg_2D,
)
from shardkit.sharding._data_parallel import DataParallelWrapper, DefaultDataParallelWrapper
from shardkit.sharding._dist._input import InputError
from shardkit.sharding._dist._row_buckets import bucket_rows
from shardkit.sharding._dmp_utils import (
    HybridEvalDMP,
    get_module,
    get_unsharded_module_names,
    get_unwrapped_module,
    sharded_model_copy,
)
from shardkit.sharding._embedding_module import (
    FeatureShardingMixIn,
    ModuleShardingMixIn,
    ShardedEmbeddingModule,
)
from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._embedding_types import (
    BaseEmbeddingLookup,
    BaseEmbeddingUpdate,
    BaseGroupedFeatureProcessor,
    BaseQuantEmbeddingSharder,
    DTensorMetadata,
    EmbeddingAttributes,
    GroupedEmbeddingConfig,
    InputDistOutputs,
    KJTList,
    ListOfKJTList,
    OptimType,
    ShardedConfig,
    ShardedEmbeddingTable,
    ShardedMetaConfig,
    compute_kernel_to_embedding_location,
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
from shardkit.sharding._module_internals import (
    EC_INDEX_DEDUP,
    EmbeddingAwaitable,
    EmbeddingBagCollectionAwaitable,
    EmbeddingBagCollectionContext,
    EmbeddingCollectionAwaitable,
    EmbeddingCollectionContext,
    EmbeddingShardingInfo,
    VariableBatchEmbeddingBagCollectionAwaitable,
    construct_output_kt,
    create_ec_sharding_infos,
    create_sharding_infos_by_sharding_device_group,
    ec_index_dedup,
    get_device_from_parameter_sharding,
    pad_vbe_kjt_lengths,
    replace_placement_with_meta_device,
    set_ec_index_dedup,
)
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
from shardkit.sharding._plan_helpers import (
    calculate_shard_sizes_and_offsets,
    get_module_to_default_sharders,
    get_sharding_constructor_from_type,
    placement_helper,
    placement_string,
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
from shardkit.sharding._tracing import ArgInfo, ArgInfoStepFactory, CallArgs, Tracer

__all__ = [
    "EC_INDEX_DEDUP",
    "ArgInfo",
    "ArgInfoStepFactory",
    "BaseEmbeddingLookup",
    "BaseEmbeddingUpdate",
    "BaseGroupedFeatureProcessor",
    "BaseQuantEmbeddingSharder",
    "CallArgs",
    "DTensorMetadata",
    "DataExhaustedError",
    "DataLoadingThread",
    "DataParallelWrapper",
    "DefaultDataParallelWrapper",
    "DistributedModelParallel",
    "EmbeddingAttributes",
    "EmbeddingAwaitable",
    "EmbeddingBagCollectionAwaitable",
    "EmbeddingBagCollectionContext",
    "EmbeddingBagCollectionSharder",
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionContext",
    "EmbeddingCollectionSharder",
    "EmbeddingShardingInfo",
    "EvalPipelineSparseDist",
    "FeatureProcessedEmbeddingBagCollectionSharder",
    "FeatureShardingMixIn",
    "FullyShardDataParallelWrapper",
    "GradientAccumulationConfig",
    "GradientAccumulationWrapper",
    "GroupedEmbeddingConfig",
    "HybridEvalDMP",
    "InputDistOutputs",
    "InputError",
    "KJTList",
    "ListOfKJTList",
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ModuleShardingMixIn",
    "OptimType",
    "ParameterShardingGenerator",
    "PrefetchTrainPipelineSparseDist",
    "ShardedCollection",
    "ShardedConfig",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedEmbeddingModule",
    "ShardedEmbeddingTable",
    "ShardedFeatureProcessedEmbeddingBagCollection",
    "ShardedManagedCollisionCollection",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
    "ShardedMetaConfig",
    "SparseDataDistUtil",
    "StagedTrainPipeline",
    "TorchCompileConfig",
    "Tracer",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSparseDist",
    "TrainPipelineSparseDistCompAutograd",
    "VariableBatchEmbeddingBagCollectionAwaitable",
    "apply_to_all",
    "bucket_rows",
    "calculate_shard_sizes_and_offsets",
    "column_wise",
    "compute_kernel_to_embedding_location",
    "construct_module_sharding_plan",
    "construct_output_kt",
    "create_ec_sharding_infos",
    "create_sharding_infos_by_sharding_device_group",
    "data_parallel",
    "ec_index_dedup",
    "fused_state",
    "get_default_sharders",
    "get_device_from_parameter_sharding",
    "get_group_rank",
    "get_local_rank",
    "get_local_size",
    "get_module",
    "get_module_to_default_sharders",
    "get_node_group_size",
    "get_num_groups",
    "get_sharding_constructor_from_type",
    "get_topology_domain_multiple",
    "get_topology_group_world_size",
    "get_unsharded_module_names",
    "get_unwrapped_module",
    "grid_shard",
    "intra_and_cross_node_pg",
    "intra_and_cross_node_pg_2D",
    "load_fused_state",
    "pad_vbe_kjt_lengths",
    "placement_helper",
    "placement_string",
    "quiet_sharded_tensor",
    "replace_placement_with_meta_device",
    "row_wise",
    "set_ec_index_dedup",
    "shard",
    "shard_modules",
    "sharded_model_copy",
    "table_row_wise",
    "table_wise",
]
