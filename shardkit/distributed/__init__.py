"""TorchRec's import paths (``torchrec.distributed.*``) for shardkit's classes.

Code written for TorchRec runs after ``torchrec`` -> ``shardkit`` in its imports (or unchanged
under ``shardkit run``). This package is the compatibility edge: each public module here only
re-exports, from ``shardkit.types``, ``shardkit.planner`` and ``shardkit.sharding``, or from this
package's private modules, which hold TorchRec's vocabulary that shardkit's own code does not
use (`_embedding_types`, `_module_internals`, `_tracing`, `_dmp_utils`, `_plan_helpers`,
`_comm_helpers`) and
are built over the packages' public names. Nothing below imports from here."""

from shardkit.distributed._comm_helpers import get_local_rank, get_local_size
from shardkit.distributed._dmp_utils import (
    get_unsharded_module_names,
    sharded_model_copy,
)
from shardkit.sharding import (
    DataLoadingThread,
    DistributedModelParallel,
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
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
