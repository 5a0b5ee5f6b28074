"""Optimizers: fused into the backward of embedding tables, keyed by parameter name, and
TorchRec's wrappers (warm-up, gradient clipping), at TorchRec's paths (``torchrec.optim.*``)."""

# The submodule first, then the function over its name: `shardkit.optim.apply_optimizer_in_backward`
# is the function, as in TorchRec.
from shardkit.compat import refuse
from shardkit.optim import apply_optimizer_in_backward as _submodule  # noqa: F401 (see above)
from shardkit.optim._config import EmbOptimType, FusedOptimizerConfig
from shardkit.optim._fused import FusedOptimizer, FusedTable, RowOptimizer
from shardkit.optim._in_backward import apply_optimizer_in_backward, fused_config_of
from shardkit.optim.clipping import GradientClipping, GradientClippingOptimizer
from shardkit.optim.fused import FusedOptimizerModule
from shardkit.optim.keyed import (
    CombinedOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    OptimizerWrapper,
)
from shardkit.optim.optimizers import (
    LAMB,
    SGD,
    Adagrad,
    Adam,
    LarsSGD,
    PartialRowWiseAdam,
    PartialRowWiseLAMB,
)
from shardkit.optim.rowwise_adagrad import RowWiseAdagrad
from shardkit.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage

__all__ = [
    "LAMB",
    "SGD",
    "Adagrad",
    "Adam",
    "CombinedOptimizer",
    "EmbOptimType",
    "FusedOptimizer",
    "FusedOptimizerConfig",
    "FusedOptimizerModule",
    "FusedTable",
    "GradientClipping",
    "GradientClippingOptimizer",
    "KeyedOptimizer",
    "KeyedOptimizerWrapper",
    "LarsSGD",
    "OptimizerWrapper",
    "PartialRowWiseAdam",
    "PartialRowWiseLAMB",
    "RowOptimizer",
    "RowWiseAdagrad",
    "WarmupOptimizer",
    "WarmupPolicy",
    "WarmupStage",
    "apply_optimizer_in_backward",
    "fused_config_of",
]

__getattr__ = refuse(
    __name__,
    {
        "SemisyncOptimizer": "cross-region semi-synchronous training (DiLoCo) is not in "
        "shardkit; use CombinedOptimizer of the local optimizers",
    },
)
