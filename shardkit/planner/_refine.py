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
when the busiest rank has no improving move or after a fixed number of tries.

A second phase does the same for memory: it relieves the rank with the most memory, accepting
a move only if the maximum rank cost does not grow. Deterministic, like everything else: ties
go to the lower rank, host and table index.
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
_COST, _MEMORY = 0, 1  # what a phase balances: index into a rank's (cost, memory)


class _State:
    """Per-rank loads, the ranks of each table's shards, and what each rank holds of which table."""

    def __init__(self, proposal: list[Option], placement: Placement, world: int) -> None:
        self.proposal = proposal
        self.ranks = [list(r) if r is not None else None for r in placement.ranks]
        self.cost = list(placement.cost)
        self.memory = list(placement.memory)
        self.held: list[dict[int, list[float]]] = [{} for _ in range(world)]
        for table, (option, ranks) in enumerate(zip(proposal, self.ranks)):
            if ranks is not None:
                self._hold(table, option, ranks, 1)

    def _hold(self, table: int, option: Option, ranks: list[int], sign: int) -> None:
        for rank, shard in zip(ranks, option.shards()):
            if sign > 0:
                load = self.held[rank].setdefault(table, [0.0, 0.0])
                load[_COST] += shard.cost.total
                load[_MEMORY] += shard.cost.memory
            else:  # a table leaves all its ranks at once
                self.held[rank].pop(table, None)

    def apply(self, table: int, option: Option, ranks: list[int] | None, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) ``table``'s shards as ``option`` on ``ranks``."""
        shards = option.shards()
        for rank, shard in zip(ranks if ranks is not None else range(len(shards)), shards):
            self.cost[rank] += sign * shard.cost.total
            self.memory[rank] += sign * shard.cost.memory
        if ranks is not None:
            self._hold(table, option, ranks, sign)

    def key(self, phase: int, cost_cap: float) -> tuple | None:
        """What the phase minimises; None if a memory move made the busiest rank slower."""
        top_cost = max(self.cost)
        if phase == _COST:
            return (top_cost, _at(self.cost, top_cost), sum(self.cost))
        if top_cost > cost_cap:
            return None
        top_memory = max(self.memory)
        return (top_memory, _at(self.memory, top_memory), top_cost)


def _at(values: Sequence[float], top: float) -> int:
    return sum(1 for v in values if v >= top * (1 - _TIE))


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
    for phase in (_COST, _MEMORY):
        _search(phase, options, choice, state, topology, available, budget)
    return choice, Placement(state.ranks, state.cost, state.memory, [])


def _search(phase, options, choice, state: _State, topology, available, budget) -> None:
    cost_cap = max(state.cost) * (1 + _TIE)
    best = state.key(phase, cost_cap)
    loads = state.memory if phase == _MEMORY else state.cost
    tries = 0
    while tries < budget:
        busiest = max(range(topology.world_size), key=lambda r: (loads[r], -r))
        held = sorted(state.held[busiest].items(), key=lambda item: (-item[1][phase], item[0]))
        moved = False
        for table, load in held[:_CANDIDATE_TABLES]:
            for index in _alternatives(options[table], choice[table], load[phase], phase):
                tries += 1
                key = _try(
                    state, table, options[table][index], topology, available, phase, best, cost_cap
                )
                if key is not None:
                    choice[table], best, moved = index, key, True
                    break
                if tries >= budget:
                    break
            if moved or tries >= budget:
                break
        if not moved:
            break


def _alternatives(
    table_options: Sequence[Option], current: int, load: float, phase: int
) -> list[int]:
    """The current option (a move), then options with smaller shards, cheapest total first."""

    def smaller(option: Option) -> bool:
        return (option.max_memory if phase == _MEMORY else option.max_cost) < load

    return [current] + [i for i, o in enumerate(table_options) if i != current and smaller(o)]


def _try(state: _State, table: int, option: Option, topology, available, phase, best, cost_cap):
    """Re-place ``table`` as ``option``; keep it and return the new key if it improves."""
    old_option, old_ranks = state.proposal[table], state.ranks[table]
    state.apply(table, old_option, old_ranks, -1)
    ranks = _place(option, state, topology, available, phase)
    if ranks is not False:
        state.apply(table, option, ranks, 1)
        key = state.key(phase, cost_cap)
        if key is not None and key < best:
            state.proposal[table], state.ranks[table] = option, ranks
            return key
        state.apply(table, option, ranks, -1)
    state.apply(table, old_option, old_ranks, 1)
    return None


def _place(option: Option, state: _State, topology: Topology, available: int, phase: int):
    """Ranks for ``option``'s shards given the other tables (None: uniform), or False."""
    if option.partition == Partition.UNIFORM:
        fits = all(m + s.cost.memory <= available for m, s in zip(state.memory, option.shards()))
        return None if fits else False
    order = _order(state, phase)
    if option.partition == Partition.DEVICE:
        return _on_devices(option.shards(), range(topology.world_size), state, available, order)
    local = topology.local_world_size
    shards = option.shards()
    blocks = [shards]
    if option.partition == Partition.GRID:
        blocks = [shards[i : i + local] for i in range(0, len(shards), local)]
    ranks: list[int] = []
    used: set[int] = set()
    for block in blocks:
        found = _on_a_host(block, state, topology, available, used, order)
        if found is None:
            return False
        used.add(found[0])
        ranks.extend(found[1])
    return ranks


def _order(state: _State, phase: int):
    if phase == _MEMORY:
        return lambda r: (state.memory[r], state.cost[r], r)
    return lambda r: (state.cost[r], state.memory[r], r)


def _on_devices(shards: list[Kind], candidates, state: _State, available: int, order):
    need = max(s.cost.memory for s in shards)
    fitting = (r for r in candidates if state.memory[r] + need <= available)
    ranks = heapq.nsmallest(len(shards), fitting, key=order)
    return ranks if len(ranks) == len(shards) else False


def _on_a_host(block: list[Kind], state: _State, topology: Topology, available: int, used, order):
    local = topology.local_world_size
    hosts = [h for h in range(topology.num_hosts) if h not in used]
    hosts.sort(key=lambda h: (sum(order(r)[0] for r in range(h * local, (h + 1) * local)), h))
    for host in hosts:
        first = host * local
        if len(block) == local:  # row shards: local rank i gets shard i
            ranks = list(range(first, first + local))
            if all(state.memory[r] + s.cost.memory <= available for r, s in zip(ranks, block)):
                return host, ranks
            continue
        ranks = _on_devices(block, range(first, first + local), state, available, order)
        if ranks is not False:
            return host, ranks
    return None
