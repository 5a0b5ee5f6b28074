"""``torchrec.distributed.train_pipeline.train_pipelines``: the pipelines."""

from shardkit.sharding import (
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    StagedTrainPipeline,
    TorchCompileConfig,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelinePT2,
    TrainPipelineSparseDist,
    TrainPipelineSparseDistCompAutograd,
)

__all__ = [
    "EvalPipelineSparseDist",
    "PrefetchTrainPipelineSparseDist",
    "StagedTrainPipeline",
    "TorchCompileConfig",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSparseDist",
    "TrainPipelineSparseDistCompAutograd",
]
