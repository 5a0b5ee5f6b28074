"""`TableSpec`: everything the planner knows about one table, from its module, sharder and
constraints. Planning reads only these (see [Note: the planner is a pure function]).

[Note: the planner is a pure function]
``plan_tables(tables, topology, ...)`` depends only on its arguments: `TableSpec` lists, a
`Topology`, constraints and a few numbers. Nothing reads the clock, the environment, a random
generator or an unordered container: tables keep their module order, options their enumeration
order, and every tie is broken by an explicit key ending in an index. So every rank that plans
the same model gets the same plan, and ``collective_plan`` (plan on rank 0, broadcast) is only a
way to save the others the work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from shardkit.modules import BaseEmbeddingConfig, EmbeddingBagConfig, data_type_to_dtype
from shardkit.optim import EmbOptimType, fused_config_of
from shardkit.planner._constants import (
    BIGINT_DTYPE,
    MIN_CW_DIM,
    NUM_POOLINGS,
    PER_SAMPLE_WEIGHT_DTYPE,
    POOLING_FACTOR,
)
from shardkit.planner._constraints import ParameterConstraints
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.types import EmbeddingComputeKernel, ShardingType

__all__ = ["FeatureInput", "TableSource", "TableSpec", "resolve_tables"]


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
    types = [t for t in ShardingType if t in source.sharding_types]
    if c and c.sharding_types:
        types = [t for t in types if t in c.sharding_types]
        if not types:
            raise PlannerError(
                f"table '{name}': constraint sharding_types={[str(t) for t in c.sharding_types]} "
                f"leaves no sharding type: {source.sharder_name} supports "
                f"{[t.value for t in source.sharding_types]}; allow one of those",
                PlannerErrorType.STRICT_CONSTRAINTS,
            )
    else:  # as in TorchRec, grid sharding only when asked for
        types = [t for t in types if t != ShardingType.GRID_SHARD]
    choices = []
    for sharding_type in types:
        kernels = list(source.kernels.get(sharding_type, ()))
        if c and c.compute_kernels:
            kernels = [k for k in kernels if k in c.compute_kernels]
        elif EmbeddingComputeKernel.FUSED in kernels:  # TorchRec: fused beats dense unless asked
            kernels = [k for k in kernels if k != EmbeddingComputeKernel.DENSE]
        if kernels:
            choices.append((sharding_type, tuple(kernels)))
    if not choices:
        assert c is not None and c.compute_kernels  # sharders always give every type a kernel
        allowed = {t.value: [k.value for k in source.kernels.get(t, ())] for t in types}
        raise PlannerError(
            f"table '{name}': constraint compute_kernels={[str(k) for k in c.compute_kernels]} "
            f"leaves no kernel for its sharding types; {source.sharder_name} offers {allowed}",
            PlannerErrorType.STRICT_CONSTRAINTS,
        )
    return tuple(choices)
