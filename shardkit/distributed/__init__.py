"""TorchRec's import paths (``torchrec.distributed.*``) for shardkit's classes.

Code written for TorchRec runs after ``torchrec`` -> ``shardkit`` in its imports (or unchanged
under ``shardkit run``). Each module here only re-exports; the code lives in ``shardkit.types``,
``shardkit.planner`` and ``shardkit.sharding``."""

from shardkit.sharding import (
    DataLoadingThread,
    DistributedModelParallel,
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
    get_local_rank,
    get_local_size,
    get_unsharded_module_names,
    sharded_model_copy,
)
from shardkit.types import (
    Awaitable,
    ModuleSharder,
    NoWait,
    ParameterSharding,
    ShardedModule,
    ShardingEnv,
    ShardingPlan,
    ShardingPlanner,
)

__all__ = [
    "Awaitable",
    "DataLoadingThread",
    "DistributedModelParallel",
    "EvalPipelineSparseDist",
    "ModuleSharder",
    "NoWait",
    "ParameterSharding",
    "PrefetchTrainPipelineSparseDist",
    "ShardedModule",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingPlanner",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineSparseDist",
    "get_local_rank",
    "get_local_size",
    "get_unsharded_module_names",
    "sharded_model_copy",
]

# TorchRec's ``torchrec.distributed`` imports these submodules: after ``import torchrec``,
# ``torchrec.distributed.comm`` (and the others) are there, and so they are here.
from shardkit.distributed import (  # noqa: F401 (see above)
    comm,
    embedding,
    embedding_types,
    embeddingbag,
    model_parallel,
    planner,
    shard,
    sharding_plan,
    train_pipeline,
    types,
)
