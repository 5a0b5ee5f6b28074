"""TorchRec's ``torchrec.distributed.model_parallel``."""

from shardkit.sharding.model_parallel import DistributedModelParallel

__all__ = ["DistributedModelParallel"]
