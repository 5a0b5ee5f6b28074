"""``torchrec.distributed.train_pipeline``: the train and eval pipelines and their parts."""

from shardkit.distributed._tracing import (
    ArgInfo,
    ArgInfoStepFactory,
    CallArgs,
    Tracer,
)
from shardkit.sharding import (
    DataExhaustedError,
    DataLoadingThread,
    EvalPipelineSparseDist,
    GradientAccumulationConfig,
    GradientAccumulationWrapper,
    PrefetchTrainPipelineSparseDist,
    SparseDataDistUtil,
    StagedTrainPipeline,
    TorchCompileConfig,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineContext,
    TrainPipelineFusedSparseDist,
    TrainPipelinePT2,
    TrainPipelineSparseDist,
    TrainPipelineSparseDistCompAutograd,
)

__all__ = [
    "ArgInfo",
    "ArgInfoStepFactory",
    "CallArgs",
    "DataExhaustedError",
    "DataLoadingThread",
    "EvalPipelineSparseDist",
    "GradientAccumulationConfig",
    "GradientAccumulationWrapper",
    "PrefetchTrainPipelineSparseDist",
    "SparseDataDistUtil",
    "StagedTrainPipeline",
    "TorchCompileConfig",
    "Tracer",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineFusedSparseDist",
    "TrainPipelinePT2",
    "TrainPipelineSparseDist",
    "TrainPipelineSparseDistCompAutograd",
]
