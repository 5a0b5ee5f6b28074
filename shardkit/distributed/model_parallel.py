"""``torchrec.distributed.model_parallel``: `DistributedModelParallel`, `DMPCollection` (2-D
parallelism), their data-parallel wrappers and unwrapping helpers."""

from shardkit.distributed._dmp_utils import (
    HybridEvalDMP,
    get_module,
    get_unwrapped_module,
)
from shardkit.sharding import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
    DMPCollection,
)

__all__ = [
    "DMPCollection",
    "DataParallelWrapper",
    "DefaultDataParallelWrapper",
    "DistributedModelParallel",
    "HybridEvalDMP",
    "get_module",
    "get_unwrapped_module",
]
