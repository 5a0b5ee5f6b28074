"""``torchrec.distributed.planner.shard_estimators``: storage and perf of shards (shardkit's
cost model)."""

from shardkit.compat import refuse
from shardkit.distributed.planner._components import (
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
    calculate_pipeline_io_cost,
    get_num_poolings,
)

__all__ = [
    "EmbeddingPerfEstimator",
    "EmbeddingStorageEstimator",
    "calculate_pipeline_io_cost",
    "get_num_poolings",
]

__getattr__ = refuse(
    __name__,
    {
        "EmbeddingOffloadStats": "UVM-cache statistics for FBGEMM's cached kernels; shardkit has no cache (every shard lives whole in its rank's memory)",
        "calculate_shard_storages": "TorchRec's storage formula for its FBGEMM kernels; shardkit's planner estimates storage with EmbeddingStorageEstimator (its own memory model)",
    },
)
