"""Local search on a placed proposal: relieve the busiest rank, one table at a time.

[Note: local search]
Greedy partitioning places whole proposals; equal tables then leave some ranks one table
heavier than others (26 equal tables on 8 ranks: two ranks carry 4, the rest 3), and no
threshold separates equal tables. So, starting from the best proposal, repeat: take the busiest
rank; for the tables it holds (largest load there first), try moving the table elsewhere, or
re-sharding it with one of its options whose largest shard costs less than its load on the
busiest rank (e.g. table-wise -> two column-wise halves); the new shards go to the least-loaded
ranks (or host) with memory for them, the other tables stay put. Keep the first move that
improves (max rank cost, number of ranks at that max, total cost), lexicographically; stop
when the busiest rank has no improving move or after a fixed number of tries. Deterministic,
like everything else: ties go to the lower rank, host and table index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from shardkit.planner._enumerate import Kind, Option, Partition
from shardkit.planner._partition import Placement
from shardkit.planner._topology import Topology

__all__ = ["refine"]

_CANDIDATE_TABLES = 4  # tables of the busiest rank tried per round
_TIE = 1e-12  # relative tolerance for "at the max"


class _State:
    """Per-rank loads, the ranks of each table's shards, and which tables each rank holds."""

    def __init__(self, proposal: list[Option], placement: Placement, world: int) -> None:
        self.proposal = proposal
        self.ranks = [list(r) if r is not None else None for r in placement.ranks]
        self.cost = list(placement.cost)
        self.memory = list(placement.memory)
        self.held: list[dict[int, float]] = [{} for _ in range(world)]
        for table, (option, ranks) in enumerate(zip(proposal, self.ranks)):
            if ranks is not None:
                self._hold(table, option, ranks, 1)

    def _hold(self, table: int, option: Option, ranks: list[int], sign: int) -> None:
        for rank, shard in zip(ranks, option.shards()):
            if sign > 0:
                self.held[rank][table] = self.held[rank].get(table, 0.0) + shard.cost.total
            else:  # a table leaves all its ranks at once
                self.held[rank].pop(table, None)

    def apply(self, table: int, option: Option, ranks: list[int] | None, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) ``table``'s shards as ``option`` on ``ranks``."""
        shards = option.shards() if ranks is not None else _uniform(option)
        for rank, shard in zip(ranks if ranks is not None else range(len(shards)), shards):
            self.cost[rank] += sign * shard.cost.total
            self.memory[rank] += sign * shard.cost.memory
        if ranks is not None:
            self._hold(table, option, ranks, sign)

    def key(self) -> tuple[float, int, float]:
        top = max(self.cost)
        return (top, sum(1 for c in self.cost if c >= top * (1 - _TIE)), sum(self.cost))


def refine(
    options: Sequence[Sequence[Option]],
    choice: list[int],
    placement: Placement,
    topology: Topology,
    available: int,
    budget: int,
) -> tuple[list[int], Placement]:
    """Improve a fitting placement by local moves. See [Note: local search]."""
    choice = list(choice)
    state = _State([options[t][i] for t, i in enumerate(choice)], placement, topology.world_size)
    best = state.key()
    tries = 0
    while tries < budget:
        busiest = max(range(topology.world_size), key=lambda r: (state.cost[r], -r))
        moved = False
        loads = sorted(state.held[busiest].items(), key=lambda item: (-item[1], item[0]))
        for table, load in loads[:_CANDIDATE_TABLES]:
            for index in _alternatives(options[table], choice[table], load):
                tries += 1
                if _try(state, table, options[table][index], topology, available, best):
                    choice[table] = index
                    best = state.key()
                    moved = True
                    break
                if tries >= budget:
                    break
            if moved or tries >= budget:
                break
        if not moved:
            break
    refined = Placement(state.ranks, state.cost, state.memory, [])
    return choice, refined


def _alternatives(table_options: Sequence[Option], current: int, load: float) -> list[int]:
    """The current option (a move), then cheaper-per-shard options, cheapest total first."""
    return [current] + [
        i for i, o in enumerate(table_options) if i != current and o.max_cost < load
    ]


def _try(
    state: _State, table: int, option: Option, topology: Topology, available: int, best
) -> bool:
    """Re-place ``table`` as ``option``; keep it if the key improves, else undo."""
    old_option, old_ranks = state.proposal[table], state.ranks[table]
    state.apply(table, old_option, old_ranks, -1)
    ranks = _place(option, state, topology, available)
    if ranks is not False:
        state.apply(table, option, ranks, 1)
        if state.key() < best:
            state.proposal[table], state.ranks[table] = option, ranks
            return True
        state.apply(table, option, ranks, -1)
    state.apply(table, old_option, old_ranks, 1)
    return False


def _place(option: Option, state: _State, topology: Topology, available: int):
    """Ranks for ``option``'s shards given the other tables (None: uniform), or False."""
    if option.partition == Partition.UNIFORM:
        shards = _uniform(option)
        fits = all(m + s.cost.memory <= available for m, s in zip(state.memory, shards))
        return None if fits else False
    if option.partition == Partition.DEVICE:
        return _on_devices(option.shards(), range(topology.world_size), state, available)
    local = topology.local_world_size
    shards = option.shards()
    blocks = [shards[i : i + local] for i in range(0, len(shards), local)]
    if option.partition == Partition.HOST:
        blocks = [shards]
    ranks: list[int] = []
    used: set[int] = set()
    for block in blocks:
        found = _on_a_host(block, state, topology, available, used)
        if found is None:
            return False
        used.add(found[0])
        ranks.extend(found[1])
    return ranks


def _on_devices(shards: list[Kind], candidates, state: _State, available: int):
    need = max(s.cost.memory for s in shards)
    ranks = heapq.nsmallest(
        len(shards),
        (r for r in candidates if state.memory[r] + need <= available),
        key=lambda r: (state.cost[r], state.memory[r], r),
    )
    return ranks if len(ranks) == len(shards) else False


def _on_a_host(block: list[Kind], state: _State, topology: Topology, available: int, used: set):
    local = topology.local_world_size
    order = sorted(
        (h for h in range(topology.num_hosts) if h not in used),
        key=lambda h: (sum(state.cost[h * local : (h + 1) * local]), h),
    )
    for host in order:
        first = host * local
        if len(block) == local:  # row shards: local rank i gets shard i
            ranks = list(range(first, first + local))
            if all(state.memory[r] + s.cost.memory <= available for r, s in zip(ranks, block)):
                return host, ranks
            continue
        ranks = _on_devices(block, range(first, first + local), state, available)
        if ranks is not False:
            return host, ranks
    return None


def _uniform(option: Option) -> list[Kind]:
    return option.shards()
