"""Explaining why no plan fits: each table that cannot be placed, what it needs, the most any
rank has left, and what would fit instead (another sharding type, more ranks, a smaller batch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from shardkit.planner._enumerate import TYPE_ORDER, Option, Rejection, table_options
from shardkit.planner._errors import PlannerError, PlannerErrorType, format_bytes
from shardkit.planner._inputs import Reservation, Topology
from shardkit.planner._search import SearchResult
from shardkit.planner._tables import TableSpec

__all__ = ["no_fit_error", "no_option_error"]

_MAX_RANK_GROWTH = 64  # "more ranks" looks up to 64x the world size
_MAX_DETAILED = 10  # tables explained one by one; the rest are named


def no_option_error(
    tables: Sequence[TableSpec],
    options: Sequence[Sequence[Option]],
    rejections: Sequence[Sequence[Rejection]],
    topology: Topology,
    reservation: Reservation,
    batch_size: int,
) -> PlannerError:
    """Some tables have no option at all (each one too big, or ruled out by the constraints)."""
    lines = []
    for index, table in enumerate(tables):
        if options[index]:
            continue
        lines.append(
            f"  table '{table.key}' ({_shape(table)}): {_reasons(rejections[index], reservation)}"
        )
        fixes = _fixes(table, None, reservation.available, topology, reservation, batch_size)
        if fixes:
            lines.append(f"    would fit: {'; '.join(fixes)}")
    bad = sum(1 for o in options if not o)
    return PlannerError(
        f"no sharding plan: {bad} of {len(tables)} tables have no way to be sharded on "
        f"{_where(topology, reservation)}:\n" + "\n".join(lines),
        PlannerErrorType.INSUFFICIENT_STORAGE
        if all(r.needs is not None for i, o in enumerate(options) if not o for r in rejections[i])
        else PlannerErrorType.STRICT_CONSTRAINTS,
    )


def no_fit_error(
    tables: Sequence[TableSpec],
    options: Sequence[Sequence[Option]],
    result: SearchResult,
    topology: Topology,
    reservation: Reservation,
    batch_size: int,
) -> PlannerError:
    """Every table has options, but no proposal fits in memory all together."""
    failed = sorted(
        result.placement.failed, key=lambda f: (-result.proposal[f[0]].max_memory, f[0])
    )
    lines = []
    for position, most_free in failed[:_MAX_DETAILED]:
        option = result.proposal[position]
        table = tables[option.table]
        lines.append(
            f"  table '{table.key}' ({_shape(table)}): {option.sharding_type.value} needs "
            f"{format_bytes(option.max_memory)} on {_on(option)}; the most any rank has left is "
            f"{format_bytes(max(most_free, 0))}"
        )
        fixes = _fixes(table, option, max(most_free, 0), topology, reservation, batch_size)
        if fixes:
            lines.append(f"    would fit: {'; '.join(fixes)}")
    if len(failed) > _MAX_DETAILED:
        names = ", ".join(tables[result.proposal[p].table].key for p, _ in failed[_MAX_DETAILED:])
        lines.append(f"  and {len(failed) - _MAX_DETAILED} more: {names}")
    total = sum(min(o.total_memory for o in table) for table in options)
    needed = math.ceil(total / reservation.available)
    return PlannerError(
        f"no sharding plan fits: {len(failed)} of {len(tables)} tables cannot be placed on "
        f"{_where(topology, reservation)}. All tables together need at least "
        f"{format_bytes(total)} (each in its most compact layout): at least {needed} ranks of "
        "this size. Not placed, largest first:\n" + "\n".join(lines),
        PlannerErrorType.PARTITION,
    )


def _reasons(rejections: Sequence[Rejection], reservation: Reservation) -> str:
    """Structural reasons as they are; memory ones as one list of needs per rank."""
    reasons = [r.reason for r in rejections if r.needs is None]
    needs = [f"{r.sharding_type.value} {format_bytes(r.needs)}" for r in rejections if r.needs]
    if needs:
        reasons.append(
            f"each layout needs more than the {format_bytes(reservation.available)} a rank has "
            f"for tables ({', '.join(needs)} on a rank)"
        )
    return "; ".join(reasons)


def _where(topology: Topology, reservation: Reservation) -> str:
    return (
        f"{topology.world_size} ranks with {format_bytes(reservation.available)} for tables each "
        f"({format_bytes(reservation.capacity)} {topology.memory_kind} minus "
        f"{format_bytes(reservation.margin)} margin, {format_bytes(reservation.dense)} dense model, "
        f"{format_bytes(reservation.kjt)} input batches)"
    )


def _shape(table: TableSpec) -> str:
    return f"{table.num_embeddings} x {table.embedding_dim}, {table.element_size} B per weight"


def _on(option: Option) -> str:
    return "one rank" if option.num_shards == 1 else f"each of {option.num_shards} ranks"


def _fixes(table, option, free, topology, reservation, batch_size) -> list[str]:
    fixes = []
    others, _ = table_options(0, table, topology, free, table.sharder_choices)
    allowed = {t for t, _ in table.choices}
    excluded = sorted(
        {o.sharding_type for o in others if o.sharding_type not in allowed},
        key=TYPE_ORDER.__getitem__,
    )
    if excluded:
        needs = [
            f"{t.value} ({format_bytes(min(o.max_memory for o in others if o.sharding_type == t))} "
            "per rank)"
            for t in excluded
        ]
        fixes.append(f"{' or '.join(needs)}, which the constraints exclude")
    ranks = _ranks_needed(table, topology, reservation.available)
    if ranks is not None and ranks > topology.world_size:
        fixes.append(f"{ranks} ranks (world_size {topology.world_size} now) for this table alone")
    if option is not None and option.kinds[0].cost.io_memory > 0:
        fixed = option.max_memory - max(k.cost.io_memory for k in option.kinds)
        io = max(k.cost.io_memory for k in option.kinds)
        if fixed < free:
            smaller = math.floor(batch_size * (free - fixed) / io)
            if 1 <= smaller < batch_size:
                fixes.append(
                    f"batch_size <= {smaller} (its input/output buffers take {format_bytes(io)})"
                )
    return fixes


def _ranks_needed(table: TableSpec, topology: Topology, available: int) -> int | None:
    """Smallest world size (doubling, same hosts) where some option of the table fits."""
    world = topology.world_size
    while world <= topology.world_size * _MAX_RANK_GROWTH:
        bigger = dataclasses.replace(topology, world_size=world)
        if table_options(0, table, bigger, available, table.sharder_choices)[0]:
            return world
        world *= 2
    return None
