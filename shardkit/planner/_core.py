"""The planning pipeline as pure functions: tables in, plan and stats out.

enumerate options per table (`_enumerate`) -> estimate each shard's memory and cost
(`_estimate`) -> propose one option per table and partition the proposals onto ranks
(`_search`, `_partition`) -> the best plan (`_build`) and its stats (`_evaluate`). See
[Note: the planner is a pure function].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.modules import BaseEmbeddingConfig
from shardkit.planner._build import build_plan
from shardkit.planner._constants import BATCH_SIZE
from shardkit.planner._constraints import ParameterConstraints
from shardkit.planner._diagnose import no_fit_error, no_option_error
from shardkit.planner._enumerate import enumerate_options
from shardkit.planner._evaluate import placement_stats, plan_stats
from shardkit.planner._modules import config_sources
from shardkit.planner._reservation import HeuristicalStorageReservation
from shardkit.planner._search import search
from shardkit.planner._stats import PlanStats
from shardkit.planner._tables import TableSource, resolve_tables
from shardkit.planner._topology import Topology
from shardkit.types import ShardingPlan

__all__ = ["PlanResult", "estimate_plan", "plan_sources", "plan_tables"]


@dataclass(frozen=True)
class PlanResult:
    """A plan and its estimates."""

    plan: ShardingPlan
    stats: PlanStats


def plan_sources(
    sources: Sequence[TableSource],
    topology: Topology,
    *,
    constraints: Mapping[str, ParameterConstraints] | None,
    batch_size: int,
    storage_reservation: HeuristicalStorageReservation,
    dense_parameter_bytes: int = 0,
) -> PlanResult:
    """Plan tables found in modules or given as configs."""
    _check_batch_size(batch_size)
    tables = resolve_tables(sources, constraints or {}, batch_size=batch_size)
    if not tables:
        return PlanResult(ShardingPlan({}), _empty_stats(topology, batch_size, storage_reservation))
    reservation = storage_reservation.reserve(
        topology, tables, dense_parameter_bytes=dense_parameter_bytes
    )
    options, rejections = enumerate_options(tables, topology, reservation.available)
    if not all(options):
        raise no_option_error(tables, options, rejections, topology, reservation, batch_size)
    result = search(options, topology, reservation.available)
    if not result.fits:
        raise no_fit_error(tables, options, result, topology, reservation, batch_size)
    plan = build_plan(tables, result.proposal, result.placement, topology)
    stats = placement_stats(
        tables,
        result.proposal,
        result.placement,
        topology,
        reservation,
        batch_size=batch_size,
        num_proposals=result.num_proposals,
    )
    return PlanResult(plan, stats)


def plan_tables(
    tables: Sequence[BaseEmbeddingConfig],
    topology: Topology,
    *,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    batch_size: int = BATCH_SIZE,
    storage_reservation: HeuristicalStorageReservation | None = None,
    fused_params: Mapping[str, Any] | None = None,
    is_weighted: bool = False,
    module_path: str = "",
) -> PlanResult:
    """Plan embedding tables given as configs, with no module, no memory, no processes.

    Args:
        tables: `EmbeddingBagConfig` (pooled) or `EmbeddingConfig` (sequence) tables of one
            collection.
        topology: the ranks to plan for.
        constraints: table name -> `ParameterConstraints`.
        batch_size: examples per rank per step (default 512).
        storage_reservation: what each rank keeps back (default: 15% margin; pass
            ``dense_tensor_estimate`` for the dense model, which configs alone cannot tell).
        fused_params: the sharder's fused kernel parameters; ``"optimizer"`` sets the optimizer
            state counted (default row-wise Adagrad).
        is_weighted: the collection's features carry per-id weights.
        module_path: where the collection sits in the model (the plan's outer key).

    Returns:
        the plan and its stats.

    Raises:
        PlannerError: no plan fits, or the constraints allow none; the message says why.
    """
    sources = config_sources(
        tables,
        compute_device=topology.compute_device,
        module_path=module_path,
        is_weighted=is_weighted,
        fused_params=fused_params,
    )
    return plan_sources(
        sources,
        topology,
        constraints=constraints,
        batch_size=batch_size,
        storage_reservation=storage_reservation or HeuristicalStorageReservation(),
    )


def estimate_plan(
    plan: ShardingPlan,
    tables: Sequence[BaseEmbeddingConfig],
    topology: Topology,
    *,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    batch_size: int = BATCH_SIZE,
    storage_reservation: HeuristicalStorageReservation | None = None,
    fused_params: Mapping[str, Any] | None = None,
    is_weighted: bool = False,
    module_path: str = "",
) -> PlanStats:
    """The planner's estimates for any ``plan`` of ``tables`` (a manual plan, another
    planner's): per-rank memory and cost, per-table layout, imbalance. Arguments as
    `plan_tables`; the plan need not fit."""
    _check_batch_size(batch_size)
    sources = config_sources(
        tables,
        compute_device=topology.compute_device,
        module_path=module_path,
        is_weighted=is_weighted,
        fused_params=fused_params,
    )
    specs = resolve_tables(sources, constraints or {}, batch_size=batch_size)
    policy = storage_reservation or HeuristicalStorageReservation()
    reservation = policy.reserve(topology, specs, dense_parameter_bytes=0)
    return plan_stats(plan, specs, topology, reservation, batch_size=batch_size)


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 (examples per rank), got {batch_size!r}")


def _empty_stats(topology, batch_size, policy) -> PlanStats:
    reservation = policy.reserve(topology, [], dense_parameter_bytes=0)
    return plan_stats(ShardingPlan({}), [], topology, reservation, batch_size=batch_size)
