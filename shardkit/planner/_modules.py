"""Finding the tables of a model: the modules some sharder handles, and their tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from shardkit.modules import BaseEmbeddingConfig, EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.planner._tables import TableSource
from shardkit.types import (
    EmbeddingComputeKernel,
    ModuleSharder,
    ShardingType,
    embedding_compute_kernels,
    embedding_sharding_types,
)

__all__ = ["config_sources", "module_sources", "optimizer_of"]


def optimizer_of(fused_params: Mapping[str, Any] | None) -> EmbOptimType:
    """The fused optimizer named by ``fused_params["optimizer"]`` (default row-wise Adagrad)."""
    value = (fused_params or {}).get("optimizer")
    if value is None:
        return EmbOptimType.EXACT_ROWWISE_ADAGRAD
    for candidate in (value, getattr(value, "value", None), getattr(value, "name", None)):
        if candidate is not None:
            try:
                return EmbOptimType.parse(candidate)
            except ValueError:
                continue
    return EmbOptimType.parse(value)  # raises, naming the optimizers shardkit knows


def config_sources(
    tables: Sequence[BaseEmbeddingConfig],
    *,
    compute_device: str,
    module_path: str = "",
    is_weighted: bool = False,
    fused_params: Mapping[str, Any] | None = None,
) -> list[TableSource]:
    """Tables given as configs: every sharding type and kernel an embedding collection has."""
    types = embedding_sharding_types(compute_device)
    kernels = {t: tuple(embedding_compute_kernels(t, compute_device)) for t in types}
    optimizer = optimizer_of(fused_params)
    _check_unique([t.name for t in tables], module_path)
    return [
        TableSource.from_config(
            config,
            path=module_path,
            is_weighted=is_weighted,
            sharding_types=types,
            kernels=kernels,
            optimizer=optimizer,
            sharder_name="an embedding collection",
        )
        for config in tables
    ]


def module_sources(
    module: nn.Module, sharders: Sequence[ModuleSharder], *, compute_device: str
) -> tuple[list[TableSource], int]:
    """Tables of every module a sharder handles (in module order), and the bytes of the other
    parameters (the dense model)."""
    by_type: dict[type, ModuleSharder] = {}
    for sharder in sharders:
        if sharder.module_type in by_type:
            raise ValueError(
                f"two sharders for {sharder.module_type.__name__}; pass one per module type"
            )
        by_type[sharder.module_type] = sharder
    sources: list[TableSource] = []
    sharded: set[int] = set()
    for path, child, sharder in _sharded_modules(module, by_type):
        params = sharder.shardable_parameters(child)
        sharded.update(id(p) for p in params.values())
        sources.extend(_sources_of(path, child, sharder, params, compute_device))
    dense = {id(p): p for p in module.parameters() if id(p) not in sharded}
    return sources, sum(p.numel() * p.element_size() for p in dense.values())


def _sharded_modules(
    module: nn.Module, by_type: Mapping[type, ModuleSharder], path: str = ""
) -> Iterator[tuple[str, nn.Module, ModuleSharder]]:
    """Pre-order walk; a module some sharder handles is yielded, not entered."""
    sharder = by_type.get(type(module))
    if sharder is not None:
        yield path, module, sharder
        return
    for name, child in module.named_children():
        yield from _sharded_modules(child, by_type, f"{path}.{name}" if path else name)


def _sources_of(path, module, sharder, params, compute_device) -> list[TableSource]:
    configs = {}
    if hasattr(sharder, "table_configs"):
        configs = {c.name: c for c in sharder.table_configs(module)}
    is_weighted = bool(module.is_weighted()) if hasattr(module, "is_weighted") else False
    types = tuple(ShardingType.parse(t) for t in sharder.sharding_types(compute_device))
    kernels = {
        t: tuple(
            EmbeddingComputeKernel.parse(k)
            for k in sharder.compute_kernels(t.value, compute_device)
        )
        for t in types
    }
    optimizer = _module_optimizer(module, sharder)
    sources = []
    for name, param in params.items():
        config = configs.get(name)
        if config is None:  # a sharder without configs: a pooled table of the weight's shape
            config = EmbeddingBagConfig(
                num_embeddings=param.shape[0], embedding_dim=param.shape[1], name=name
            )
        sources.append(
            TableSource.from_config(
                config,
                path=path,
                is_weighted=is_weighted,
                sharding_types=types,
                kernels=kernels,
                optimizer=optimizer,
                sharder_name=type(sharder).__name__,
                param=param,
            )
        )
    return sources


def _module_optimizer(module: nn.Module, sharder: ModuleSharder) -> EmbOptimType:
    """The optimizer a FUSED table of ``module`` gets unless `apply_optimizer_in_backward` set
    one: the sharder's ``fused_params``, else the module's own, else row-wise Adagrad (the
    order the sharded modules use; their final fallback is SGD, which has no state, so
    counting row-wise Adagrad's one float per row errs on the safe side)."""
    if (sharder.fused_params or {}).get("optimizer") is not None:
        return optimizer_of(sharder.fused_params)
    # The collection's constructor ``fused_params`` (no public accessor yet).
    config = getattr(getattr(module, "_stack", None), "default_config", None)
    if config is not None:
        return config.optimizer
    return optimizer_of(None)


def _check_unique(names: Sequence[str], path: str) -> None:
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ValueError(
            f"table names {duplicates} appear twice in module '{path}'; names must be unique"
        )
