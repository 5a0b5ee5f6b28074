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

`plan_tables` plans table configs directly. See docs/planner.md. The plan types and sharders
the planner works with live in ``shardkit.types`` and are re-exported here, where TorchRec-style
code and earlier shardkit code import them from.
"""

from shardkit.planner._components import (
    GUARDED_COMPUTE_KERNELS,
    GUARDED_SHARDING_TYPES_FOR_FP_MODULES,
    EmbeddingEnumerator,
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
    calculate_pipeline_io_cost,
    get_num_poolings,
    get_partition_by_type,
)
from shardkit.planner._constants import BATCH_SIZE, DDR_CAP, HBM_CAP, MIN_CW_DIM
from shardkit.planner._core import PlanResult, estimate_plan, plan_tables
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._inputs import HeuristicalStorageReservation, ParameterConstraints, Topology
from shardkit.planner._partitioners import (
    IMBALANCE_STAT_MEASURE,
    MIN_WIDTH,
    EmbeddingStats,
    GreedyPerfPartitioner,
    MemoryBalancedPartitioner,
    NoopEmbeddingStats,
    OrderedDeviceHardware,
    ShardingOptionGroup,
    SortBy,
    round_to_one_sigfig,
)
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
from shardkit.planner._proposers import (
    MAX_PROPOSALS,
    DynamicProgrammingProposer,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
    proposers_to_proposals_list,
)
from shardkit.planner._reservations import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    InferenceStorageReservation,
    StorageReservationType,
)
from shardkit.planner._simulate import ClusterShape, ScalingPoint, Simulation, simulate
from shardkit.planner._stats import PlanStats, RankStats, TableStats
from shardkit.planner._tr_interfaces import (
    EmbeddingPlannerBase,
    Enumerator,
    Partitioner,
    PerfModel,
    PlanLoader,
    Proposer,
    ShardEstimator,
    Stats,
    StorageReservation,
    hash_planner_context_inputs,
    hash_planner_context_inputs_str,
)
from shardkit.planner._tr_types import (
    BasicCommsBandwidths,
    CollectiveType,
    CriticalPathEstimate,
    CustomTopologyData,
    DeviceHardware,
    GeneralizedCommsBandwidth,
    HardwareConfig,
    KernelConfig,
    PartitionByType,
    Perf,
    PlanDebugStats,
    Shard,
    SharderData,
    ShardingOption,
    Storage,
    TopologyConfigBase,
    TopologyFactory,
    TrainerConfig,
    bytes_to_gb,
    hash_sha256_str,
    hash_sha256_to_int,
    round_to_nearest,
    sharder_name,
)
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
    "GUARDED_COMPUTE_KERNELS",
    "GUARDED_SHARDING_TYPES_FOR_FP_MODULES",
    "HBM_CAP",
    "IMBALANCE_STAT_MEASURE",
    "MAX_PROPOSALS",
    "MIN_CW_DIM",
    "MIN_WIDTH",
    "BaseEmbeddingSharder",
    "BasicCommsBandwidths",
    "ClusterShape",
    "CollectiveType",
    "CriticalPathEstimate",
    "CustomTopologyData",
    "DeviceHardware",
    "DynamicProgrammingProposer",
    "EmbeddingComputeKernel",
    "EmbeddingEnumerator",
    "EmbeddingModuleShardingPlan",
    "EmbeddingPerfEstimator",
    "EmbeddingPlannerBase",
    "EmbeddingShardingPlanner",
    "EmbeddingStats",
    "EmbeddingStorageEstimator",
    "EnumerableShardingSpec",
    "Enumerator",
    "FixedAbsoluteStorageReservation",
    "FixedPercentageStorageReservation",
    "GeneralizedCommsBandwidth",
    "GreedyPerfPartitioner",
    "GreedyProposer",
    "GridSearchProposer",
    "HardwareConfig",
    "HeuristicalStorageReservation",
    "InferenceStorageReservation",
    "KernelConfig",
    "KernelFit",
    "LinkFit",
    "MachineProfile",
    "MemoryBalancedPartitioner",
    "ModuleSharder",
    "NoopEmbeddingStats",
    "OrderedDeviceHardware",
    "ParameterConstraints",
    "PartitionByType",
    "Partitioner",
    "Perf",
    "PerfModel",
    "PlanDebugStats",
    "PlanLoader",
    "PlanResult",
    "PlanStats",
    "PlannerError",
    "PlannerErrorType",
    "Proposer",
    "RankStats",
    "RankStep",
    "ScalingPoint",
    "Shard",
    "ShardEstimator",
    "ShardMetadata",
    "ShardPlacement",
    "SharderData",
    "ShardingOption",
    "ShardingOptionGroup",
    "ShardingType",
    "Simulation",
    "SortBy",
    "Stats",
    "StepPrediction",
    "Storage",
    "StorageReservation",
    "StorageReservationType",
    "TableStats",
    "Topology",
    "TopologyConfigBase",
    "TopologyFactory",
    "TrainerConfig",
    "UniformProposer",
    "bytes_to_gb",
    "calculate_pipeline_io_cost",
    "embedding_compute_kernels",
    "embedding_sharding_types",
    "estimate_plan",
    "get_num_poolings",
    "get_partition_by_type",
    "hash_planner_context_inputs",
    "hash_planner_context_inputs_str",
    "hash_sha256_str",
    "hash_sha256_to_int",
    "load_profile",
    "miss_fraction",
    "placement",
    "plan_tables",
    "proposers_to_proposals_list",
    "round_to_nearest",
    "round_to_one_sigfig",
    "sharder_name",
    "simulate",
    "split_evenly",
]
