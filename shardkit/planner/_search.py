"""Choosing one option per table: proposals swept over a cost threshold, each partitioned, the
best kept, then improved where the busiest rank is.

[Note: threshold proposals]
The step takes as long as the busiest rank, so a table whose cheapest option is one big shard
(table-wise) can be worth splitting even though splitting adds communication. For a threshold
``T`` (ms), each table takes its cheapest option (least total cost over its shards) among those
whose largest shard costs at most ``T``; with no such option, the one with the smallest largest
shard. ``T = inf`` is "every table at its cheapest"; ``T`` near ``sum(cheapest) / world_size``
(no rank can do less) splits every table that would stand out. The sweep tries thresholds
between the two, geometrically spaced, and partitions each distinct proposal. If none fits in
memory, it tries again allowing only options whose largest shard takes at most half, a quarter,
... of a rank's memory, which spreads big tables over more ranks.

The best proposal (lowest maximum rank cost, then lowest total cost, then lowest maximum rank
memory) is then improved by local moves (see [Note: local search]). Everything is
deterministic: see [Note: the planner is a pure function].

[Note: choosing by predicted step]
With a profiled topology, proposals are ranked by their predicted step time (`predict_step`:
the slowest rank in each phase, the collectives' latencies and the kernels' per-call costs
included) instead of the busiest rank's summed cost, and the local search's result is kept only
if its predicted step is no slower than the proposal it started from. The shards' own costs
(see [Note: calibrated shard costs]) leave out what is paid once per collective or kernel call,
so the threshold sweep alone would never propose a layout whose gain is fewer collectives (all
tables data-parallel on a high-latency network, say): the proposals also include, for each
sharding type, every table at its cheapest option of that type (TorchRec's uniform proposer).
The shards' costs still drive the thresholds, the partition and the moves.

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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardkit.planner._enumerate import TYPE_ORDER, Kind, Option, Partition
from shardkit.planner._inputs import Topology
from shardkit.planner._partition import Placement, partition

__all__ = ["SearchResult", "search"]


_MAX_THRESHOLDS = 24  # proposals per memory level
_MAX_MEMORY_LEVELS = 12
_MAX_REFINE_TRIES = 1000  # moves tried by the local search
_CANDIDATE_TABLES = 4  # tables of the busiest rank tried per round
_TIE = 1e-12  # relative tolerance for "at the max"
_COST, _MEMORY = 0, 1  # what a phase balances: index into a rank's (cost, memory)


@dataclass
class SearchResult:
    """The chosen option per table (None when nothing fits), where they went, and effort."""

    proposal: list[Option]
    placement: Placement
    num_proposals: int

    @property
    def fits(self) -> bool:
        return not self.placement.failed


def search(
    options: Sequence[Sequence[Option]],
    topology: Topology,
    available: int,
    *,
    scorer: Scorer | None = None,
) -> SearchResult:
    """Best proposal found for ``options`` (per table, cheapest first). See
    [Note: threshold proposals]. If nothing fits, the result holds the most spread proposal
    with its failures, for the error message. ``scorer`` (a profiled topology's predicted step
    time of a placed proposal) ranks proposals in place of the busiest rank's cost: see
    [Note: choosing by predicted step]."""
    seen: set[tuple[int, ...]] = set()
    best: tuple[tuple, list[int], Placement] | None = None
    for limit in _memory_levels(options, available):
        for threshold in _thresholds(options, topology.world_size):
            choice = [_choose(table, threshold, limit) for table in options]
            key = tuple(choice)
            if key in seen:
                continue
            seen.add(key)
            candidate = _evaluate(options, choice, topology, available, scorer)
            if best is None or candidate[0] < best[0]:
                best = candidate
        if best is not None and not best[2].failed:
            break
    if scorer is not None:
        for choice in _uniform_choices(options):
            if tuple(choice) not in seen:
                seen.add(tuple(choice))
                candidate = _evaluate(options, choice, topology, available, scorer)
                if best is None or candidate[0] < best[0]:
                    best = candidate
    assert best is not None
    score, choice, placement = best
    if not placement.failed:
        budget = min(_MAX_REFINE_TRIES, 64 + 2 * len(options))
        refined, moved = _refine(options, choice, placement, topology, available, budget)
        kept = scorer is not None and _score(options, refined, moved, scorer) > score[1]
        if not kept:
            choice, placement = refined, moved
    proposal = [options[t][i] for t, i in enumerate(choice)]
    return SearchResult(proposal, placement, len(seen))


Scorer = Callable[[list[Option], Placement], float]


def _uniform_choices(options: Sequence[Sequence[Option]]) -> list[list[int]]:
    """Per sharding type some table can use: every table at its cheapest option of that type
    (its cheapest of any where it has none). See [Note: choosing by predicted step]."""
    types = sorted(
        {o.sharding_type for table in options for o in table}, key=lambda t: TYPE_ORDER[t]
    )
    choices = []
    for sharding_type in types:
        choice = []
        for table in options:
            of_type = [i for i, o in enumerate(table) if o.sharding_type == sharding_type]
            choice.append(of_type[0] if of_type else 0)  # options are cheapest first
        choices.append(choice)
    return choices


def _score(options, choice, placement: Placement, scorer: Scorer) -> float:
    return scorer([options[t][i] for t, i in enumerate(choice)], placement)


def _evaluate(options, choice, topology, available, scorer) -> tuple[tuple, list[int], Placement]:
    proposal = [options[t][i] for t, i in enumerate(choice)]
    placement = partition(proposal, topology, available)
    primary = placement.max_cost
    if scorer is not None and not placement.failed:
        primary = scorer(proposal, placement)
    score = (len(placement.failed), primary, sum(placement.cost), placement.max_memory)
    return score, choice, placement


def _thresholds(options: Sequence[Sequence[Option]], world_size: int) -> list[float]:
    cheapest = [table[0] for table in options]
    high = max((o.max_cost for o in cheapest), default=0.0)
    low = sum(o.total_cost for o in cheapest) / world_size
    if not low > 0 or high <= low:
        return [math.inf]
    ratio = max(1.05, (high / low) ** (1 / (_MAX_THRESHOLDS - 2)))
    values, value = [math.inf], high
    while value >= low and len(values) < _MAX_THRESHOLDS:
        values.append(value)
        value /= ratio
    values.append(0.0)  # every table as spread as it can be
    return values


def _memory_levels(options: Sequence[Sequence[Option]], available: int) -> list[float]:
    smallest = max((min(o.max_memory for o in table) for table in options), default=0)
    levels: list[float] = [math.inf]
    limit = available / 2
    while limit >= smallest and len(levels) < _MAX_MEMORY_LEVELS:
        levels.append(limit)
        limit /= 2
    levels.append(0.0)  # every table at its smallest shards
    return levels


def _choose(table: Sequence[Option], threshold: float, limit: float) -> int:
    """Index of the option table takes under ``threshold`` ms and ``limit`` bytes per shard."""
    fallback, fallback_key = 0, None
    for index, option in enumerate(table):
        small = option.max_memory <= limit
        if small and option.max_cost <= threshold:
            return index
        key = (not small, option.max_memory if not small else 0, option.max_cost, index)
        if fallback_key is None or key < fallback_key:
            fallback, fallback_key = index, key
    return fallback


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


def _refine(
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
        _improve(phase, options, choice, state, topology, available, budget)
    return choice, Placement(state.ranks, state.cost, state.memory, [])


def _improve(phase, options, choice, state: _State, topology, available, budget) -> None:
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
    local = topology.intra_group_size
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
    local = topology.intra_group_size
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
