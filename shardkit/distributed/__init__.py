"""TorchRec's import paths (``torchrec.distributed.*``) for shardkit's classes.

Code written for TorchRec runs after ``torchrec`` -> ``shardkit`` in its imports. Each module
here only re-exports; the code lives in ``shardkit.planner`` and ``shardkit.sharding``.
"""

from shardkit.planner import ShardingEnv, ShardingPlan
from shardkit.sharding import DistributedModelParallel

__all__ = ["DistributedModelParallel", "ShardingEnv", "ShardingPlan"]
