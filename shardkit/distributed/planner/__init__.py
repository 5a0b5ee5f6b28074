"""``torchrec.distributed.planner``: the planner and its inputs."""

from shardkit.planner import (
    EmbeddingShardingPlanner,
    HeuristicalStorageReservation,
    ParameterConstraints,
    Topology,
)

__all__ = [
    "EmbeddingShardingPlanner",
    "HeuristicalStorageReservation",
    "ParameterConstraints",
    "Topology",
]
