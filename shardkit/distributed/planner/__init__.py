"""``torchrec.distributed.planner``: the planner, its inputs and components."""

from shardkit.distributed.planner._tr_interfaces import (
    EmbeddingPlannerBase,
)
from shardkit.distributed.planner._tr_types import (
    bytes_to_gb,
    sharder_name,
)
from shardkit.planner import (
    EmbeddingShardingPlanner,
    HeuristicalStorageReservation,
    ParameterConstraints,
    Topology,
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
