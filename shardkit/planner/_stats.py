"""`PlanStats`: what a plan costs, per rank and per table, as data and as a printable table;
computed for the planner's own placement (`placement_stats`) or for any `ShardingPlan`
(`plan_stats`: a manual plan, another planner's). The plans the planner returns carry their
stats, so ``print(plan)`` shows this table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardkit.planner._enumerate import Option
from shardkit.planner._errors import format_bytes
from shardkit.planner._estimate import ShardCost, estimate_shard
from shardkit.planner._inputs import Reservation, Topology
from shardkit.planner._partition import Placement
from shardkit.planner._predict import PlacedTable, StepPrediction, placed_tables
from shardkit.planner._tables import TableSpec
from shardkit.types import (
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    format_columns,
    format_ranks,
    module_label,
)

__all__ = ["PlanStats", "RankStats", "TableStats", "placement_stats", "plan_stats"]


@dataclass(frozen=True)
class RankStats:
    """One rank: bytes of table shards, ms of lookups and communication, number of shards."""

    rank: int
    host: int
    memory: int
    compute: float
    comms: float
    num_shards: int

    @property
    def cost(self) -> float:
        return self.compute + self.comms


@dataclass(frozen=True)
class TableStats:
    """One table: how it is sharded and what it costs in all (``shards``: (count, rows, cols)).

    ``table`` is ``module.name`` (just ``name`` in the model itself); ``module`` its module's
    path in the model.
    """

    table: str
    num_embeddings: int
    embedding_dim: int
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    shards: tuple[tuple[int, int, int], ...]
    memory: int
    cost: float
    module: str = ""

    @property
    def name(self) -> str:
        """The table's name inside its module."""
        return self.table[len(self.module) + 1 :] if self.module else self.table


@dataclass(frozen=True)
class PlanStats:
    """A plan's estimates. ``str(stats)`` is the table the planner logs.

    Memory is per rank in bytes: ``capacity`` of the compute device (``memory_source`` says
    where it came from: given, or read from the machine), of which ``margin``, ``dense`` (the
    dense model) and ``kjt`` (input batches) are reserved, leaving ``available`` for table
    shards. Costs are estimated ms per training step (see docs/planner.md).
    """

    world_size: int
    local_world_size: int
    compute_device: str
    batch_size: int
    capacity: int
    margin: int
    dense: int
    kjt: int
    ranks: tuple[RankStats, ...]
    tables: tuple[TableStats, ...]
    num_proposals: int = 0
    memory_source: str = "given"
    prediction: StepPrediction | None = None

    @property
    def available(self) -> int:
        return self.capacity - self.margin - self.dense - self.kjt

    @property
    def cost_imbalance(self) -> float:
        """max / mean of per-rank cost (1.0 is perfect balance)."""
        return _imbalance([r.cost for r in self.ranks])

    @property
    def memory_imbalance(self) -> float:
        """max / mean of per-rank memory."""
        return _imbalance([r.memory for r in self.ranks])

    @property
    def max_cost(self) -> float:
        return max(r.cost for r in self.ranks)

    @property
    def max_memory(self) -> int:
        return max(r.memory for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            available=self.available,
            cost_imbalance=self.cost_imbalance,
            memory_imbalance=self.memory_imbalance,
        )
        return data

    def __str__(self) -> str:
        return self.text()

    def text(self, module: str | None = None) -> str:
        """The table: header, one row per rank, then the tables module by module (only those
        of the module at path ``module`` if given)."""
        ranks = self._rank_rows() if self.prediction is None else self._predicted_rows()
        return "\n".join([*self._header(), "", *ranks, "", *self._table_rows(module)])

    def _predicted_rows(self) -> list[str]:
        """Per rank: memory, then the predicted ms of each part of its step."""
        assert self.prediction is not None
        rows = [
            ("rank", "host", "memory", "% avail", "step ms", "embedding", "input dist",
             "output dist", "dense", "all-reduce", "shards")
        ]  # fmt: skip
        for r, p in zip(self.ranks, self.prediction.ranks):
            rows.append(
                (
                    str(r.rank),
                    str(r.host),
                    format_bytes(r.memory),
                    _percent(r.memory, self.available),
                    f"{p.total:.4g}",
                    f"{p.embedding:.4g}",
                    f"{p.input_dist:.4g}",
                    f"{p.output_dist:.4g}",
                    f"{p.dense:.4g}",
                    f"{p.dense_all_reduce:.4g}",
                    str(r.num_shards),
                )
            )
        return format_columns(rows, left=set())

    def _header(self) -> list[str]:
        hosts = self.world_size // self.local_world_size
        kind = "hbm" if self.compute_device == "cuda" else "ddr"
        modules = len({t.module for t in self.tables})
        return [
            f"{len(self.tables)} tables in {modules} module(s) on "
            f"{self.world_size} ranks ({hosts} host(s) x {self.local_world_size}), "
            f"{self.compute_device}, batch size {self.batch_size} per rank",
            f"memory per rank: {format_bytes(self.capacity)} {kind} ({self.memory_source})",
            f"  of which {format_bytes(self.margin)} margin, {format_bytes(self.dense)} dense "
            f"model, {format_bytes(self.kjt)} input batches; {format_bytes(self.available)} for "
            "tables",
            f"imbalance (max/mean): cost {self.cost_imbalance:.3f}, memory "
            f"{self.memory_imbalance:.3f}; max cost {self.max_cost:.4g} ms, max memory "
            f"{format_bytes(self.max_memory)} ({_percent(self.max_memory, self.available)}% "
            "of the memory for tables)",
            *([self.prediction.summary()] if self.prediction is not None else []),
        ]

    def _rank_rows(self) -> list[str]:
        rows = [
            ("rank", "host", "memory", "% avail", "free", "cost ms", "compute", "comms", "shards")
        ]
        for r in self.ranks:
            rows.append(
                (
                    str(r.rank),
                    str(r.host),
                    format_bytes(r.memory),
                    _percent(r.memory, self.available),
                    _signed_bytes(self.available - r.memory),
                    f"{r.cost:.4g}",
                    f"{r.compute:.4g}",
                    f"{r.comms:.4g}",
                    str(r.num_shards),
                )
            )
        return format_columns(rows, left=set())

    def _table_rows(self, module: str | None) -> list[str]:
        rows: list[tuple[str, ...]] = [
            ("table", "rows x dim", "type", "kernel", "ranks", "shards", "memory", "cost ms")
        ]
        groups: dict[str, list[tuple[str, ...]]] = {}
        for t in self.tables:
            if module is not None and t.module != module:
                continue
            shards = ", ".join(f"{n} x [{r}, {c}]" for n, r, c in t.shards)
            groups.setdefault(t.module, []).append(
                (
                    f"  {t.name}",
                    f"{t.num_embeddings} x {t.embedding_dim}",
                    t.sharding_type,
                    t.compute_kernel,
                    format_ranks(t.ranks),
                    shards,
                    format_bytes(t.memory),
                    f"{t.cost:.4g}",
                )
            )
        for group in groups.values():
            rows.extend(group)
        aligned = format_columns(rows, left={0, 1, 2, 3, 4, 5})
        lines, start = [aligned[0]], 1
        for path, group in groups.items():
            lines += [module_label(path), *aligned[start : start + len(group)]]
            start += len(group)
        return lines


def _percent(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole``: 1 decimal, 2 significant digits below 1%."""
    if whole <= 0:
        return "-"
    share = 100.0 * part / whole
    return f"{share:.2g}" if 0 < share < 1 else f"{share:.1f}"


def _signed_bytes(value: int) -> str:
    return format_bytes(value) if value >= 0 else f"-{format_bytes(-value)}"


def _imbalance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


class _Ledger:
    """Per-rank sums; ranges of ranks are added as steps and summed once at the end."""

    def __init__(self, world_size: int) -> None:
        self.steps = [[0.0] * (world_size + 1) for _ in range(4)]  # memory, compute, comms, shards

    def add(self, first: int, end: int, cost: ShardCost) -> None:
        for step, value in zip(self.steps, (cost.memory, cost.compute, cost.comms, 1)):
            step[first] += value
            step[end] -= value

    def ranks(self, topology: Topology) -> tuple[RankStats, ...]:
        sums = []
        for step in self.steps:
            running, column = 0.0, []
            for value in step[:-1]:
                running += value
                column.append(running)
            sums.append(column)
        return tuple(
            RankStats(
                rank,
                rank // topology.intra_group_size,
                round(memory),
                compute,
                comms,
                round(shards),
            )
            for rank, (memory, compute, comms, shards) in enumerate(zip(*sums))
        )


def placement_stats(
    tables: Sequence[TableSpec],
    proposal: Sequence[Option],
    where: Placement,
    topology: Topology,
    reservation: Reservation,
    *,
    batch_size: int,
    num_proposals: int,
    predict: Predict | None = None,
) -> PlanStats:
    """Stats of the planner's chosen options where the partition put them (and their
    predicted step, given ``predict``)."""
    ledger = _Ledger(topology.world_size)
    per_table = []
    for table, option, ranks in zip(tables, proposal, where.ranks):
        if ranks is None:  # uniform: shard i on rank i
            start = 0
            for kind in option.kinds:
                ledger.add(start, start + kind.count, kind.cost)
                start += kind.count
            ranks = list(range(topology.world_size))
        else:
            for rank, shard in zip(ranks, option.shards()):
                ledger.add(rank, rank + 1, shard.cost)
        shards = tuple((k.count, k.rows, k.cols) for k in option.kinds)
        per_table.append(
            _table_stats(
                table,
                option.sharding_type.value,
                option.kernel.value,
                ranks,
                shards,
                option.total_memory,
                option.total_cost,
            )
        )
    prediction = None
    if predict is not None:
        prediction = predict(placed_tables(tables, proposal, where.ranks, topology.world_size))
    return _stats(topology, reservation, batch_size, ledger, per_table, num_proposals, prediction)


Predict = Callable[[Sequence[PlacedTable]], StepPrediction]


def plan_stats(
    plan: ShardingPlan,
    tables: Sequence[TableSpec],
    topology: Topology,
    reservation: Reservation,
    *,
    batch_size: int,
    predict: Predict | None = None,
) -> PlanStats:
    """Stats of any plan for ``tables`` (e.g. a manual one, or another planner's), with its
    predicted step given ``predict``."""
    ledger = _Ledger(topology.world_size)
    per_table, placed = [], []
    for table in tables:
        module = plan.get_plan_for_module(table.path)
        sharding = module.get(table.name) if module is not None else None
        if sharding is None:
            raise ValueError(f"the plan has no entry for table '{table.key}'")
        stats = _account(table, sharding, topology, ledger)
        per_table.append(stats)
        placed.append(
            PlacedTable(
                table, sharding.sharding_type, sharding.compute_kernel, stats.shards, stats.ranks
            )
        )
    prediction = predict(placed) if predict is not None and tables else None
    return _stats(topology, reservation, batch_size, ledger, per_table, 0, prediction)


def _account(
    table: TableSpec, sharding: ParameterSharding, topology: Topology, ledger: _Ledger
) -> TableStats:
    world = topology.world_size
    if sharding.sharding_type == ShardingType.DATA_PARALLEL:
        shapes = [((table.num_embeddings, table.embedding_dim), rank) for rank in range(world)]
    else:
        assert sharding.sharding_spec is not None
        shapes = [
            ((s.shard_sizes[0], s.shard_sizes[1]), s.placement.rank())
            for s in sharding.sharding_spec.shards
        ]
    memo: dict[tuple[int, int], ShardCost] = {}
    runs: list[tuple[int, int, int]] = []
    memory, cost = 0, 0.0
    for (rows, cols), rank in shapes:
        if not 0 <= rank < world:
            raise ValueError(
                f"table '{table.key}' has a shard on rank {rank}, outside world_size {world}"
            )
        shard = memo.get((rows, cols))
        if shard is None:
            shard = memo[rows, cols] = estimate_shard(
                table, sharding.sharding_type, sharding.compute_kernel, rows, cols, topology
            )
        ledger.add(rank, rank + 1, shard)
        memory, cost = memory + shard.memory, cost + shard.total
        if runs and runs[-1][1:] == (rows, cols):
            runs[-1] = (runs[-1][0] + 1, rows, cols)
        else:
            runs.append((1, rows, cols))
    ranks = [rank for _, rank in shapes]
    return _table_stats(
        table,
        sharding.sharding_type.value,
        sharding.compute_kernel.value,
        ranks,
        tuple(runs),
        memory,
        cost,
    )


def _table_stats(table, sharding_type, kernel, ranks, shards, memory, cost) -> TableStats:
    return TableStats(
        table.key,
        table.num_embeddings,
        table.embedding_dim,
        sharding_type,
        kernel,
        tuple(ranks),
        shards,
        memory,
        cost,
        table.path,
    )


def _stats(
    topology, reservation, batch_size, ledger, per_table, num_proposals, prediction=None
) -> PlanStats:
    return PlanStats(
        world_size=topology.world_size,
        local_world_size=topology.local_world_size,
        compute_device=topology.compute_device,
        batch_size=batch_size,
        capacity=reservation.capacity,
        margin=reservation.margin,
        dense=reservation.dense,
        kjt=reservation.kjt,
        ranks=ledger.ranks(topology),
        tables=tuple(per_table),
        num_proposals=num_proposals,
        memory_source=topology.memory_source,
        prediction=prediction,
    )
