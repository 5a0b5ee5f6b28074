"""TorchRec's planner components over shardkit's estimates: the enumerator and its estimators
(``planner.enumerators``, ``.shard_estimators``), proposers (``.proposers``), partitioners
(``.partitioners``) and stats (``.stats``).

`EmbeddingEnumerator.enumerate` returns every `ShardingOption` of every table, each shard's
`Storage` and `Perf` from shardkit's cost model (see [Note: cost model] in ``_estimate``: the
compute splits into forward and ``bwd_compute_multiplier`` times it backward, the comms into two
halves). The proposers and partitioners run TorchRec's algorithms on such options: greedy,
uniform, grid search and dynamic programming; greedy placement by perf or by memory.
`EmbeddingShardingPlanner` takes these components and plans with its own search (see
``_resolve``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import nn

from shardkit.distributed.planner._tr_interfaces import Enumerator, ShardEstimator
from shardkit.distributed.planner._tr_types import Perf, Shard, ShardingOption, Storage
from shardkit.planner import (
    BATCH_SIZE,
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    Topology,
)
from shardkit.planner.steps import (
    NUM_POOLINGS,
    Option,
    TableSpec,
    enumerate_options,
    estimate_shard,
    module_sources,
    resolve_tables,
    shard_layout,
)
from shardkit.types import EmbeddingComputeKernel, ModuleSharder, PipelineType, ShardingType

__all__ = [
    "GUARDED_COMPUTE_KERNELS",
    "GUARDED_SHARDING_TYPES_FOR_FP_MODULES",
    "EmbeddingEnumerator",
    "EmbeddingPerfEstimator",
    "EmbeddingStorageEstimator",
    "calculate_pipeline_io_cost",
    "get_num_poolings",
    "get_partition_by_type",
]

logger = logging.getLogger(__name__)

_UNLIMITED = 1 << 62  # enumerate every option; partitioners check memory

# Kernels TorchRec keeps from feature-processed modules: its key-value kernels, which shardkit
# does not have, so none here.
GUARDED_COMPUTE_KERNELS: frozenset[str] = frozenset()
# Sharding types feature-processed (position-weighted) modules cannot use: those that split rows.
GUARDED_SHARDING_TYPES_FOR_FP_MODULES = frozenset(
    {ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value}
)


def get_partition_by_type(sharding_type: str) -> str:
    """``"device"`` (TW, CW), ``"host"`` (TWRW, TWCW, GRID) or ``"uniform"`` (RW, DP)."""
    kind = ShardingType.parse(sharding_type)
    if kind in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
        return "device"
    if kind in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
        return "uniform"
    return "host"


def _storage(memory: int, topology: Topology) -> Storage:
    return Storage(memory, 0) if topology.compute_device == "cuda" else Storage(0, memory)


def _perf(compute: float, comms: float, topology: Topology) -> Perf:
    forward = compute / (1 + topology.bwd_compute_multiplier)
    return Perf(forward, comms / 2, compute - forward, comms / 2)


def _sharding_option(spec: TableSpec, option: Option, module: nn.Module, batch_size: int,
                     topology: Topology) -> ShardingOption:  # fmt: skip
    child = module.get_submodule(spec.path)
    tensor = dict(child.named_parameters())[f"{_tables_attr(child)}.{spec.name}.weight"]
    shards = [
        Shard(list(sizes), list(offsets), _storage(kind.cost.memory, topology),
              _perf(kind.cost.compute, kind.cost.comms, topology))
        for (offsets, sizes), kind in zip(shard_layout(option), option.shards())
    ]  # fmt: skip
    sharding = ShardingOption(
        spec.name, tensor, (spec.path, child), [f.pooling_factor for f in spec.inputs], batch_size,
        option.sharding_type.value, get_partition_by_type(option.sharding_type), option.kernel.value,
        shards, is_pooled=spec.pooled, num_poolings=[f.num_poolings for f in spec.inputs],
    )  # fmt: skip
    sharding._shardkit_spec = spec  # type: ignore[attr-defined] # for the estimators
    return sharding


def _tables_attr(child: nn.Module) -> str:
    return "embedding_bags" if hasattr(child, "embedding_bag_configs") else "embeddings"


class EmbeddingEnumerator(Enumerator):
    """Every (sharding type, kernel, shard layout) of every table a sharder handles.

    Args:
        topology: the ranks.
        batch_size: examples per rank per step.
        constraints: table name -> `ParameterConstraints`.
        estimator: `EmbeddingPerfEstimator` / `EmbeddingStorageEstimator` (or a list): the
            estimates are shardkit's either way.
        use_exact_enumerate_order: options in module order (they are).
    """

    _shardkit_component: ClassVar[str] = "enumerator"  # its part: planner/_resolve

    def __init__(self, topology: Topology, batch_size: int = BATCH_SIZE,
                 constraints: Mapping[str, ParameterConstraints] | None = None,
                 estimator: Any = None, use_exact_enumerate_order: bool | None = False) -> None:  # fmt: skip
        super().__init__(topology, batch_size, constraints, estimator)
        for each in estimator if isinstance(estimator, list) else [estimator]:
            if each is not None and not isinstance(
                each, EmbeddingPerfEstimator | EmbeddingStorageEstimator
            ):
                raise TypeError(
                    f"estimator {type(each).__name__}: shardkit's planner estimates with its own "
                    "cost model; pass EmbeddingPerfEstimator/EmbeddingStorageEstimator or None"
                )

    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder]) -> list[ShardingOption]:
        sources, _ = module_sources(module, sharders, compute_device=self.topology.compute_device)
        specs = resolve_tables(sources, self.constraints or {}, batch_size=self.batch_size)
        options, _ = enumerate_options(specs, self.topology, _UNLIMITED)
        return [
            _sharding_option(spec, option, module, self.batch_size, self.topology)
            for spec, table_options in zip(specs, options)
            for option in table_options
        ]

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        EmbeddingStorageEstimator(self.topology).estimate(sharding_options)
        EmbeddingPerfEstimator(self.topology).estimate(sharding_options)


def _costs(options: Sequence[ShardingOption], topology: Topology):
    for option in options:
        spec = getattr(option, "_shardkit_spec", None)
        if spec is None:
            raise ValueError(
                f"sharding option {option.name!r} was not made by EmbeddingEnumerator: shardkit "
                "estimates only its own options"
            )
        for shard in option.shards:
            rows, cols = shard.size
            kind, kernel = ShardingType.parse(option.sharding_type), option.compute_kernel
            yield shard, estimate_shard(spec, kind, _kernel(kernel), rows, cols, topology)


def _kernel(value: str) -> EmbeddingComputeKernel:
    return EmbeddingComputeKernel.parse(value)


class EmbeddingPerfEstimator(ShardEstimator):
    """Sets each shard's `Perf` (milliseconds per step) from shardkit's cost model."""

    def __init__(self, topology: Topology, constraints: Any = None, is_inference: bool = False) -> None:  # fmt: skip
        super().__init__(topology, constraints)
        self._is_inference = is_inference

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: Any = None) -> None:
        for shard, cost in _costs(sharding_options, self._topology):
            shard.perf = _perf(cost.compute, cost.comms, self._topology)


class EmbeddingStorageEstimator(ShardEstimator):
    """Sets each shard's `Storage` (weights, optimizer state, buffers) from shardkit's model."""

    def __init__(self, topology: Topology, constraints: Any = None,
                 pipeline_type: PipelineType = PipelineType.NONE,
                 run_embedding_at_peak_memory: bool = False, is_inference: bool = False) -> None:  # fmt: skip
        super().__init__(topology, constraints)

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: Any = None) -> None:
        for shard, cost in _costs(sharding_options, self._topology):
            shard.storage = _storage(cost.memory, self._topology)


def calculate_pipeline_io_cost(
    input_size: int, output_size: int, prefetch_size: int, pipeline_type: PipelineType,
    multipass_prefetch_max_pass: int | None, count_ephemeral_storage_cost: bool = False,
    is_inference: bool = False,
) -> int:  # fmt: skip
    """Bytes of input/output buffers a pipeline holds at its peak: two batches' inputs for the
    sparse-dist pipeline, three (and bursts of prefetch) for the prefetching one."""
    if is_inference:
        return 0
    output = output_size if count_ephemeral_storage_cost else 0
    if pipeline_type == PipelineType.TRAIN_SPARSE_DIST:
        return 2 * input_size + output
    if pipeline_type == PipelineType.TRAIN_PREFETCH_SPARSE_DIST:
        burst = 1 + 6 / (multipass_prefetch_max_pass or 1)
        return 3 * input_size + int(burst * prefetch_size) + output
    return input_size + output_size


def get_num_poolings(
    constraints: Mapping[str, ParameterConstraints] | None, so: ShardingOption
) -> list[float]:
    """Bags per example for each input of a sharding option: its own, else its constraint's,
    else 1.0 each."""
    if so.num_poolings is not None and len(so.num_poolings) == len(so.input_lengths):
        return list(so.num_poolings)
    constraint = (constraints or {}).get(so.name)
    if constraint is not None and constraint.num_poolings:
        return list(constraint.num_poolings)
    return [NUM_POOLINGS] * len(so.input_lengths)


def _by_table(options: Sequence[ShardingOption]) -> dict[str, list[ShardingOption]]:
    tables: dict[str, list[ShardingOption]] = {}
    for option in options:
        tables.setdefault(option.fqn, []).append(option)
    return tables


def _raise_no_fit(what: str) -> None:
    raise PlannerError(what, PlannerErrorType.PARTITION)
