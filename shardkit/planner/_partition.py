"""Placing a proposal (one option per table) on ranks: greedy, largest first, under memory;
and the placed proposal as the `ShardingPlan` users see (`build_plan`).

[Note: greedy partition]
Uniform options (row-wise, data-parallel) go first: shard ``i`` on rank ``i``, so they add the
same load to every rank (but for the one-row differences of [Note: even splits]). Then options
placed by host (table-row-wise, table-column-wise, grid), then by device (table-wise,
column-wise), each group largest cost first (longest-processing-time order). Each goes where the
estimated cost is lowest among the ranks (or hosts) with memory left for it: ties go to less
memory used, then to the lower rank, which makes placement deterministic. A table's column
shards land on distinct ranks (grid blocks on distinct hosts). An option that fits nowhere is
recorded as failed and the others are still placed, so an error can name every table that did
not fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.planner._enumerate import Option, Partition, expand, offsets_of
from shardkit.planner._inputs import Topology
from shardkit.planner._tables import TableSpec
from shardkit.types import (
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    ShardPlacement,
    placement,
)

__all__ = [
    "Placement",
    "build_plan",
    "partition",
    "shard_layout",
]


@dataclass
class Placement:
    """Where a proposal's shards went.

    ``ranks[i]`` lists the rank of each shard of ``proposal[i]`` (None: uniform, shard ``j`` on
    rank ``j``); ``cost`` and ``memory`` are per rank; ``failed`` holds the positions of the
    options that fit nowhere, with the most memory any rank had left when each was tried.
    """

    ranks: list[list[int] | None]
    cost: list[float]
    memory: list[int]
    failed: list[tuple[int, int]]

    @property
    def max_cost(self) -> float:
        return max(self.cost)

    @property
    def max_memory(self) -> int:
        return max(self.memory)


def partition(proposal: Sequence[Option], topology: Topology, available: int) -> Placement:
    """Place ``proposal`` on ``topology`` with ``available`` bytes per rank. See
    [Note: greedy partition]."""
    world = topology.world_size
    placement = Placement([None] * len(proposal), [0.0] * world, [0] * world, [])
    by_kind: dict[Partition, list[int]] = {kind: [] for kind in Partition}
    for position, option in enumerate(proposal):
        by_kind[option.partition].append(position)
    _place_uniform(proposal, by_kind[Partition.UNIFORM], placement, available)
    hosted = by_kind[Partition.HOST] + by_kind[Partition.GRID]
    hosted.sort(key=lambda p: (-proposal[p].total_cost, -proposal[p].total_memory, p))
    _place_on_hosts(proposal, hosted, placement, topology, available)
    devices = by_kind[Partition.DEVICE]
    devices.sort(key=lambda p: (-proposal[p].max_cost, -proposal[p].max_memory, p))
    _place_on_devices(proposal, devices, placement, available)
    placement.failed.sort()
    return placement


def _place_uniform(
    proposal: Sequence[Option], positions: list[int], placement: Placement, available: int
) -> None:
    world = len(placement.cost)
    cost_steps, memory_steps = [0.0] * (world + 1), [0] * (world + 1)
    per_option = []
    for position in positions:
        start = 0
        for kind in proposal[position].kinds:
            end = start + kind.count
            cost_steps[start] += kind.cost.total
            cost_steps[end] -= kind.cost.total
            memory_steps[start] += kind.cost.memory
            memory_steps[end] -= kind.cost.memory
            start = end
        per_option.append(position)
    cost, memory = 0.0, 0
    for rank in range(world):
        cost += cost_steps[rank]
        memory += memory_steps[rank]
        placement.cost[rank] = cost
        placement.memory[rank] = memory
    # Too much for some rank: drop the biggest uniform options until the rest fit.
    per_option.sort(key=lambda p: (-proposal[p].max_memory, p))
    for position in per_option:
        if max(placement.memory) <= available:
            break
        _remove_uniform(proposal[position], placement)
        placement.failed.append((position, available - max(placement.memory)))


def _remove_uniform(option: Option, placement: Placement) -> None:
    start = 0
    for kind in option.kinds:
        for rank in range(start, start + kind.count):
            placement.cost[rank] -= kind.cost.total
            placement.memory[rank] -= kind.cost.memory
        start += kind.count


def _place_on_hosts(
    proposal: Sequence[Option],
    positions: list[int],
    placement: Placement,
    topology: Topology,
    available: int,
) -> None:
    local = topology.intra_group_size
    host_cost = [
        sum(placement.cost[h * local : (h + 1) * local]) for h in range(topology.num_hosts)
    ]
    heap = [(c, h) for h, c in enumerate(host_cost)]
    heapq.heapify(heap)
    for position in positions:
        option = proposal[position]
        shards = option.shards()
        if option.partition == Partition.GRID:  # one column block of `local` row shards per host
            blocks = [shards[i : i + local] for i in range(0, len(shards), local)]
        else:
            blocks = [shards]
        ranks: list[int] = []
        used: set[int] = set()
        for block in blocks:
            chosen = _pick_host(block, heap, host_cost, used, placement, local, available)
            if chosen is None:
                _undo(option, ranks, placement)
                placement.failed.append((position, available - min(placement.memory)))
                break
            host, block_ranks = chosen
            used.add(host)
            for rank, shard in zip(block_ranks, block):
                placement.cost[rank] += shard.cost.total
                placement.memory[rank] += shard.cost.memory
                host_cost[host] += shard.cost.total
            heapq.heappush(heap, (host_cost[host], host))
            ranks.extend(block_ranks)
        else:
            placement.ranks[position] = ranks


def _pick_host(block, heap, host_cost, used, placement, local, available):
    """The least-loaded host with memory for ``block`` (and its ranks), or None."""
    stash, found = [], None
    while heap:
        entry = heapq.heappop(heap)
        cost, host = entry
        if cost != host_cost[host]:
            continue  # stale entry: the host was loaded since
        stash.append(entry)
        if host in used:
            continue
        ranks = _ranks_in_host(block, host, placement, local, available)
        if ranks is not None:
            stash.pop()  # the caller pushes the host back with its new cost
            found = (host, ranks)
            break
    for entry in stash:
        heapq.heappush(heap, entry)
    return found


def _ranks_in_host(block, host, placement, local, available):
    first = host * local
    if len(block) == local:  # row shards: local rank i gets shard i
        ranks = list(range(first, first + local))
        fits = all(placement.memory[r] + s.cost.memory <= available for r, s in zip(ranks, block))
        return ranks if fits else None
    order = sorted(
        range(first, first + local), key=lambda r: (placement.cost[r], placement.memory[r], r)
    )
    ranks = []
    for shard in block:  # column shards: the least-loaded ranks with room, distinct
        rank = next(
            (
                r
                for r in order
                if r not in ranks and placement.memory[r] + shard.cost.memory <= available
            ),
            None,
        )
        if rank is None:
            return None
        ranks.append(rank)
    return ranks


def _undo(option: Option, ranks: list[int], placement: Placement) -> None:
    for rank, shard in zip(ranks, option.shards()):
        placement.cost[rank] -= shard.cost.total
        placement.memory[rank] -= shard.cost.memory


def _place_on_devices(
    proposal: Sequence[Option], positions: list[int], placement: Placement, available: int
) -> None:
    cost, memory = placement.cost, placement.memory
    heap = [(cost[r], memory[r], r) for r in range(len(cost))]
    heapq.heapify(heap)
    for position in positions:
        option = proposal[position]
        chosen: list[int] = []
        stash = []
        for shard in option.shards():
            need = shard.cost.memory
            while heap:
                entry = heapq.heappop(heap)
                if memory[entry[2]] + need <= available:
                    chosen.append(entry[2])
                    break
                stash.append(entry)
            else:
                break
        if len(chosen) < option.num_shards:
            placement.failed.append((position, available - min(memory)))
            for rank in chosen:
                heapq.heappush(heap, (cost[rank], memory[rank], rank))
        else:
            for rank, shard in zip(chosen, option.shards()):
                cost[rank] += shard.cost.total
                memory[rank] += shard.cost.memory
                heapq.heappush(heap, (cost[rank], memory[rank], rank))
            placement.ranks[position] = chosen
        for entry in stash:
            heapq.heappush(heap, entry)


def shard_layout(option: Option) -> list[tuple[list[int], list[int]]]:
    """(offsets, sizes) of each shard, in shard order: column blocks, each cut into row shards."""
    rows, cols = expand(option.row_groups), expand(option.col_groups)
    row_offsets, col_offsets = offsets_of(rows), offsets_of(cols)
    return [
        ([row_offset, col_offset], [num_rows, num_cols])
        for col_offset, num_cols in zip(col_offsets, cols)
        for row_offset, num_rows in zip(row_offsets, rows)
    ]


def build_plan(
    tables: Sequence[TableSpec],
    proposal: Sequence[Option],
    where: Placement,
    topology: Topology,
) -> ShardingPlan:
    """The plan of a placed proposal, modules and tables in their original order."""
    places = [
        placement(topology.compute_device, rank, topology.intra_group_size)
        for rank in range(topology.world_size)
    ]
    modules: dict[str, EmbeddingModuleShardingPlan] = {}
    for table, option, ranks in zip(tables, proposal, where.ranks):
        module = modules.setdefault(table.path, EmbeddingModuleShardingPlan())
        module[table.name] = _parameter_sharding(option, ranks, places)
    return ShardingPlan(modules)


def _parameter_sharding(
    option: Option, ranks: list[int] | None, places: list[ShardPlacement]
) -> ParameterSharding:
    world = list(range(len(places)))
    if option.sharding_type == ShardingType.DATA_PARALLEL:
        return ParameterSharding(option.sharding_type, option.kernel, world, None)
    ranks = world if ranks is None else ranks
    shards = [
        ShardMetadata(offsets, sizes, places[rank])
        for (offsets, sizes), rank in zip(shard_layout(option), ranks, strict=True)
    ]
    return ParameterSharding(
        option.sharding_type, option.kernel, list(ranks), EnumerableShardingSpec(shards)
    )
