"""The interfaces of sharded modules and planners (TorchRec's `ShardedModule`, `ShardingPlanner`)
and the empty contexts a sharded module's steps pass along.

A sharded module runs ``input_dist -> compute -> output_dist``: its forward takes the
unsharded module's input on each rank and returns its output. shardkit's sharded collections
(``shardkit.sharding``) are registered as `ShardedModule`s, so ``isinstance(m, ShardedModule)``
finds them; they run the three steps in their own ``forward``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from shardkit.streamable import Multistreamable
from shardkit.types._awaitable import Awaitable, LazyAwaitable

__all__ = [
    "NullShardedModuleContext",
    "NullShardingContext",
    "ShardedModule",
    "ShardingPlanner",
]


class NullShardedModuleContext(Multistreamable):
    """The context of a sharded module that keeps none: nothing can be set on it."""

    def record_stream(self, stream: torch.Stream | None) -> None:
        pass

    def __setattr__(self, key: str, value: Any) -> None:
        raise NotImplementedError(f"NullShardedModuleContext keeps nothing; cannot set {key!r}")


class NullShardingContext(Multistreamable):
    """The context of a sharding that keeps none."""

    def record_stream(self, stream: torch.Stream | None) -> None:
        pass


class ShardedModule(abc.ABC, nn.Module):
    """A model-parallel module: data-parallel input and output, its state split over ranks.

    Subclasses implement `create_context`, `input_dist` (an awaitable of an awaitable of the
    compute input), `compute`, `output_dist` and `unsharded_module_type`; `forward` runs them in
    order.

    Args:
        qcomm_codecs_registry: quantized comm codecs by `CommOp` value (default none).
    """

    def __init__(self, qcomm_codecs_registry: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._qcomm_codecs_registry = dict(qcomm_codecs_registry or {})
        self.is_pipelined = False

    @property
    def qcomm_codecs_registry(self) -> dict[str, Any] | None:
        return self._qcomm_codecs_registry

    @abc.abstractmethod
    def create_context(self) -> Multistreamable:
        """A fresh context for one forward."""

    @abc.abstractmethod
    def input_dist(self, ctx: Multistreamable, *input: Any, **kwargs: Any) -> Awaitable[Any]:
        """Start sending the input to the ranks that compute it."""

    @abc.abstractmethod
    def compute(self, ctx: Multistreamable, dist_input: Any) -> Any:
        """This rank's part of the computation."""

    @abc.abstractmethod
    def output_dist(self, ctx: Multistreamable, output: Any) -> LazyAwaitable[Any]:
        """Start sending the results back to the ranks of the input."""

    @property
    @abc.abstractmethod
    def unsharded_module_type(self) -> type[nn.Module]:
        """The type of the module this one shards."""

    def compute_and_output_dist(self, ctx: Multistreamable, input: Any) -> LazyAwaitable[Any]:
        return self.output_dist(ctx, self.compute(ctx, input))

    def forward(self, *input: Any, **kwargs: Any) -> LazyAwaitable[Any]:
        ctx = self.create_context()
        dist_input = self.input_dist(ctx, *input, **kwargs).wait().wait()
        return self.compute_and_output_dist(ctx, dist_input)

    def prefetch(self, dist_input: Any, forward_stream: Any = None, ctx: Any = None) -> None:
        """Prefetch rows into a cache (no cache here: nothing to do)."""

    def sharded_parameter_names(self, prefix: str = "") -> Iterator[str]:
        for name, _ in self.named_parameters(prefix):
            yield name

    def preprocess_input(self, args: list[Any], kwargs: Mapping[str, Any]) -> tuple[list, Any]:
        return args, kwargs


class ShardingPlanner(abc.ABC):
    """Plans how to shard a module (TorchRec's interface; `EmbeddingShardingPlanner` is one)."""

    @abc.abstractmethod
    def plan(self, module: nn.Module, sharders: list[Any]) -> Any:
        """The plan for ``module``'s modules that ``sharders`` handle."""

    @abc.abstractmethod
    def collective_plan(self, module: nn.Module, sharders: list[Any]) -> Any:
        """`plan` on rank 0, broadcast to every rank."""
