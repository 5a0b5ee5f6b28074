"""TorchRec's ``torchrec.distributed.train_pipeline``."""

from shardkit.sharding import DataExhaustedError, TrainPipelineSparseDist

__all__ = ["DataExhaustedError", "TrainPipelineSparseDist"]
