"""TorchRec's import paths (``torchrec.distributed.*``) for shardkit's classes.

Code written for TorchRec runs after ``torchrec`` -> ``shardkit`` in its imports. Each module
here only re-exports; the code lives in ``shardkit.types``, ``shardkit.planner`` and
``shardkit.sharding``.
"""

from shardkit.sharding import DistributedModelParallel
from shardkit.types import ShardingEnv, ShardingPlan

__all__ = ["DistributedModelParallel", "ShardingEnv", "ShardingPlan"]
