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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.planner._enumerate import Option
from shardkit.planner._partition import Placement, partition
from shardkit.planner._refine import refine
from shardkit.planner._topology import Topology

__all__ = ["SearchResult", "search"]

_MAX_THRESHOLDS = 24  # proposals per memory level
_MAX_MEMORY_LEVELS = 12
_MAX_REFINE_TRIES = 1000  # moves tried by the local search


@dataclass
class SearchResult:
    """The chosen option per table (None when nothing fits), where they went, and effort."""

    proposal: list[Option]
    placement: Placement
    num_proposals: int

    @property
    def fits(self) -> bool:
        return not self.placement.failed


def search(options: Sequence[Sequence[Option]], topology: Topology, available: int) -> SearchResult:
    """Best proposal found for ``options`` (per table, cheapest first). See
    [Note: threshold proposals]. If nothing fits, the result holds the most spread proposal
    with its failures, for the error message."""
    seen: set[tuple[int, ...]] = set()
    best: tuple[tuple, list[int], Placement] | None = None
    for limit in _memory_levels(options, available):
        for threshold in _thresholds(options, topology.world_size):
            choice = [_choose(table, threshold, limit) for table in options]
            key = tuple(choice)
            if key in seen:
                continue
            seen.add(key)
            candidate = _evaluate(options, choice, topology, available)
            if best is None or candidate[0] < best[0]:
                best = candidate
        if best is not None and not best[2].failed:
            break
    assert best is not None
    _, choice, placement = best
    if not placement.failed:
        budget = min(_MAX_REFINE_TRIES, 64 + 2 * len(options))
        choice, placement = refine(options, choice, placement, topology, available, budget)
    proposal = [options[t][i] for t, i in enumerate(choice)]
    return SearchResult(proposal, placement, len(seen))


def _evaluate(options, choice, topology, available) -> tuple[tuple, list[int], Placement]:
    proposal = [options[t][i] for t, i in enumerate(choice)]
    placement = partition(proposal, topology, available)
    score = (len(placement.failed), placement.max_cost, sum(placement.cost), placement.max_memory)
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
