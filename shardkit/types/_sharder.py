"""Sharders as the planner sees them: descriptors of what a module type can do.

`ModuleSharder` has TorchRec's descriptor methods (``module_type``, ``sharding_types``,
``compute_kernels``, ``shardable_parameters``, ``fused_params``, ``storage_usage``).
`BaseEmbeddingSharder` fills them in for embedding collections; ``shardkit.sharding`` defines
the sharders of `EmbeddingBagCollection` and `EmbeddingCollection` on top of it. Sharding a
module (``shard()``) belongs to ``shardkit.sharding``; the planner only reads these.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from shardkit.types._enums import EmbeddingComputeKernel, ShardingType

__all__ = [
    "BaseEmbeddingSharder",
    "ModuleSharder",
    "embedding_compute_kernels",
    "embedding_sharding_types",
]


def embedding_sharding_types(compute_device_type: str) -> list[ShardingType]:
    """Every sharding type an embedding collection supports, on CPUs and GPUs alike.

    ``GRID_SHARD`` is listed but, as in TorchRec, only planned when a table's constraints ask
    for it.
    """
    del compute_device_type  # the same on every device: shardkit's kernels are plain torch
    return list(ShardingType)


def embedding_compute_kernels(
    sharding_type: ShardingType | str, compute_device_type: str
) -> list[EmbeddingComputeKernel]:
    """FUSED and DENSE, except data-parallel tables: DENSE only (their gradient is all-reduced)."""
    del compute_device_type
    if ShardingType.parse(sharding_type) == ShardingType.DATA_PARALLEL:
        return [EmbeddingComputeKernel.DENSE]
    return [EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.DENSE]


M = TypeVar("M", bound=nn.Module)


class ModuleSharder(abc.ABC, Generic[M]):
    """What the planner needs to know about sharding one module type (TorchRec's interface).

    Subclasses say which module type they handle (`module_type`, matched exactly, as in
    TorchRec), which of its parameters are tables, and which sharding types and kernels they
    implement.

    Args:
        qcomm_codecs_registry: quantized comm codecs by comm op name (TorchRec's argument),
            checked when a module is sharded with them (FP16/BF16 casts of the output dists).
    """

    def __init__(self, qcomm_codecs_registry: Mapping[str, Any] | None = None):
        self._qcomm_codecs_registry = (
            None if qcomm_codecs_registry is None else dict(qcomm_codecs_registry)
        )

    @property
    def qcomm_codecs_registry(self) -> dict[str, Any] | None:
        """The registry given (None: float32 comms)."""
        return getattr(self, "_qcomm_codecs_registry", None)

    @property
    @abc.abstractmethod
    def module_type(self) -> type[nn.Module]:
        """The module class this sharder shards."""

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        """Name -> parameter of what can be sharded (default: every parameter)."""
        return dict(module.named_parameters())

    def sharding_types(self, compute_device_type: str) -> list[ShardingType]:
        """The sharding types this sharder implements (default: data-parallel only)."""
        del compute_device_type
        return [ShardingType.DATA_PARALLEL]

    def compute_kernels(
        self, sharding_type: ShardingType | str, compute_device_type: str
    ) -> list[EmbeddingComputeKernel]:
        """The kernels this sharder implements for ``sharding_type`` (default: DENSE)."""
        del sharding_type, compute_device_type
        return [EmbeddingComputeKernel.DENSE]

    @property
    def fused_params(self) -> dict[str, Any] | None:
        """Parameters of the fused kernel, e.g. ``{"optimizer": EmbOptimType.ADAM}``."""
        return None

    def storage_usage(
        self, tensor: torch.Tensor, compute_device_type: str, compute_kernel: str
    ) -> dict[str, int]:
        """Bytes of ``tensor`` by memory kind: ``{"hbm": n}`` on GPUs, ``{"ddr": n}`` on CPUs."""
        del compute_kernel
        kind = {"cuda": "hbm", "cpu": "ddr"}.get(compute_device_type)
        if kind is None:
            raise ValueError(
                f"compute_device_type must be 'cpu' or 'cuda', got {compute_device_type!r}"
            )
        return {kind: tensor.numel() * tensor.element_size()}


class BaseEmbeddingSharder(ModuleSharder):
    """The descriptor shared by sharders of embedding collections.

    Args:
        fused_params: the fused kernel's parameters, TorchRec's dict; the planner reads
            ``"optimizer"`` (default row-wise Adagrad) to count optimizer state.
        qcomm_codecs_registry: see `ModuleSharder`.
        sharded_module_order_overwrite: TorchRec's order of sharded submodules (None; shardkit
            shards in module order, and a list is refused).
        shardable_params: tables to shard (default: all).
    """

    def __init__(
        self,
        fused_params: Mapping[str, Any] | None = None,
        qcomm_codecs_registry: Mapping[str, Any] | None = None,
        sharded_module_order_overwrite: Sequence[str] | None = None,
        *,
        shardable_params: Sequence[str] | None = None,
    ) -> None:
        super().__init__(qcomm_codecs_registry)
        if sharded_module_order_overwrite is not None:
            raise ValueError(
                f"sharded_module_order_overwrite={list(sharded_module_order_overwrite)}: shardkit "
                "shards a collection's submodules in module order; leave it None"
            )
        self._fused_params = copy.deepcopy(dict(fused_params)) if fused_params is not None else None
        self._shardable_params = list(shardable_params or [])

    @property
    def fused_params(self) -> dict[str, Any] | None:
        return self._fused_params

    def sharding_types(self, compute_device_type: str) -> list[ShardingType]:
        return embedding_sharding_types(compute_device_type)

    def compute_kernels(
        self, sharding_type: ShardingType | str, compute_device_type: str
    ) -> list[EmbeddingComputeKernel]:
        return embedding_compute_kernels(sharding_type, compute_device_type)

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        """Table name -> weight, from parameters named ``<collection>.<table>.weight``."""
        tables: dict[str, nn.Parameter] = {}
        for name, param in module.named_parameters():
            parts = name.split(".")
            if len(parts) == 3 and parts[2] == "weight":
                tables[parts[1]] = param
        if self._shardable_params:
            missing = sorted(set(self._shardable_params) - set(tables))
            if missing:
                raise ValueError(
                    f"shardable_params names tables {missing} that the module does not have; "
                    f"its tables are {sorted(tables)}"
                )
            tables = {n: p for n, p in tables.items() if n in self._shardable_params}
        return tables

    def table_configs(self, module: nn.Module) -> list[Any]:
        """The module's table configs, `shardkit.modules.BaseEmbeddingConfig`s (from
        ``embedding_bag_configs()`` or ``embedding_configs()``)."""
        for method in ("embedding_bag_configs", "embedding_configs"):
            if hasattr(module, method):
                return list(getattr(module, method)())
        raise TypeError(
            f"{type(module).__name__} has neither embedding_bag_configs() nor "
            "embedding_configs(); an embedding sharder needs one of them"
        )
