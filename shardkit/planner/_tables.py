"""The tables to plan: found in a model (the modules some sharder handles) or given as configs
(`TableSource`), then resolved with their constraints into `TableSpec`, everything the planner
knows about one table. Planning reads only these (see [Note: the planner is a pure function]).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from shardkit.modules import (
    BaseEmbeddingConfig,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    collection_tables,
    data_type_to_dtype,
)
from shardkit.optim import EmbOptimType, fused_config_of
from shardkit.planner._constants import (
    BIGINT_DTYPE,
    MIN_CW_DIM,
    NUM_POOLINGS,
    PER_SAMPLE_WEIGHT_DTYPE,
    POOLING_FACTOR,
)
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._inputs import ParameterConstraints
from shardkit.types import (
    EmbeddingComputeKernel,
    ModuleSharder,
    ShardingType,
    embedding_compute_kernels,
    embedding_sharding_types,
)

__all__ = [
    "FeatureInput",
    "TableSource",
    "TableSpec",
    "config_sources",
    "input_bytes",
    "module_sources",
    "optimizer_of",
    "resolve_tables",
]


@dataclass(frozen=True)
class FeatureInput:
    """One input feature of a table: ids per bag, bags per example, examples per rank."""

    pooling_factor: float
    num_poolings: float
    batch_size: int


@dataclass(frozen=True)
class TableSpec:
    """One table, resolved: its shape, inputs, optimizer and the (type, kernels) it may use."""

    path: str
    name: str
    num_embeddings: int
    embedding_dim: int
    element_size: int
    pooled: bool
    is_weighted: bool
    inputs: tuple[FeatureInput, ...]
    choices: tuple[tuple[ShardingType, tuple[EmbeddingComputeKernel, ...]], ...]
    min_partition: int
    optimizer: EmbOptimType
    sharder_choices: tuple[tuple[ShardingType, tuple[EmbeddingComputeKernel, ...]], ...] = ()

    @property
    def key(self) -> str:
        """``path.name`` (just ``name`` at the root): how messages and stats name the table."""
        return f"{self.path}.{self.name}" if self.path else self.name

    @property
    def ids_per_rank(self) -> float:
        """Ids one rank's batch looks up in this table per step."""
        return sum(f.pooling_factor * f.num_poolings * f.batch_size for f in self.inputs)

    @property
    def outputs_per_rank(self) -> float:
        """Output rows one rank's batch gets from this table per step (bags, or ids unpooled)."""
        if not self.pooled:
            return self.ids_per_rank
        return sum(min(1.0, f.pooling_factor) * f.num_poolings * f.batch_size for f in self.inputs)

    @property
    def id_bytes(self) -> int:
        """Bytes per id on the wire and in buffers: int64, plus a float32 weight if weighted."""
        return BIGINT_DTYPE + (PER_SAMPLE_WEIGHT_DTYPE if self.is_weighted else 0)


@dataclass(frozen=True)
class TableSource:
    """A table as found in a module (or given as a config), before constraints are applied."""

    path: str
    config: BaseEmbeddingConfig
    element_size: int
    is_weighted: bool
    sharding_types: tuple[ShardingType, ...]
    kernels: Mapping[ShardingType, tuple[EmbeddingComputeKernel, ...]]
    optimizer: EmbOptimType
    sharder_name: str

    @classmethod
    def from_config(
        cls,
        config: BaseEmbeddingConfig,
        *,
        path: str = "",
        is_weighted: bool = False,
        sharding_types: Sequence[ShardingType],
        kernels: Mapping[ShardingType, tuple[EmbeddingComputeKernel, ...]],
        optimizer: EmbOptimType,
        sharder_name: str,
        param: nn.Parameter | None = None,
    ) -> TableSource:
        if param is not None:
            if tuple(param.shape) != (config.num_embeddings, config.embedding_dim):
                raise ValueError(
                    f"table '{config.name}': weight shape {tuple(param.shape)} differs from its "
                    f"config ({config.num_embeddings}, {config.embedding_dim})"
                )
            size = param.element_size()
            fused = fused_config_of(param)
            if fused is not None:  # apply_optimizer_in_backward on this table wins
                optimizer = fused.optimizer
        else:
            size = data_type_to_dtype(config.data_type).itemsize
        return cls(
            path,
            config,
            size,
            is_weighted,
            tuple(sharding_types),
            dict(kernels),
            optimizer,
            sharder_name,
        )


def resolve_tables(
    sources: Sequence[TableSource],
    constraints: Mapping[str, ParameterConstraints],
    *,
    batch_size: int,
) -> list[TableSpec]:
    """Apply the constraints (keyed by table name) to the tables found; check every constraint
    names a table."""
    names = {source.config.name for source in sources}
    unknown = sorted(set(constraints) - names)
    if unknown:
        raise ValueError(
            f"constraints name tables {unknown} that the sharded modules do not have; their "
            f"tables are {sorted(names)}"
        )
    return [_resolve(source, constraints.get(source.config.name), batch_size) for source in sources]


def _resolve(source: TableSource, c: ParameterConstraints | None, batch_size: int) -> TableSpec:
    config = source.config
    return TableSpec(
        path=source.path,
        name=config.name,
        num_embeddings=config.num_embeddings,
        embedding_dim=config.embedding_dim,
        element_size=source.element_size,
        pooled=isinstance(config, EmbeddingBagConfig),
        is_weighted=source.is_weighted or bool(c and c.is_weighted),
        inputs=_inputs(config, c, batch_size),
        choices=_choices(source, c),
        min_partition=(c.min_partition if c and c.min_partition else MIN_CW_DIM),
        optimizer=source.optimizer,
        sharder_choices=_choices(source, None),
    )


def _inputs(
    config: BaseEmbeddingConfig, c: ParameterConstraints | None, batch_size: int
) -> tuple[FeatureInput, ...]:
    count = (c.num_inputs() if c else None) or max(1, len(config.feature_names))
    pooling = (c.pooling_factors if c else None) or (POOLING_FACTOR,) * count
    poolings = (c.num_poolings if c else None) or (NUM_POOLINGS,) * count
    batches = (c.batch_sizes if c else None) or (batch_size,) * count
    return tuple(
        FeatureInput(float(p), float(n), int(b)) for p, n, b in zip(pooling, poolings, batches)
    )


def _choices(
    source: TableSource, c: ParameterConstraints | None
) -> tuple[tuple[ShardingType, tuple[EmbeddingComputeKernel, ...]], ...]:
    name = source.config.name
    types = _sharding_types(source, c)
    choices = []
    for sharding_type in types:
        kernels = list(source.kernels.get(sharding_type, ()))
        if c and c.compute_kernels:
            kernels = [k for k in kernels if k in c.compute_kernels]
        elif EmbeddingComputeKernel.FUSED in kernels:  # TorchRec: fused beats dense unless asked
            kernels = [k for k in kernels if k != EmbeddingComputeKernel.DENSE]
        if kernels:
            choices.append((sharding_type, tuple(kernels)))
    if not choices and not (c and c.compute_kernels):
        raise ValueError(
            f"table '{name}': {source.sharder_name} gives no compute kernel for any of its "
            f"sharding types {[t.value for t in types]}; its compute_kernels(sharding_type, "
            "compute_device_type) must return at least one (e.g. 'fused')"
        )
    if not choices:
        assert c is not None and c.compute_kernels  # checked above
        allowed = {t.value: [k.value for k in source.kernels.get(t, ())] for t in types}
        raise PlannerError(
            f"table '{name}': constraint compute_kernels={[str(k) for k in c.compute_kernels]} "
            f"leaves no kernel for its sharding types; {source.sharder_name} offers {allowed}",
            PlannerErrorType.STRICT_CONSTRAINTS,
        )
    return tuple(choices)


def _sharding_types(source: TableSource, c: ParameterConstraints | None) -> list[ShardingType]:
    """The sharding types the planner may choose for ``source``'s table (none: it raises)."""
    name, offered = source.config.name, [t.value for t in source.sharding_types]
    types = [t for t in ShardingType if t in source.sharding_types]
    if c and c.sharding_types:
        types = [t for t in types if t in c.sharding_types]
        if not types:
            raise PlannerError(
                f"table '{name}': constraint sharding_types={[str(t) for t in c.sharding_types]} "
                f"leaves no sharding type: {source.sharder_name} supports {offered}; allow one "
                "of those",
                PlannerErrorType.STRICT_CONSTRAINTS,
            )
        return types
    types = [t for t in types if t != ShardingType.GRID_SHARD]  # TorchRec: only when asked for
    if not types:
        raise ValueError(
            f"table '{name}': {source.sharder_name} offers no sharding type the planner may "
            f"choose unasked: it offers {offered} (grid_shard only where a constraint's "
            "sharding_types names it); return another from its sharding_types("
            "compute_device_type), or constrain the table to grid_shard"
        )
    return types


def input_bytes(tables: Sequence[TableSpec]) -> float:
    """Bytes of one rank's input batch for ``tables``: its ids, and weights where weighted."""
    return sum(t.ids_per_rank * t.id_bytes for t in tables)


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
    config = None
    if isinstance(module, EmbeddingBagCollection | EmbeddingCollection):
        config = collection_tables(module).fused_config  # its constructor's ``fused_params``
    return optimizer_of(None) if config is None else config.optimizer


def _check_unique(names: Sequence[str], path: str) -> None:
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ValueError(
            f"table names {duplicates} appear twice in module '{path}'; names must be unique"
        )
