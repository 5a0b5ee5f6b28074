"""Optimizers fused into the backward of embedding tables."""

from shardkit.optim._combined import CombinedOptimizer
from shardkit.optim._config import EmbOptimType, FusedOptimizerConfig, RowWiseAdagrad
from shardkit.optim._fused import FusedOptimizer, FusedTable, RowOptimizer
from shardkit.optim._in_backward import apply_optimizer_in_backward, fused_config_of

__all__ = [
    "CombinedOptimizer",
    "EmbOptimType",
    "FusedOptimizer",
    "FusedOptimizerConfig",
    "FusedTable",
    "RowOptimizer",
    "RowWiseAdagrad",
    "apply_optimizer_in_backward",
    "fused_config_of",
]
