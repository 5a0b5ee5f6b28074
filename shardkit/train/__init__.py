"""The main job: train a recommendation model end to end (``shardkit train``)."""

from shardkit.train._build import model_from_state_dict, table_model
from shardkit.train._config import (
    CRITEO_FORMATS,
    ID_MAPPINGS,
    DataSource,
    DenseOptimizer,
    DenseSharding,
    ModelKind,
    TrainConfig,
)
from shardkit.train._loop import train_rank
from shardkit.train._prepare import Prepared, prepare
from shardkit.train._run import run

__all__ = [
    "CRITEO_FORMATS",
    "ID_MAPPINGS",
    "DataSource",
    "DenseOptimizer",
    "DenseSharding",
    "ModelKind",
    "Prepared",
    "TrainConfig",
    "model_from_state_dict",
    "prepare",
    "run",
    "table_model",
    "train_rank",
]
