"""TorchRec's ``torchrec.distributed.train_pipeline``."""

from shardkit.sharding.train_pipeline import DataExhaustedError, TrainPipelineSparseDist

__all__ = ["DataExhaustedError", "TrainPipelineSparseDist"]
