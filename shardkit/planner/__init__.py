"""Sharding planner: which rank holds which part of each embedding table.

A pure function of the tables, the topology and the constraints (no process group, no memory
for the tables); its modules, in the order the algorithm runs:

- ``_inputs``: what it is given: `Topology`, `ParameterConstraints`, the storage reservation;
- ``_tables``: the tables, found in a model's modules or given as configs, with constraints;
- ``_enumerate``: every way to shard each table, each shard estimated by ``_estimate``;
- ``_search``: one option per table, over cost thresholds, then local moves; each proposal
  placed on ranks by ``_partition``, which also writes the `ShardingPlan`;
- ``_stats``: per-rank and per-table estimates of a plan; ``_diagnose``: why nothing fits;
- ``_core``: the pipeline behind the one entry point; ``_planner``: TorchRec's
  `EmbeddingShardingPlanner`; ``_collective``: plan on rank 0 and broadcast, the only part
  that communicates.

`plan_tables` plans table configs directly; `shardkit.planner.steps` offers the steps one at a
time, for code that composes a planner of its own. See docs/planner.md. The plan types and sharders
the planner works with live in ``shardkit.types`` and are re-exported here, where TorchRec-style
code and earlier shardkit code import them from.
"""

from shardkit.planner._constants import BATCH_SIZE, DDR_CAP, HBM_CAP, MIN_CW_DIM
from shardkit.planner._core import PlanResult, estimate_plan, plan_tables
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._inputs import HeuristicalStorageReservation, ParameterConstraints, Topology
from shardkit.planner._planner import EmbeddingShardingPlanner
from shardkit.planner._predict import RankStep, StepPrediction
from shardkit.planner._profile import (
    COLLECTIVE_KINDS,
    KernelFit,
    LinkFit,
    MachineProfile,
    load_profile,
    miss_fraction,
)
from shardkit.planner._reservations import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    InferenceStorageReservation,
    StorageReservationType,
)
from shardkit.planner._simulate import ClusterShape, ScalingPoint, Simulation, simulate
from shardkit.planner._stats import PlanStats, RankStats, TableStats
from shardkit.types import (
    BaseEmbeddingSharder,
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleSharder,
    ShardingType,
    ShardMetadata,
    ShardPlacement,
    embedding_compute_kernels,
    embedding_sharding_types,
    placement,
    split_evenly,
)

__all__ = [
    "BATCH_SIZE",
    "COLLECTIVE_KINDS",
    "DDR_CAP",
    "HBM_CAP",
    "MIN_CW_DIM",
    "BaseEmbeddingSharder",
    "ClusterShape",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EmbeddingShardingPlanner",
    "EnumerableShardingSpec",
    "FixedAbsoluteStorageReservation",
    "FixedPercentageStorageReservation",
    "HeuristicalStorageReservation",
    "InferenceStorageReservation",
    "KernelFit",
    "LinkFit",
    "MachineProfile",
    "ModuleSharder",
    "ParameterConstraints",
    "PlanResult",
    "PlanStats",
    "PlannerError",
    "PlannerErrorType",
    "RankStats",
    "RankStep",
    "ScalingPoint",
    "ShardMetadata",
    "ShardPlacement",
    "ShardingType",
    "Simulation",
    "StepPrediction",
    "StorageReservationType",
    "TableStats",
    "Topology",
    "embedding_compute_kernels",
    "embedding_sharding_types",
    "estimate_plan",
    "load_profile",
    "miss_fraction",
    "placement",
    "plan_tables",
    "simulate",
    "split_evenly",
]
