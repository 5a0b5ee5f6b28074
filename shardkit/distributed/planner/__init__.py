"""``torchrec.distributed.planner``: the planner, its inputs and components."""

from shardkit.planner import (
    EmbeddingPlannerBase,
    EmbeddingShardingPlanner,
    HeuristicalStorageReservation,
    ParameterConstraints,
    Topology,
    bytes_to_gb,
    sharder_name,
)

__all__ = [
    "EmbeddingPlannerBase",
    "EmbeddingShardingPlanner",
    "HeuristicalStorageReservation",
    "ParameterConstraints",
    "Topology",
    "bytes_to_gb",
    "sharder_name",
]
