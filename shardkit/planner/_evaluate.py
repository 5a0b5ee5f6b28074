"""Per-rank and per-table estimates of a plan: the planner's own, or any `ShardingPlan`."""

from __future__ import annotations

from collections.abc import Sequence

from shardkit.planner._enumerate import Option
from shardkit.planner._estimate import ShardCost, estimate_shard
from shardkit.planner._partition import Placement
from shardkit.planner._reservation import Reservation
from shardkit.planner._stats import PlanStats, RankStats, TableStats
from shardkit.planner._tables import TableSpec
from shardkit.planner._topology import Topology
from shardkit.types import ParameterSharding, ShardingPlan, ShardingType

__all__ = ["placement_stats", "plan_stats"]


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
                rank // topology.local_world_size,
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
) -> PlanStats:
    """Stats of the planner's chosen options where the partition put them."""
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
    return _stats(topology, reservation, batch_size, ledger, per_table, num_proposals)


def plan_stats(
    plan: ShardingPlan,
    tables: Sequence[TableSpec],
    topology: Topology,
    reservation: Reservation,
    *,
    batch_size: int,
) -> PlanStats:
    """Stats of any plan for ``tables`` (e.g. a manual one, or another planner's)."""
    ledger = _Ledger(topology.world_size)
    per_table = []
    for table in tables:
        module = plan.get_plan_for_module(table.path)
        sharding = module.get(table.name) if module is not None else None
        if sharding is None:
            raise ValueError(f"the plan has no entry for table '{table.key}'")
        per_table.append(_account(table, sharding, topology, ledger))
    return _stats(topology, reservation, batch_size, ledger, per_table, 0)


def _account(
    table: TableSpec, sharding: ParameterSharding, topology: Topology, ledger: _Ledger
) -> TableStats:
    world = topology.world_size
    if sharding.sharding_type == ShardingType.DATA_PARALLEL:
        shapes = [((table.num_embeddings, table.embedding_dim), rank) for rank in range(world)]
    else:
        assert sharding.sharding_spec is not None
        shapes = [(tuple(s.shard_sizes), s.placement.rank()) for s in sharding.sharding_spec.shards]
    memo: dict[tuple[int, int], ShardCost] = {}
    memory, cost, runs = 0, 0.0, []
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
    )


def _stats(topology, reservation, batch_size, ledger, per_table, num_proposals) -> PlanStats:
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
    )
