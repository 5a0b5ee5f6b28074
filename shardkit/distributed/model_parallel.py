"""TorchRec's ``torchrec.distributed.model_parallel``."""

from shardkit.sharding import DistributedModelParallel

__all__ = ["DistributedModelParallel"]
