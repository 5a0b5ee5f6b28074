"""Sharding planner: which rank holds which part of each embedding table.

A pure function of the tables, the topology and the constraints (no process group, no memory
for the tables): enumerate every way to shard each table, estimate memory and cost, propose,
partition onto ranks, keep the best plan. `EmbeddingShardingPlanner` is TorchRec's interface;
`plan_tables` plans table configs directly. See docs/planner.md.

The plan types and sharders it works with live in ``shardkit.types`` and are re-exported here,
where TorchRec-style code and earlier shardkit code import them from.
"""

from shardkit.planner._constants import BATCH_SIZE, DDR_CAP, HBM_CAP, MIN_CW_DIM
from shardkit.planner._constraints import ParameterConstraints
from shardkit.planner._core import PlanResult, estimate_plan, plan_tables
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._planner import EmbeddingShardingPlanner
from shardkit.planner._reservation import HeuristicalStorageReservation
from shardkit.planner._stats import PlanStats, RankStats, TableStats
from shardkit.planner._topology import Topology
from shardkit.types import (
    BaseEmbeddingSharder,
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardingEnv,
    ShardingPlan,
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
    "DDR_CAP",
    "HBM_CAP",
    "MIN_CW_DIM",
    "BaseEmbeddingSharder",
    "EmbeddingComputeKernel",
    "EmbeddingModuleShardingPlan",
    "EmbeddingShardingPlanner",
    "EnumerableShardingSpec",
    "HeuristicalStorageReservation",
    "ModuleSharder",
    "ParameterConstraints",
    "ParameterSharding",
    "PlanResult",
    "PlanStats",
    "PlannerError",
    "PlannerErrorType",
    "RankStats",
    "ShardMetadata",
    "ShardPlacement",
    "ShardingEnv",
    "ShardingPlan",
    "ShardingType",
    "TableStats",
    "Topology",
    "embedding_compute_kernels",
    "embedding_sharding_types",
    "estimate_plan",
    "placement",
    "plan_tables",
    "split_evenly",
]
