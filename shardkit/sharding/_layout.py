"""Where each table's shards live, and the route a feature's ids take to them.

[Note: routes]
Every feature of a sharded collection is served in one or more *units*: column blocks of its
table, each ``[B, cols]`` per batch, concatenated in column order to give the feature's vector.
A unit reaches its shards by one of four routes, fixed by the table's sharding type:

- PLACED (table-wise, column-wise, table-column-wise): the unit is one shard holding all rows;
  it receives all of the feature's ids, pools them, and the pooled rows go back to the ranks
  that own the bags by all-to-all.
- SUMMED (row-wise): the unit has one row-range shard on every rank; ids are bucketed by range
  and rebased to shard rows; every rank pools partial sums for every bag of the global batch and
  a reduce-scatter adds them and hands each rank its own bags.
- HOST_SUMMED (table-row-wise, grid): as SUMMED over the ranks of one host; the partial sums are
  added by a reduce-scatter inside the host, then sent to the bags' ranks by an all-to-all
  across hosts.
- LOCAL (data-parallel): a replica on every rank looks up the local batch; no communication.

A *slot* is a (unit, shard) pair: the unit's ids that go to that shard's rank. Every rank orders
slots the same way (by unit, then shard), so a rank receives the same slot list from every source.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardkit.modules import BaseEmbeddingConfig
from shardkit.types import ParameterSharding, ShardingType, validate_module_plan

__all__ = ["Layout", "Route", "ShardSlice", "Slot", "Unit", "build_layout"]


class Route(enum.Enum):
    """How a unit's ids and outputs travel. See [Note: routes]."""

    PLACED = "placed"
    SUMMED = "summed"
    HOST_SUMMED = "host_summed"
    LOCAL = "local"


_ROUTES = {
    ShardingType.TABLE_WISE: Route.PLACED,
    ShardingType.COLUMN_WISE: Route.PLACED,
    ShardingType.TABLE_COLUMN_WISE: Route.PLACED,
    ShardingType.ROW_WISE: Route.SUMMED,
    ShardingType.TABLE_ROW_WISE: Route.HOST_SUMMED,
    ShardingType.GRID_SHARD: Route.HOST_SUMMED,
    ShardingType.DATA_PARALLEL: Route.LOCAL,
}


@dataclass(frozen=True)
class ShardSlice:
    """Block ``[row_start, row_start + rows) x [col_start, col_start + cols)`` of a table on ``rank``."""

    table: str
    rank: int
    row_start: int
    rows: int
    col_start: int
    cols: int


@dataclass(frozen=True)
class Unit:
    """One column block of one feature, and the shards that serve it."""

    index: int  # position in `Layout.units`
    feature: str
    feature_index: int  # in the module's feature order
    table_index: int  # in the module's table order
    route: Route
    col_start: int
    cols: int
    shards: tuple[
        ShardSlice, ...
    ]  # PLACED: 1; SUMMED: one per rank; HOST_SUMMED: one per host rank
    host: int | None = None  # HOST_SUMMED: the host that holds the shards


@dataclass(frozen=True)
class Slot:
    """A unit's ids bound for one of its shards (see [Note: routes])."""

    unit: Unit
    shard: ShardSlice

    @property
    def rank(self) -> int:
        return self.shard.rank


@dataclass(frozen=True)
class Layout:
    """The sharding of one collection, the same on every rank."""

    configs: tuple[BaseEmbeddingConfig, ...]
    units: tuple[Unit, ...]
    world_size: int
    local_world_size: int
    fused: tuple[bool, ...]  # per table: FUSED kernel (else DENSE)

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def slots_to(self, rank: int) -> list[Slot]:
        """The slots every rank sends to ``rank``, in the common order."""
        return [Slot(u, s) for u in self.units for s in u.shards if s.rank == rank]

    def units_of(self, route: Route) -> list[Unit]:
        return [u for u in self.units if u.route == route]

    def replicated_tables(self, *, fused: bool) -> list[int]:
        """Indices of the data-parallel tables with (or without) the FUSED kernel."""
        local = {u.table_index for u in self.units_of(Route.LOCAL)}
        return [i for i in sorted(local) if self.fused[i] == fused]

    def local_shards(self, rank: int) -> list[ShardSlice]:
        """The distinct shards stored on ``rank`` (a table's shard once even if several of its
        features use it), in table order."""
        seen: dict[tuple, ShardSlice] = {}
        for unit in self.units:
            for shard in unit.shards:
                if shard.rank == rank:
                    seen.setdefault((unit.table_index, shard.row_start, shard.col_start), shard)
        return [seen[k] for k in sorted(seen)]


def build_layout(
    configs: Sequence[BaseEmbeddingConfig],
    plan: Mapping[str, ParameterSharding],
    *,
    world_size: int,
    local_world_size: int,
) -> Layout:
    """Units and shards of every feature from a module's plan (table name -> sharding)."""
    if world_size % local_world_size:
        raise ValueError(
            f"world_size ({world_size}) must be a multiple of local_world_size ({local_world_size})"
        )
    missing = [c.name for c in configs if c.name not in plan]
    extra = sorted(set(plan) - {c.name for c in configs})
    if missing or extra:
        raise ValueError(
            f"the sharding plan does not match the module's tables: no plan for {missing}, "
            f"plans for unknown tables {extra}"
        )
    validate_module_plan(plan)  # plans are mutable: an edited one is checked where applied
    units: list[Unit] = []
    fused = []
    feature_index = 0
    for table_index, config in enumerate(configs):
        sharding = plan[config.name]
        fused.append(sharding.compute_kernel.name == "FUSED")
        blocks = _column_blocks(config, sharding, world_size, local_world_size)
        for feature in config.feature_names:
            for col_start, cols, shards, host in blocks:
                units.append(
                    Unit(
                        index=len(units),
                        feature=feature,
                        feature_index=feature_index,
                        table_index=table_index,
                        route=_ROUTES[sharding.sharding_type],
                        col_start=col_start,
                        cols=cols,
                        shards=shards,
                        host=host,
                    )
                )
            feature_index += 1
    return Layout(tuple(configs), tuple(units), world_size, local_world_size, tuple(fused))


def _column_blocks(
    config: BaseEmbeddingConfig,
    sharding: ParameterSharding,
    world_size: int,
    local_world_size: int,
) -> list[tuple[int, int, tuple[ShardSlice, ...], int | None]]:
    """(col_start, cols, shards, host) of each column block of a table."""
    rows, dim = config.num_embeddings, config.embedding_dim
    kind = sharding.sharding_type
    if kind == ShardingType.DATA_PARALLEL:
        return [(0, dim, (), None)]
    assert sharding.sharding_spec is not None, "every sharding but data-parallel has a spec"
    shards = [
        ShardSlice(
            table=config.name,
            rank=shard.placement.rank(),
            row_start=shard.shard_offsets[0],
            rows=shard.shard_sizes[0],
            col_start=shard.shard_offsets[1],
            cols=shard.shard_sizes[1],
        )
        for shard in sharding.sharding_spec.shards
    ]
    _check_tiling(config, shards, world_size)
    by_column: dict[int, list[ShardSlice]] = {}
    for shard in shards:
        by_column.setdefault(shard.col_start, []).append(shard)
    route = _ROUTES[kind]
    blocks = []
    for col_start in sorted(by_column):
        group = sorted(by_column[col_start], key=lambda s: s.row_start)
        if route == Route.PLACED and len(group) != 1:
            raise ValueError(
                f"table '{config.name}' ({kind.value}): column block at {col_start} has "
                f"{len(group)} row shards; {kind.value} shards must each hold all {rows} rows"
            )
        host = None
        if route == Route.HOST_SUMMED:
            hosts = {s.rank // local_world_size for s in group}
            if len(hosts) != 1:
                raise ValueError(
                    f"table '{config.name}' ({kind.value}): the row shards of a column block "
                    f"must be on one host, got ranks {[s.rank for s in group]} with "
                    f"{local_world_size} ranks per host"
                )
            host = hosts.pop()
        if route == Route.SUMMED and sorted(s.rank for s in group) != list(range(world_size)):
            raise ValueError(
                f"table '{config.name}' (row_wise): needs one row shard on each of the "
                f"{world_size} ranks, got ranks {[s.rank for s in group]}"
            )
        blocks.append((col_start, group[0].cols, tuple(group), host))
    return blocks


def _check_tiling(config: BaseEmbeddingConfig, shards: list[ShardSlice], world_size: int) -> None:
    """The shards must cover the table exactly once and sit on real ranks."""
    for shard in shards:
        if not 0 <= shard.rank < world_size:
            raise ValueError(
                f"table '{config.name}': a shard is placed on rank {shard.rank}, outside the "
                f"{world_size} ranks"
            )
    area = sum(s.rows * s.cols for s in shards)
    inside = all(
        s.row_start + s.rows <= config.num_embeddings
        and s.col_start + s.cols <= config.embedding_dim
        for s in shards
    )
    if area != config.num_embeddings * config.embedding_dim or not inside:
        raise ValueError(
            f"table '{config.name}' [{config.num_embeddings}, {config.embedding_dim}]: its shards "
            f"{[(s.row_start, s.rows, s.col_start, s.cols) for s in shards]} (row, rows, col, cols) "
            "do not tile the table exactly"
        )
