"""``torchrec.distributed.model_parallel``: `DistributedModelParallel`, its data-parallel
wrappers and unwrapping helpers."""

from shardkit.compat import refuse
from shardkit.distributed._dmp_utils import (
    HybridEvalDMP,
    get_module,
    get_unwrapped_module,
)
from shardkit.sharding import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)

__all__ = [
    "DataParallelWrapper",
    "DefaultDataParallelWrapper",
    "DistributedModelParallel",
    "HybridEvalDMP",
    "get_module",
    "get_unwrapped_module",
]

__getattr__ = refuse(
    __name__,
    {
        "DMPCollection": "2D parallelism (sharding groups replicated across replica groups) is not in shardkit; use DistributedModelParallel over all ranks",
    },
)
