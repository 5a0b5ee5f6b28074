"""``collective_plan``: plan on rank 0 of a process group and broadcast the plan, or the error,
to every rank. The only part of the planner that communicates (see
[Note: the planner is a pure function]: every rank would plan the same; this saves them the work).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from shardkit import comm
from shardkit.launch import local_world_size
from shardkit.planner._core import PlanResult
from shardkit.planner._errors import PlannerError, PlannerErrorType
from shardkit.planner._inputs import Topology
from shardkit.types import ShardingPlan

__all__ = ["group_topology", "plan_on_rank_zero", "process_group"]


def process_group(pg: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``pg``, or the world when None; raises if there is no process group at all."""
    if pg is not None:
        return pg
    if not dist.is_initialized():
        raise RuntimeError(
            "collective_plan needs a process group: call "
            "torch.distributed.init_process_group() (or shardkit.launch.spawn) first, "
            "or use plan() to plan without processes"
        )
    world = dist.group.WORLD
    assert world is not None  # initialized, so the world group exists
    return world


def group_topology(group: dist.ProcessGroup, topology: Topology | None) -> Topology:
    """``topology`` checked against the group's size, or, if None, the group's: its size,
    `shardkit.launch.local_world_size` ranks per host and its backend's device."""
    size = dist.get_world_size(group)
    if topology is None:
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        return Topology(
            world_size=size, compute_device=device, local_world_size=local_world_size(size)
        )
    if topology.world_size != size:
        raise ValueError(
            f"topology.world_size ({topology.world_size}) differs from the process group's "
            f"size ({size}); plan for the ranks that will run the model"
        )
    return topology


def plan_on_rank_zero(plan: Callable[[], PlanResult], group: dist.ProcessGroup) -> PlanResult:
    """``plan()`` on rank 0 of ``group``, broadcast: every rank returns its result, or raises
    the error it raised (no rank waits forever)."""
    payload = None
    if dist.get_rank(group) == 0:
        payload = _attempt(lambda: _wire(plan()))
    status, value = comm.broadcast_object(payload, src=dist.get_global_rank(group, 0), group=group)
    if status == "error":
        raise value
    plan_json, stats = value
    return PlanResult(ShardingPlan.from_json(plan_json), stats)


def _wire(result: PlanResult) -> tuple[str, Any]:
    return result.plan.to_json(), result.stats


def _attempt(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", fn()) or ("error", the exception), made safe to pickle for the broadcast."""
    try:
        return "ok", fn()
    except Exception as exc:
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            exc = PlannerError(f"{type(exc).__name__}: {exc}", PlannerErrorType.OTHER)
        return "error", exc
