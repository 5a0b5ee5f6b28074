"""Optimizers keyed by parameter name (``torchrec.optim.keyed``): see [Note: keyed optimizer
state] in `shardkit.optim._keyed`."""

from shardkit.optim._combined import CombinedOptimizer
from shardkit.optim._keyed import KeyedOptimizer
from shardkit.optim._wrappers import KeyedOptimizerWrapper, OptimizerWrapper

__all__ = ["CombinedOptimizer", "KeyedOptimizer", "KeyedOptimizerWrapper", "OptimizerWrapper"]
