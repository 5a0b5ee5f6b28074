"""TorchRec's proposers (``torchrec.distributed.planner.proposers``) over `ShardingOption`s:
each proposes one option per table, in turn, learning from whether the last proposal could be
placed (`feedback`)."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from shardkit.distributed.planner._components import _by_table
from shardkit.distributed.planner._tr_interfaces import Proposer
from shardkit.distributed.planner._tr_types import ShardingOption

__all__ = [
    "MAX_PROPOSALS",
    "DynamicProgrammingProposer",
    "GreedyProposer",
    "GridSearchProposer",
    "UniformProposer",
    "proposers_to_proposals_list",
]

logger = logging.getLogger(__name__)

MAX_PROPOSALS = 10000  # GridSearchProposer's default limit


def _sorted_tables(search_space: Sequence[ShardingOption]) -> list[list[ShardingOption]]:
    return [sorted(opts, key=lambda o: o.total_perf) for opts in _by_table(search_space).values()]


def _bytes(option: ShardingOption) -> int:
    storage = option.total_storage
    return storage.hbm + storage.ddr


class GreedyProposer(Proposer):
    """Starts from each table's fastest option; while a proposal does not fit, moves the table
    whose option takes the most memory to its next-fastest option."""

    _shardkit_component: ClassVar[str] = "proposer"  # its part: planner/_resolve

    def __init__(self, use_depth: bool = True, threshold: int | None = None) -> None:
        self._tables: list[list[ShardingOption]] = []
        self._index: list[int] = []
        self._done = True

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        self._tables = _sorted_tables(search_space)
        self._index = [0] * len(self._tables)
        self._done = not self._tables

    def propose(self) -> list[ShardingOption] | None:
        if self._done:
            return None
        return [table[i] for table, i in zip(self._tables, self._index)]

    def feedback(self, partitionable: bool, plan: Any = None, perf_rating: Any = None,
                 storage_constraint: Any = None) -> None:  # fmt: skip
        if partitionable:
            self._done = True
            return
        movable = [t for t, table in enumerate(self._tables) if self._index[t] + 1 < len(table)]
        if not movable:
            self._done = True
            return
        biggest = max(movable, key=lambda t: _bytes(self._tables[t][self._index[t]]))
        self._index[biggest] += 1


class UniformProposer(Proposer):
    """One proposal per sharding type that every table has: each table's fastest option of it."""

    _shardkit_component: ClassVar[str] = "proposer"  # its part: planner/_resolve

    def __init__(self, use_depth: bool = True) -> None:
        self._proposals: list[list[ShardingOption]] = []

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        tables = _sorted_tables(search_space)
        kinds = sorted({o.sharding_type for table in tables for o in table})
        self._proposals = []
        for kind in kinds:
            choice = [next((o for o in table if o.sharding_type == kind), None) for table in tables]
            if tables and all(o is not None for o in choice):
                self._proposals.append(choice)  # type: ignore[arg-type]

    def propose(self) -> list[ShardingOption] | None:
        return self._proposals[0] if self._proposals else None

    def feedback(self, partitionable: bool, plan: Any = None, perf_rating: Any = None,
                 storage_constraint: Any = None) -> None:  # fmt: skip
        if self._proposals:
            self._proposals.pop(0)


class GridSearchProposer(Proposer):
    """Every combination of options, fastest first; none when there are more than
    ``max_proposals`` (as in TorchRec)."""

    _shardkit_component: ClassVar[str] = "proposer"  # its part: planner/_resolve

    def __init__(self, max_proposals: int = MAX_PROPOSALS) -> None:
        self._max = max_proposals
        self._proposals: Any = iter(())

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        tables = _sorted_tables(search_space)
        total = math.prod(len(t) for t in tables) if tables else 0
        if total > self._max:
            logger.warning("%d combinations exceed max_proposals=%d: no proposal", total, self._max)
            tables = []
        combos = list(itertools.product(*tables)) if tables else []
        combos.sort(key=lambda c: sum(o.total_perf for o in c))
        self._proposals = iter([list(c) for c in combos])
        self._next = next(self._proposals, None)

    def propose(self) -> list[ShardingOption] | None:
        return self._next

    def feedback(self, partitionable: bool, plan: Any = None, perf_rating: Any = None,
                 storage_constraint: Any = None) -> None:  # fmt: skip
        self._next = next(self._proposals, None)


class DynamicProgrammingProposer(Proposer):
    """The fastest proposal whose total memory fits a budget (dynamic programming over memory
    in ``hbm_bins_per_device`` steps), for budgets shrinking by a fifth after each proposal
    that could not be placed."""

    _shardkit_component: ClassVar[str] = "proposer"  # its part: planner/_resolve

    def __init__(self, hbm_bins_per_device: int = 100) -> None:
        self._bins = hbm_bins_per_device
        self._tables: list[list[ShardingOption]] = []
        self._budget = 0

    def load(self, search_space: list[ShardingOption], enumerator: Any = None) -> None:
        self._tables = _sorted_tables(search_space)
        most = sum(max(_bytes(o) for o in table) for table in self._tables)
        self._unit = max(1, math.ceil(most / self._bins))
        self._budget = self._bins if self._tables else -1

    def _best_within(self, budget: int) -> list[ShardingOption] | None:
        # best[b] = (perf, choices) with bins used <= b
        best: dict[int, tuple[float, list[ShardingOption]]] = {0: (0.0, [])}
        for table in self._tables:
            step: dict[int, tuple[float, list[ShardingOption]]] = {}
            for used, (perf, picks) in best.items():
                for option in table:
                    total = used + math.ceil(_bytes(option) / self._unit)
                    candidate = (perf + option.total_perf, [*picks, option])
                    if total <= budget and (total not in step or candidate[0] < step[total][0]):
                        step[total] = candidate
            best = step
        return min(best.values(), key=lambda v: v[0])[1] if best else None

    def propose(self) -> list[ShardingOption] | None:
        return None if self._budget < 0 else self._best_within(self._budget)

    def feedback(self, partitionable: bool, plan: Any = None, perf_rating: Any = None,
                 storage_constraint: Any = None) -> None:  # fmt: skip
        self._budget = -1 if partitionable or self._budget == 0 else self._budget * 4 // 5


def proposers_to_proposals_list(
    proposers_list: list[Proposer], search_space: list[ShardingOption]
) -> list[list[ShardingOption]]:
    """Every proposal the proposers make without feedback on placing (each told its proposal
    could not be placed, so it goes on), without repeats."""
    proposals: list[list[ShardingOption]] = []
    seen: set[tuple[int, ...]] = set()
    for proposer in proposers_list:
        proposer.load(search_space)
        proposal = proposer.propose()
        while proposal is not None:
            key = tuple(sorted(id(o) for o in proposal))
            if key not in seen:
                seen.add(key)
                proposals.append(proposal)
            proposer.feedback(partitionable=False)
            proposal = proposer.propose()
    return proposals
