"""``torchrec.distributed.planner.types``: the planner's inputs and errors."""

from shardkit.planner import (
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    Topology,
)

__all__ = ["ParameterConstraints", "PlannerError", "PlannerErrorType", "Topology"]
