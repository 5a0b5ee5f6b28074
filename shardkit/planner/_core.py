"""The planning pipeline, tables in, plan and stats out, behind the planner's one entry point
(`make_plan`), and the functions that plan or score table configs without a module.

resolve the tables with their constraints (`_tables`) -> reserve each rank's memory
(`_inputs`) -> enumerate the options of each table (`_enumerate`), each shard estimated
(`_estimate`) -> propose one option per table, partition the proposals onto ranks and improve
the best (`_search`, `_partition`) -> the plan and its stats (`_stats`); when nothing fits, an
error that says why and what would (`_diagnose`).

[Note: the planner is a pure function]
``make_plan(tables, topology, settings)`` depends only on its arguments: `TableSource` lists, a
`Topology`, constraints and a few numbers. Nothing reads the clock, the environment, a random
generator or an unordered container: tables keep their module order, options their enumeration
order, and every tie is broken by an explicit key ending in an index. So every rank that plans
the same model with the same topology gets the same plan, and ``collective_plan`` (plan on rank
0, broadcast) is only a way to save the others the work. The machine is read once, before: a
`Topology` built without capacities takes them from the memory of the machine that builds it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardkit.modules import BaseEmbeddingConfig
from shardkit.planner._constants import BATCH_SIZE
from shardkit.planner._diagnose import no_fit_error, no_option_error
from shardkit.planner._enumerate import enumerate_options
from shardkit.planner._inputs import HeuristicalStorageReservation, ParameterConstraints, Topology
from shardkit.planner._partition import build_plan
from shardkit.planner._predict import PlacedTable, StepPrediction, placed_tables, predict_step
from shardkit.planner._search import search
from shardkit.planner._stats import PlanStats, placement_stats, plan_stats
from shardkit.planner._tables import TableSource, config_sources, input_bytes, resolve_tables
from shardkit.types import ShardingPlan

__all__ = ["PlanResult", "PlannerSettings", "estimate_plan", "make_plan", "plan_tables"]


@dataclass(frozen=True)
class PlanResult:
    """A plan and its estimates (``plan.stats`` is ``stats``: the plan prints them)."""

    plan: ShardingPlan
    stats: PlanStats


@dataclass(frozen=True, kw_only=True)
class PlannerSettings:
    """What a planner is told besides the tables and the topology (None: the default).

    Args:
        constraints: table name -> `ParameterConstraints` (default: none).
        batch_size: examples per rank per step (default 512).
        storage_reservation: what each rank keeps back (default: 15% margin, the dense model and
            input batches).
        dense_parameters: parameters of the model's dense part, for the predicted step time
            with a profiled topology (default: its parameter bytes / 4 when planning a module,
            else 0).
        dense_flops_per_example: the dense part's forward flops per example (default 2 x its
            parameters, exact for MLPs; give it for layers that reuse weights or have none,
            e.g. DLRM's interaction).
    """

    constraints: Mapping[str, ParameterConstraints] | None = None
    batch_size: int = BATCH_SIZE
    storage_reservation: HeuristicalStorageReservation | None = None
    dense_parameters: int | None = None
    dense_flops_per_example: float | None = None

    def __post_init__(self) -> None:
        batch_size = self.batch_size
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(
                f"batch_size must be an int >= 1 (examples per rank), got {batch_size!r}"
            )
        constraints = dict(self.constraints or {})
        for name, value in constraints.items():
            if not isinstance(value, ParameterConstraints):
                raise TypeError(
                    f"constraints['{name}'] must be ParameterConstraints, got {value!r}"
                )
        object.__setattr__(self, "constraints", constraints)
        for name in ("dense_parameters", "dense_flops_per_example"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.storage_reservation is None:
            object.__setattr__(self, "storage_reservation", HeuristicalStorageReservation())


def make_plan(
    tables: Sequence[TableSource],
    topology: Topology,
    settings: PlannerSettings,
    *,
    dense_parameter_bytes: int = 0,
    given: ShardingPlan | None = None,
) -> PlanResult:
    """The best plan for ``tables`` on ``topology`` and its stats; with ``given``, that plan
    (hand-written, another planner's; it need not fit) and the planner's stats for it.

    Args:
        tables: the tables, found in modules or given as configs (see `_tables`).
        topology: the ranks to plan for.
        settings: constraints, batch size and storage reservation.
        dense_parameter_bytes: bytes of the model's other parameters (the dense part).
        given: a plan to score instead of planning.

    Raises:
        PlannerError: no plan fits, or the constraints allow none; the message says why.
    """
    assert settings.constraints is not None and settings.storage_reservation is not None
    batch_size = settings.batch_size
    specs = resolve_tables(tables, settings.constraints, batch_size=batch_size)
    reservation = settings.storage_reservation.reserve(
        topology,
        input_bytes=input_bytes(specs),
        dense_parameter_bytes=dense_parameter_bytes if specs else 0,  # no table, nothing to fit
    )
    predict = _predictor(settings, topology, dense_parameter_bytes)
    if given is not None or not specs:
        plan = ShardingPlan({}) if given is None else given
        stats = plan_stats(
            plan, specs, topology, reservation, batch_size=batch_size, predict=predict
        )
        return PlanResult(ShardingPlan(plan.plan, stats=stats), stats)
    options, rejections = enumerate_options(specs, topology, reservation.available)
    if not all(options):
        raise no_option_error(specs, options, rejections, topology, reservation, batch_size)
    scorer = None
    if predict is not None:

        def scorer(proposal, placement) -> float:
            placed = placed_tables(specs, proposal, placement.ranks, topology.world_size)
            return predict(placed).step_ms

    result = search(options, topology, reservation.available, scorer=scorer)
    if not result.fits:
        raise no_fit_error(specs, options, result, topology, reservation, batch_size)
    stats = placement_stats(
        specs,
        result.proposal,
        result.placement,
        topology,
        reservation,
        batch_size=batch_size,
        num_proposals=result.num_proposals,
        predict=predict,
    )
    plan = build_plan(specs, result.proposal, result.placement, topology)
    return PlanResult(ShardingPlan(plan.plan, stats=stats), stats)


def _predictor(
    settings: PlannerSettings, topology: Topology, dense_parameter_bytes: int
) -> Callable[[Sequence[PlacedTable]], StepPrediction] | None:
    """The step-time prediction for placed tables, when the topology carries a profile."""
    if topology.profile is None:
        return None
    parameters = settings.dense_parameters
    if parameters is None:
        parameters = dense_parameter_bytes // 4
    return functools.partial(
        predict_step,
        topology=topology,
        batch_size=settings.batch_size,
        dense_parameters=int(parameters),
        dense_flops_per_example=settings.dense_flops_per_example,
    )


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
    dense_parameters: int = 0,
    dense_flops_per_example: float | None = None,
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
        dense_parameters, dense_flops_per_example: the dense part of the model, for the
            predicted step time when ``topology`` carries a profile (see `PlannerSettings`).

    Returns:
        the plan and its stats.

    Raises:
        PlannerError: no plan fits, or the constraints allow none; the message says why.
    """
    settings = PlannerSettings(
        constraints=constraints,
        batch_size=batch_size,
        storage_reservation=storage_reservation,
        dense_parameters=dense_parameters,
        dense_flops_per_example=dense_flops_per_example,
    )
    sources = config_sources(
        tables,
        compute_device=topology.compute_device,
        module_path=module_path,
        is_weighted=is_weighted,
        fused_params=fused_params,
    )
    return make_plan(sources, topology, settings)


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
    dense_parameters: int = 0,
    dense_flops_per_example: float | None = None,
) -> PlanStats:
    """The planner's estimates for any ``plan`` of ``tables`` (a manual plan, another
    planner's): per-rank memory and cost, per-table layout, imbalance. Arguments as
    `plan_tables`; the plan need not fit."""
    settings = PlannerSettings(
        constraints=constraints,
        batch_size=batch_size,
        storage_reservation=storage_reservation,
        dense_parameters=dense_parameters,
        dense_flops_per_example=dense_flops_per_example,
    )
    sources = config_sources(
        tables,
        compute_device=topology.compute_device,
        module_path=module_path,
        is_weighted=is_weighted,
        fused_params=fused_params,
    )
    return make_plan(sources, topology, settings, given=plan).stats
