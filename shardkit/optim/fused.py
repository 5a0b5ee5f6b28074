"""Optimizers whose update runs inside backward (``torchrec.optim.fused``).

`FusedOptimizer` is shardkit's optimizer of embedding tables (a `KeyedOptimizer` whose ``step``
does nothing: the kernel has already stepped); `EmptyFusedOptimizer` holds nothing (the marker
sharded tables carry in ``_in_backward_optimizers``); `FusedOptimizerModule` is the interface of
modules that have one.
"""

from __future__ import annotations

import abc
from typing import Any

from shardkit.optim._fused import FusedOptimizer
from shardkit.optim._keyed import KeyedOptimizer

__all__ = ["EmptyFusedOptimizer", "FusedOptimizer", "FusedOptimizerModule"]


class EmptyFusedOptimizer(KeyedOptimizer):
    """A fused optimizer with no parameters: ``step`` and ``zero_grad`` do nothing."""

    def __init__(self) -> None:
        super().__init__({}, {}, [])

    def step(self, closure: Any = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to zero."""


class FusedOptimizerModule(abc.ABC):
    """A module that updates its parameters during backward and shows the optimizer doing it."""

    @property
    @abc.abstractmethod
    def fused_optimizer(self) -> KeyedOptimizer:
        """The optimizer (its state and param groups) run inside backward."""
