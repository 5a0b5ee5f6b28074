"""The sharding vocabulary every layer shares: how a table is cut (`ShardingType`), which kernel
looks it up (`EmbeddingComputeKernel`), plans (`ShardingPlan` and its parts), the ranks a
sharded module runs on (`ShardingEnv`), what a sharder can do (`ModuleSharder`), the interfaces
of sharded modules and planners, awaitables, and TorchRec's smaller enums and settings
(``torchrec.distributed.types``), FBGEMM's enums and quantized-comm codecs; and the helpers that
print plans as tables (`format_columns`, `format_ranks`, `module_label`).

Plain data and descriptors with TorchRec's names; nothing here plans, shards or communicates.
The planner (``shardkit.planner``) produces plans, ``shardkit.sharding`` carries them out, and
``shardkit.distributed`` re-exports these names at TorchRec's import paths.
"""

from shardkit.types._awaitable import (
    Awaitable,
    DeviceToHostTensorAwaitable,
    GenericMeta,
    GetItemLazyAwaitable,
    LazyAwaitable,
    LazyGetItemMixin,
    LazyNoWait,
    NoWait,
    scope,
)
from shardkit.types._enums import EmbeddingComputeKernel, ParsableEnum, ShardingType
from shardkit.types._env import (
    DMPCollectionConfig,
    DMPCollectionContext,
    ShardingEnv,
    ShardingEnv2D,
)
from shardkit.types._fbgemm import (
    BoundsCheckMode,
    CacheAlgorithm,
    EmbeddingLocation,
    PoolingMode,
    SparseType,
)
from shardkit.types._params import (
    CacheParams,
    CacheStatistics,
    CommOp,
    ComputeDevice,
    ComputeKernel,
    EmbeddingEvent,
    KeyValueParams,
    ModuleShardingPlan,
    ObjectPoolShardingPlan,
    ObjectPoolShardingType,
    ParameterStorage,
    PipelineType,
    ShardingBucketMetadata,
    ShardingStrategy,
    StorageUsageType,
    compute_storage_usage,
    get_tensor_size_bytes,
    rank_device,
)
from shardkit.types._plan import (
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
    ShardPlacement,
    placement,
    refuse_kernel_settings,
    validate_module_plan,
)
from shardkit.types._plan_text import format_columns, format_ranks, module_label
from shardkit.types._qcomm import (
    CommType,
    NoOpQuantizedCommCodec,
    QCommsConfig,
    QuantizedCommCodec,
    QuantizedCommCodecs,
    comm_type_to_sparse_type,
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
    nonempty_codecs,
)
from shardkit.types._sharded_module import (
    NullShardedModuleContext,
    NullShardingContext,
    ShardedModule,
    ShardingPlanner,
)
from shardkit.types._sharder import (
    BaseEmbeddingSharder,
    ModuleSharder,
    embedding_compute_kernels,
    embedding_sharding_types,
)
from shardkit.types._shards import split_evenly

__all__ = [
    "Awaitable",
    "BaseEmbeddingSharder",
    "BoundsCheckMode",
    "CacheAlgorithm",
    "CacheParams",
    "CacheStatistics",
    "CommOp",
    "CommType",
    "ComputeDevice",
    "ComputeKernel",
    "DMPCollectionConfig",
    "DMPCollectionContext",
    "DeviceToHostTensorAwaitable",
    "EmbeddingComputeKernel",
    "EmbeddingEvent",
    "EmbeddingLocation",
    "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec",
    "GenericMeta",
    "GetItemLazyAwaitable",
    "KeyValueParams",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "ModuleSharder",
    "ModuleShardingPlan",
    "NoOpQuantizedCommCodec",
    "NoWait",
    "NullShardedModuleContext",
    "NullShardingContext",
    "ObjectPoolShardingPlan",
    "ObjectPoolShardingType",
    "ParameterSharding",
    "ParameterStorage",
    "ParsableEnum",
    "PipelineType",
    "PoolingMode",
    "QCommsConfig",
    "QuantizedCommCodec",
    "QuantizedCommCodecs",
    "ShardMetadata",
    "ShardPlacement",
    "ShardedModule",
    "ShardingBucketMetadata",
    "ShardingEnv",
    "ShardingEnv2D",
    "ShardingPlan",
    "ShardingPlanner",
    "ShardingStrategy",
    "ShardingType",
    "SparseType",
    "StorageUsageType",
    "comm_type_to_sparse_type",
    "compute_storage_usage",
    "embedding_compute_kernels",
    "embedding_sharding_types",
    "format_columns",
    "format_ranks",
    "get_qcomm_codecs",
    "get_qcomm_codecs_registry",
    "get_tensor_size_bytes",
    "module_label",
    "nonempty_codecs",
    "placement",
    "rank_device",
    "refuse_kernel_settings",
    "scope",
    "split_evenly",
    "validate_module_plan",
]
