"""Plans as text: aligned columns, rank ranges, module names, and the layout of a plan that
carries no estimates (one made by hand, or read from JSON).

The planner's own plans carry its estimates and print its stats table (``shardkit.planner``'s
`PlanStats`); this module prints the rest from the plan alone: per rank, the shards and
parameters (rows x columns) it holds; per table, its sharding type, kernel, ranks and shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A `ParameterSharding` (typed loosely: ``_plan`` imports this module, not the other way round).
ParameterSharding = Any

__all__ = [
    "format_columns",
    "format_ranks",
    "layout_text",
    "module_label",
    "short_sharding",
]

_NO_ESTIMATES = (
    "(no memory or cost estimates: the plan was made by hand or read from JSON; plans the "
    "planner makes carry them)"
)


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3,7"``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_columns(rows: Sequence[Sequence[str]], *, left: set[int]) -> list[str]:
    """Rows of cells as aligned lines: columns in ``left`` flush left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def module_label(path: str) -> str:
    """How a plan names the module at ``path``: ``"module a.b"``; the model itself has path
    ``''`` and is ``"module (the model itself)"``."""
    return f"module {path}" if path else "module (the model itself)"


def short_sharding(sharding: ParameterSharding) -> str:
    """One table in a few words: ``"row_wise on 0-3"``."""
    ranks = sharding.ranks
    if ranks is None and sharding.sharding_spec is not None:
        ranks = [s.placement.rank() for s in sharding.sharding_spec.shards]
    where = "every rank" if ranks is None else format_ranks(ranks)
    return f"{sharding.sharding_type.value} on {where}"


_Tables = Mapping[str, ParameterSharding]  # table name -> its sharding


def layout_text(modules: Mapping[str, _Tables] | Mapping[str | None, _Tables]) -> str:
    """The layout of the tables of ``modules`` (module path, None if unknown -> table name ->
    sharding): per rank, its shards and parameters; per module, each table's type, kernel,
    ranks and shards."""
    num_tables = sum(len(tables) for tables in modules.values())
    world = 1 + max(
        (r for tables in modules.values() for s in tables.values() for r in _ranks(s)), default=0
    )
    lines = [
        f"{num_tables} tables in {len(modules)} module(s) on {world} ranks",
        _NO_ESTIMATES,
        "",
        *_rank_rows(modules, world),
    ]
    table_rows: list[tuple[str, ...]] = [("table", "type", "kernel", "ranks", "shards")]
    starts = []
    for path, tables in modules.items():
        label = "module (path unknown)" if path is None else module_label(path)
        starts.append((len(table_rows), label))
        table_rows.extend(_table_row(name, sharding) for name, sharding in tables.items())
    aligned = format_columns(table_rows, left={0, 1, 2, 3, 4})
    lines += ["", aligned[0]]
    for (start, label), (end, _) in zip(starts, [*starts[1:], (len(table_rows), "")]):
        lines += [label, *aligned[start:end]]
    return "\n".join(lines)


def _ranks(sharding: ParameterSharding) -> list[int]:
    if sharding.sharding_spec is None:
        return list(sharding.ranks or [])
    return [s.placement.rank() for s in sharding.sharding_spec.shards]


def _rank_rows(
    modules: Mapping[str, _Tables] | Mapping[str | None, _Tables], world: int
) -> list[str]:
    shards, parameters, replicas = [0] * world, [0] * world, [0] * world
    for tables in modules.values():
        for sharding in tables.values():
            if sharding.sharding_spec is None:  # a replica: its size is not in the plan
                for rank in sharding.ranks or range(world):
                    replicas[rank] += 1
                continue
            for shard in sharding.sharding_spec.shards:
                rows, cols = shard.shard_sizes
                shards[shard.placement.rank()] += 1
                parameters[shard.placement.rank()] += rows * cols
    rows_out = [("rank", "shards", "parameters", "replicated tables")]
    for rank in range(world):
        rows_out.append(
            (str(rank), str(shards[rank]), f"{parameters[rank]:,}", str(replicas[rank]))
        )
    return format_columns(rows_out, left=set())


def _table_row(name: str, sharding: ParameterSharding) -> tuple[str, ...]:
    spec = sharding.sharding_spec
    if spec is None:
        shards, ranks = "a replica on each rank", "all"
        if sharding.ranks is not None:
            ranks = format_ranks(sharding.ranks)
    else:
        runs: list[list] = []
        for shard in spec.shards:
            if runs and runs[-1][1] == shard.shard_sizes:
                runs[-1][0] += 1
            else:
                runs.append([1, shard.shard_sizes])
        shards = ", ".join(f"{n} x [{r}, {c}]" for n, (r, c) in runs)
        ranks = format_ranks([s.placement.rank() for s in spec.shards])
    return (
        f"  {name}",
        sharding.sharding_type.value,
        sharding.compute_kernel.value,
        ranks,
        shards,
    )
